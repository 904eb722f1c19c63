"""AttentionKMeans' initial centroids and number of runs, as KMeans chooses them (shared by the
in-memory and the Dask fits)."""

import numpy as np
from scipy import sparse
from sklearn.cluster import kmeans_plusplus
from sklearn.utils.validation import check_array

from ..utils._warnings import warn_user


def checked_init(init, n_clusters, n_features, dtype):
    """``init`` as given, or an explicit array of centres checked and copied in ``dtype``."""
    if isinstance(init, str) or callable(init):
        return init
    init = check_array(init, dtype=dtype, copy=True, order="C")
    _check_center_shape(init, n_clusters, n_features)
    return init


def resolve_n_init(n_init, init, T):
    """The number of runs: ``n_init``, or for ``"auto"`` KMeans' rule (10 for ``"random"`` or a
    callable at ``T == 0``, else 1); one, with KMeans' warning, for explicit centres."""
    if n_init == "auto":
        random_init = (isinstance(init, str) and init == "random") or callable(init)
        n_init = 10 if random_init and T == 0 else 1
    if not isinstance(init, str) and not callable(init) and n_init != 1:
        warn_user(
            "Explicit initial center position passed: performing only one init in "
            f"AttentionKMeans instead of n_init={n_init}.", RuntimeWarning,
        )
        n_init = 1
    return n_init


def initial_centers(init, n_clusters, X, rng, sample_weight, mean=None):
    """Initial centres in the centred coordinates of the fit, drawn from ``X``: the centred
    array, or, with its ``mean``, a sparse matrix as it is (KMeans centres dense data only; the
    centres drawn from it are centred here). An explicit array ``init`` is returned as it is."""
    if isinstance(init, str) and init == "k-means++":
        centers, _ = kmeans_plusplus(X, n_clusters, sample_weight=sample_weight, random_state=rng)
    elif isinstance(init, str) and init == "random":
        seeds = rng.choice(X.shape[0], size=n_clusters, replace=False,
                           p=sample_weight / sample_weight.sum())
        centers = X[seeds]
    elif callable(init):
        centers = init(X, n_clusters, random_state=rng)
        centers = check_array(centers, dtype=X.dtype, copy=False, order="C")
        _check_center_shape(centers, n_clusters, X.shape[1])
    else:
        return init
    if mean is not None:
        centers = (centers.toarray() if sparse.issparse(centers) else np.asarray(centers)) - mean
    return centers


def _check_center_shape(centers, n_clusters, n_features):
    if centers.shape != (n_clusters, n_features):
        raise ValueError(
            f"The shape of the initial centers {centers.shape} does not match the number of "
            f"clusters {n_clusters} and features {n_features}."
        )
