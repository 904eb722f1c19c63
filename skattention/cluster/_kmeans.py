"""AttentionKMeans: k-means as alternating cross-attention, with deterministic annealing."""

from numbers import Integral, Real

import numpy as np
import torch
from scipy import sparse
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
)
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine import (
    anneal,
    attention,
    check_temperature,
    kmeans_inertia,
    kmeans_step,
    lloyd,
    resolve_device,
    soft_kmeans,
    sqdist_to_centers,
)
from ..utils._dask import is_dask_collection, lazy_predict
from ..utils._device import DevicePortableMixin, _cuda_nondeterministic
from ..utils._estimator import EstimatorMixin
from ..utils._param_validation import Count, Interval, StrOptions
from ..utils._sklearn_compat import _check_sample_weight, _fit_context
from ..utils._validation import overflow_advice
from ._dask import fit as fit_dask_collection
from ._init import checked_init, initial_centers, resolve_n_init
from ._inputs import (
    as_tensor,
    check_distance_range,
    check_soft_temperature,
    checked_sample_weight,
    column_moments,
    column_ranges,
    dense_blocks,
    soft_assignment_advice,
)
from ._runs import Run, best_run, warn_if_fewer_clusters


class AttentionKMeans(
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    ClusterMixin,
    EstimatorMixin,
    DevicePortableMixin,
    BaseEstimator,
):
    """K-means as alternating attention: points attend to centroids, centroids attend to points.

    The E-step is the attention of each point over the centroids,
    ``r_ij = p_j exp(-||x_i - c_j||^2 / T) / sum_l p_l exp(-||x_i - c_l||^2 / T)`` (soft
    assignments at temperature ``T``), and the M-step the attention of each centroid over the
    points with the points as values, ``c_j = sum_i w_i r_ij x_i / sum_i w_i r_ij`` (weighted
    means). ``temperature=0`` is exactly Lloyd's k-means (hard arg-min assignments);
    ``temperature="auto"`` anneals from the first critical temperature down to 0 (deterministic
    annealing, Rose 1998) and ends with exact Lloyd steps, so the result is a Lloyd fixed point
    that depends little on the initialisation.

    Sparse input (text, one-hot data) is taken as CSR and read in dense row blocks sized by
    ``working_memory`` (``skattention.config_context``), never densified whole. The model is
    the one fitted on the same matrix held dense: bit for bit while the budget lets the blocks
    be as large as the dense array's (see the user guide), else up to rounding.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters (centroids).
    temperature : float >= 0 or "auto", default="auto"
        Softmax temperature in units of squared distance.

        - ``0``: Lloyd's algorithm, exactly as :class:`sklearn.cluster.KMeans` with
          ``algorithm="lloyd"`` (same tolerance rule, empty-cluster relocation and, for the same
          ``random_state``, the same k-means++ centres). A point exactly as near to several
          centres goes to whichever each implementation's rounding makes nearer, so on tied
          (e.g. integer) data the two runs can part there.
        - ``> 0``: soft k-means at that fixed temperature, iterated to a fixed point (equal
          centroid priors); ``cluster_centers_`` are the soft centres, ``labels_`` the nearest one.
        - ``"auto"``: deterministic annealing (mass-constrained, Rose 1998). It starts with one
          centroid at the weighted mean and ``T`` at its critical temperature
          ``T_c = 2 lambda_max`` (``lambda_max`` the largest eigenvalue of the weighted
          covariance, by power iteration; above ``T_c`` every centroid sits at the mean). At each
          level: up to 10 EM steps (responsibilities with the centroids' masses as log-prior,
          then weighted means) until no centroid moves more than ``1e-3 T`` (squared);
          centroids closer than ``sqrt(1e-2 T)`` are merged (masses added); while there are
          fewer than ``n_clusters``, every centroid whose own critical temperature
          ``2 lambda_max`` (of its soft cluster) lies above the next temperature splits in two
          along its principal axis (children at ``c +- 0.05 sqrt(lambda_max) v``, half the mass
          each), most unstable first. ``T`` is then multiplied by 0.8. Annealing stops once
          there are ``n_clusters`` centroids and the assignments are nearly hard (weighted mean
          of ``max_j r_ij`` >= 0.99), or at ``1e-4 T_c``; it runs in float32 on a subsample of at
          most 20,000 points, and exact Lloyd iterations on all points follow. No noise is
          added; ``init`` serves only the cases listed under ``init``.

        The temperature used by :meth:`predict_proba` is ``temperature_``.
    metric : {"euclidean"}, default="euclidean"
        Distance between points and centroids (squared in the attention scores). Only the
        Euclidean distance keeps the weighted mean the exact M-step.
    init : {"k-means++", "random"}, callable or array-like of shape (n_clusters, n_features), \
            default="k-means++"
        Initial centroids, as in :class:`~sklearn.cluster.KMeans`
        (``sklearn.cluster.kmeans_plusplus`` for ``"k-means++"``; a callable is called as
        ``init(X, n_clusters, random_state=rng)`` with dense data centred and sparse data as it
        is, as KMeans calls it). With annealing, used only
        where annealing cannot give ``n_clusters`` distinct centroids: ``n_clusters=1``, a
        subsample without weight or spread, or fewer distinct points than clusters (the
        missing centroids are then taken from it).
    n_init : "auto" or int, default="auto"
        Number of runs from different initialisations; the one with the lowest inertia is kept.
        ``"auto"``: 1, except 10 for ``init="random"`` or a callable at ``temperature=0``
        (as :class:`~sklearn.cluster.KMeans`). Annealing makes a single run enough.
    max_iter : int, default=300
        Maximum number of Lloyd (or fixed-temperature soft) iterations of one run.
    tol : float, default=1e-4
        Relative tolerance: iterations stop when the squared centre shift summed over centroids
        falls below ``tol`` times the mean per-feature variance of ``X`` (KMeans' rule), or
        when the hard labels stop changing.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the attention steps run; fitted attributes are NumPy arrays.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation, and with annealing the subsample and the starting direction
        of the power iteration.
    verbose : int, default=0
        ``0``: silent. ``1``: progress bars on standard error over the ``n_init`` runs (with the
        best inertia) and, when they last more than a couple of seconds, over the annealing
        levels and the iterations of a run (tqdm when installed, else plain lines;
        ``pip install skattention[progress]``). ``2``: the bar over the runs and one line per
        run, per annealing level and per Lloyd run instead of the inner bars.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Centroids.
    labels_ : ndarray of shape (n_samples,)
        Index of the nearest centroid of each training point.
    inertia_ : float
        k-means inertia of that hard assignment: weighted sum of squared distances of the
        training points to their nearest centroid (comparable to ``KMeans.inertia_``).
    n_iter_ : int
        Iterations of the kept run (annealing EM steps plus Lloyd steps).
    stopped_by_callback_ : bool
        Whether one of scikit-learn's callbacks (``set_callbacks``, scikit-learn >= 1.9) stopped
        the fit early, by returning ``True`` at the end of an iteration or of a run: that run's
        iterations ended there and no further run was made. The model is then the best of the
        runs made (the last one as far as it went), fitted and usable as any other.
    temperature_ : float
        Temperature of :meth:`predict_proba`: ``temperature`` when a number; with ``"auto"``,
        ``2 inertia_ / (sum(sample_weight) n_features)``, i.e. the responsibilities of the
        isotropic Gaussian mixture with the variance of the final clusters.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during fit, when ``X`` has string column names.

    See Also
    --------
    sklearn.cluster.KMeans : Lloyd's and Elkan's k-means.
    AttentionMeanShift : Mean shift as repeated attention of the modes over the data.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention.cluster import AttentionKMeans
    >>> X = np.array([[1, 2], [1, 4], [1, 0], [10, 2], [10, 4], [10, 0]])
    >>> km = AttentionKMeans(n_clusters=2, random_state=0).fit(X)
    >>> km.labels_[0] != km.labels_[3]
    np.True_
    >>> np.sort(km.cluster_centers_[:, 0])
    array([ 1., 10.])
    >>> km.predict([[0, 0], [12, 3]]).tolist() == [km.labels_[0], km.labels_[3]]
    True
    >>> float(km.inertia_)
    16.0
    """

    _parameter_constraints: dict = {
        "n_clusters": [Count(Integral, 1, None, closed="left")],
        "temperature": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "metric": [StrOptions({"euclidean"})],
        "init": [StrOptions({"k-means++", "random"}), callable, "array-like"],
        "n_init": [StrOptions({"auto"}), Count(Integral, 1, None, closed="left")],
        "max_iter": [Count(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "device": [str, torch.device],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(
        self,
        n_clusters=8,
        *,
        temperature="auto",
        metric="euclidean",
        init="k-means++",
        n_init="auto",
        max_iter=300,
        tol=1e-4,
        device="auto",
        random_state=None,
        verbose=0,
    ):
        self.n_clusters = n_clusters
        self.temperature = temperature
        self.metric = metric
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ fit

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Compute the clustering.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training points. A sparse matrix is converted to CSR and read in dense row blocks
            of the working-memory budget, never densified whole.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each point (a prior on the points in the M-step attention; integer weights
            equal repeated points in every step, but that the relocation of an empty cluster
            can pick a point of weight 0, as in ``KMeans``). ``None``: all ones.

        Returns
        -------
        self : AttentionKMeans
            Fitted estimator.
        """
        if is_dask_collection(X):  # per-partition sums merged here (docs/scaling.md)
            return fit_dask_collection(self, X, sample_weight)
        X = validate_data(
            self, X, accept_sparse="csr", dtype=[np.float64, np.float32], order="C", copy=False
        )
        check_distance_range(X)
        sample_weight, weight_exponent = checked_sample_weight(sample_weight, X)
        n_samples, n_features = X.shape
        if n_samples < self.n_clusters:
            raise ValueError(f"n_samples={n_samples} should be >= n_clusters={self.n_clusters}.")
        device = resolve_device(self.device)
        rng = check_random_state(self.random_state)
        annealing = isinstance(self.temperature, str)
        T = None if annealing else float(self.temperature)
        check_soft_temperature(T, column_ranges(X), X.dtype)

        init = checked_init(self.init, self.n_clusters, n_features, X.dtype)
        n_init = resolve_n_init(self.n_init, init, T)

        # Centre the data (like KMeans) for precise squared distances: a centred copy of a
        # dense X; a sparse X keeps its zeros and the engine subtracts the mean block by block.
        X_mean, variance = column_moments(X, variance=self.tol > 0)
        if isinstance(init, np.ndarray):
            init = init - X_mean
        tol = float(variance * self.tol) if self.tol > 0 else 0.0
        if sparse.issparse(X):
            Xt, shift = as_tensor(X, device), torch.from_numpy(X_mean).to(device)
            init_from = dict(X=X, mean=X_mean)
        else:
            Xc = X - X_mean
            Xt, shift, init_from = torch.from_numpy(Xc).to(device), None, dict(X=Xc, mean=None)
        wt = torch.from_numpy(np.ascontiguousarray(sample_weight)).to(device)

        def run_once(on_iteration):
            def draw_centers():
                centers0 = initial_centers(init, self.n_clusters, rng=rng,
                                           sample_weight=sample_weight, **init_from)
                return torch.from_numpy(np.ascontiguousarray(centers0, dtype=X.dtype)).to(device)

            n_anneal = 0
            if annealing:
                ct, n_anneal = anneal(Xt, wt, self.n_clusters, draw_centers, rng, self.verbose,
                                      shift=shift)
            else:
                ct = draw_centers()
            args = (self.max_iter, tol, self.verbose, on_iteration, shift)
            if not T:
                return Run(*lloyd(Xt, wt, ct, *args), n_anneal=n_anneal)
            return Run(*soft_kmeans(Xt, wt, ct, T, *args), n_anneal=n_anneal)

        best, stopped = best_run(
            self, n_init, run_once, kind="Lloyd" if not T else "soft",
            fitted_centers=lambda c: c.cpu().numpy().astype(X.dtype) + X_mean,
            weight_exponent=weight_exponent,
        )
        centers = best.centers.cpu().numpy().astype(X.dtype, copy=False) + X_mean
        labels = best.labels.cpu().numpy()
        if annealing:
            # Annealing forgets the initialisation up to the order of the centroids: number the
            # clusters by their centroids (lexicographic) so that equal solutions compare equal.
            order = np.lexsort(centers.T[::-1])
            centers = centers[order]
            labels = np.argsort(order)[labels]
        warn_if_fewer_clusters(len(np.unique(labels)), self.n_clusters)
        self.cluster_centers_ = np.ascontiguousarray(centers)
        self.labels_ = labels.astype(np.int32)  # KMeans' label dtype
        with np.errstate(over="ignore"):  # in units of the weights': 2**weight_exponent
            self.inertia_ = float(np.ldexp(float(best.inertia), weight_exponent))
        self.n_iter_ = int(best.n_anneal + best.n_iter)
        self.stopped_by_callback_ = stopped
        total = float(sample_weight.sum())  # in the units of best.inertia
        self.temperature_ = T if not annealing else (
            2.0 * float(best.inertia) / (total * n_features) if best.inertia > 0 else 0.0)
        return self

    def _fit_subtasks(self):
        """Subtasks of the fit for scikit-learn's callbacks: the runs (unknown for "auto"),
        each with its iterations as subtasks."""
        return None if self.n_init == "auto" else self.n_init

    # ------------------------------------------------------------------ predict

    def _check_test_data(self, X):
        check_is_fitted(self)
        X = validate_data(
            self, X, reset=False, accept_sparse="csr", dtype=[np.float64, np.float32], order="C"
        )
        return check_distance_range(X)

    def _tensors(self, X):
        """``X`` as it is (dense or CSR), the centroids centred on their mean, and that mean (the
        shift), on the device: the engine centres each block of ``X`` itself, so no centred copy
        of ``X`` is made (working_memory)."""
        device = resolve_device(self.device)
        dtype = self._compute_dtype(X)
        shift = self.cluster_centers_.mean(0)
        Xt = as_tensor(X, device, dtype)
        Ct = torch.from_numpy(np.ascontiguousarray(self.cluster_centers_ - shift)).to(device, dtype)
        return Xt, Ct, torch.from_numpy(np.ascontiguousarray(shift)).to(device, dtype)

    def _compute_dtype(self, X):
        """float64 when ``X`` or the centroids are: float32 queries to a model fitted on float64
        keep its centroids exact and get float64 distances (as KMeans)."""
        wide = np.float64 in (X.dtype, self.cluster_centers_.dtype)
        return torch.float64 if wide else torch.float32

    def _labels_inertia(self, X, sample_weight=None, inertia=True):
        Xt, Ct, shift = self._tensors(X)
        step = kmeans_step(Xt, Ct, None, update=False, shift=shift)
        labels = step["labels"].cpu().numpy().astype(np.int32)  # KMeans' label dtype
        if not inertia:
            return labels, None
        w = None if sample_weight is None else torch.as_tensor(sample_weight,
                                                                device=Ct.device)
        return labels, kmeans_inertia(Xt, w, Ct, step["labels"], shift=shift)

    def predict(self, X):
        """Index of the nearest centroid (the arg-max of the attention weights) of each point.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            A lazy Dask array for a Dask collection ``X``.
        """
        if is_dask_collection(X):
            return lazy_predict(self, "predict", X)
        X = self._check_test_data(X)
        return self._labels_inertia(X, inertia=False)[0]

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit, then return ``labels_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return self.fit(X, sample_weight=sample_weight).labels_

    def soft_assignments(self, X, temperature=None):
        """Responsibilities: the attention weights of each point over the centroids.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        temperature : float >= 0, default=None
            ``None`` uses ``temperature_``; ``0`` gives one-hot nearest-centroid rows.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_clusters)
            ``softmax_j(-||x - c_j||^2 / T)``; rows sum to 1.
        """
        X = self._check_test_data(X)
        T = check_temperature(self.temperature_ if temperature is None else temperature)
        dtype = self._compute_dtype(X)
        # the fitted centroids' count: n_clusters may have been set since the fit
        eye = np.eye(self.cluster_centers_.shape[0])
        if T == 0:
            return eye[self._labels_inertia(X, inertia=False)[0]]
        with overflow_advice(soft_assignment_advice(dtype)):
            return np.concatenate([
                np.asarray(attention(block, self.cluster_centers_, eye, temperature=T,
                                     device=self.device, dtype=dtype), dtype=np.float64)
                for block in (dense_blocks(X) if sparse.issparse(X) else [X])
            ])

    def predict_proba(self, X):
        """Responsibilities at ``temperature_`` (see :meth:`soft_assignments`).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        proba : ndarray of shape (n_samples, n_clusters)
            A lazy Dask array for a Dask collection ``X``.
        """
        if is_dask_collection(X):
            return lazy_predict(self, "predict_proba", X)
        return self.soft_assignments(X)

    def transform(self, X):
        """Euclidean distances to the centroids (like :meth:`sklearn.cluster.KMeans.transform`).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_clusters)
            A lazy Dask array for a Dask collection ``X``.
        """
        if is_dask_collection(X):
            return lazy_predict(self, "transform", X)
        X = self._check_test_data(X)
        Xt, Ct, shift = self._tensors(X)
        return np.sqrt(sqdist_to_centers(Xt, Ct, shift=shift).cpu().numpy())

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit, then return the distances of ``X`` to the centroids.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_clusters)
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the k-means inertia of ``X`` (like :meth:`sklearn.cluster.KMeans.score`).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        score : float
        """
        X = self._check_test_data(X)
        sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
        return -self._labels_inertia(X, sample_weight)[1]

    @property
    def _n_features_out(self):
        return self.cluster_centers_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.input_tags.sparse = True  # CSR (other formats are converted to it)
        # The centroid update sums with index_add_, float atomics on CUDA.
        tags.non_deterministic = _cuda_nondeterministic(self.device)
        return tags

