"""The continuous limit of attention (the documentation's theory page), as functions a user can
check.

One attention step ``S = softmax_j(-||x_i - x_j||^2 / epsilon)`` is an Euler step of size
``epsilon / 4`` of ``dH/dt = Lap H + 2 <grad log p, grad H>``; repeated attention therefore
collapses features into clusters, one per (near-)zero eigenvalue of ``I - S``. Here, as in
:class:`AttentionDiffusionEmbedding`, ``epsilon`` is the attention temperature.
"""

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array

from .._engine import attention, gaussian_kernel_log_sums, resolve_device
from ..utils._param_validation import Count, Hidden, Interval, StrOptions, validate_params
from ._eigen import top_eigenpairs
from ._operator import (
    auto_epsilon,
    bandwidth_sample,
    check_dense_memory,
    diffusion_operator,
    knn_graph_and_reference,
    reference_size,
)


@validate_params(
    {
        "X": ["array-like"],
        "f_values": ["array-like"],
        "eps": [Interval(Real, 0, None, closed="neither"), Hidden(StrOptions({"deprecated"}))],
        "alpha": [Interval(Real, 0, 1, closed="both")],
        "epsilon": [Interval(Real, 0, None, closed="neither"), None],
        "device": [str, None],
    },
    prefer_skip_nested_validation=True,
)
def attention_generator(X, f_values, eps="deprecated", alpha=0.0, *, epsilon=None, device="auto"):
    """The generator of one attention step: ``(S f - f) / (epsilon / 4)`` at the samples.

    ``S = softmax_j(-||x_i - x_j||^2 / epsilon - alpha log q_j)`` is self-attention over the
    samples at temperature ``epsilon`` (the bandwidth ``epsilon`` of
    :class:`AttentionDiffusionEmbedding` and :func:`spectral_cluster_count`), with
    Coifman–Lafon's density normalisation as a log-prior (``q_j``: the kernel sum at ``x_j``).
    For samples of a density ``p`` on a manifold, as ``n -> inf`` and then ``epsilon -> 0`` the
    result tends to

        Lap f + 2 (1 - alpha) <grad log p, grad f>

    (:doc:`/theory`): diffusion plus a drift towards dense regions for ``alpha=0`` (raw
    attention), the Laplace–Beltrami operator alone for ``alpha=1``.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        The samples (queries and keys).
    f_values : array-like of shape (n_samples,) or (n_samples, n_functions)
        Values of the function(s) at the samples (the attention values).
    eps : float > 0
        Deprecated: half the temperature (``epsilon = 2 * eps``). Pass ``epsilon`` instead;
        ``eps`` will be removed in 0.3.
    alpha : float in [0, 1], default=0.0
        Density normalisation.
    epsilon : float > 0
        Attention temperature (kernel bandwidth): one step is an Euler step of size
        ``epsilon / 4`` of the limit.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    generator : ndarray of the shape of ``f_values``

    Examples
    --------
    On the unit circle sampled uniformly, ``f = sin(theta)`` satisfies ``Lap f = -f``:

    >>> import numpy as np
    >>> from skattention.manifold import attention_generator
    >>> theta = np.linspace(0, 2 * np.pi, 2000, endpoint=False)
    >>> X = np.c_[np.cos(theta), np.sin(theta)]
    >>> Lf = attention_generator(X, np.sin(theta), epsilon=2e-3)
    >>> bool(np.max(np.abs(Lf + np.sin(theta))) < 1e-2)
    True
    """
    if not isinstance(eps, str):
        if epsilon is not None:
            raise ValueError("pass epsilon only: eps is its deprecated half (epsilon = 2 * eps).")
        warnings.warn(
            "attention_generator's eps (half the temperature) is deprecated in 0.1 and will be "
            "removed in 0.3: pass epsilon = 2 * eps, the temperature, as in "
            "AttentionDiffusionEmbedding.",
            FutureWarning,
            stacklevel=3,  # the caller of the validate_params wrapper
        )
        epsilon = 2.0 * eps
    if epsilon is None:
        raise TypeError("attention_generator() missing the argument 'epsilon'.")
    X = check_array(X, dtype=np.float64, ensure_min_samples=2)
    f = check_array(f_values, dtype=np.float64, ensure_2d=False)
    if f.ndim not in (1, 2) or f.shape[0] != X.shape[0]:
        raise ValueError(
            f"f_values must have shape (n_samples,) or (n_samples, n_functions) with "
            f"n_samples={X.shape[0]}, got {f.shape}."
        )
    temperature = float(epsilon)
    log_prior = None
    if alpha:
        log_prior = -alpha * gaussian_kernel_log_sums(
            X, X, temperature, device=device, dtype="float64"
        )
    Sf = attention(
        X, X, f, temperature=temperature, log_prior=log_prior, device=device, dtype="float64"
    )
    return (np.asarray(Sf) - f) / (temperature / 4.0)


@validate_params(
    {
        "X": ["array-like"],
        "epsilon": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "n_neighbors": [Count(Integral, 1, None, closed="left"), None],
        "alpha": [Interval(Real, 0, 1, closed="both")],
        "threshold": [Interval(Real, 0, 1, closed="neither")],
        "max_clusters": [Count(Integral, 1, None, closed="left")],
        "return_eigenvalues": ["boolean"],
        "device": [str, None],
        "random_state": ["random_state"],
    },
    prefer_skip_nested_validation=True,
)
def spectral_cluster_count(
    X,
    *,
    epsilon="auto",
    n_neighbors=None,
    alpha=0.0,
    threshold=1e-3,
    max_clusters=20,
    return_eigenvalues=False,
    device="auto",
    random_state=None,
):
    """Count clusters as the near-zero eigenvalues of ``I - S``, ``S`` the attention operator.

    Repeated self-attention is a drift-diffusion whose only stationary states are constant on
    each connected region (:doc:`/theory`): every (transient) cluster contributes an
    eigenvalue of ``S`` at or near 1, i.e. of ``I - S`` near 0, separated from the rest by a gap.
    ``S`` is built exactly as in :class:`AttentionDiffusionEmbedding` (same ``epsilon``,
    ``n_neighbors`` and ``alpha``; ``alpha=0`` is raw attention).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    epsilon : float or "auto", default="auto"
        Attention temperature; see :class:`AttentionDiffusionEmbedding`.
    n_neighbors : int, default=None
        Sparse k-NN operator instead of the dense one.
    alpha : float in [0, 1], default=0.0
        Density normalisation.
    threshold : float in (0, 1), default=1e-3
        Eigenvalues of ``I - S`` below it count as zero.
    max_clusters : int, default=20
        Eigenvalues computed (the count saturates there).
    return_eigenvalues : bool, default=False
        Also return the ``max_clusters`` smallest eigenvalues of ``I - S`` (ascending).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    n_clusters : int
    eigenvalues : ndarray of shape (max_clusters,)
        Only with ``return_eigenvalues=True``.

    Examples
    --------
    >>> from sklearn.datasets import make_blobs
    >>> from skattention.manifold import spectral_cluster_count
    >>> X, _ = make_blobs(300, centers=[[0, 0], [10, 0], [0, 10]], random_state=0)
    >>> spectral_cluster_count(X, random_state=0)
    3
    """
    X = check_array(X, dtype=np.float64, ensure_min_samples=2)
    n = X.shape[0]
    dev = resolve_device(device)
    rng = check_random_state(random_state)
    if n_neighbors is not None and n_neighbors > n:
        raise ValueError(f"n_neighbors={n_neighbors} must be at most n_samples={n}.")
    # the dense operator is refused before any work where it cannot fit (as in the estimator)
    if n_neighbors is None:
        check_dense_memory(n, None, "auto", min(max_clusters, n), "spectral_cluster_count",
                           auto=False)
    sample = bandwidth_sample(n, rng) if epsilon == "auto" else None
    knn = reference = None
    if n_neighbors is not None:
        knn, reference = knn_graph_and_reference(
            X, n_neighbors, sample, reference_size(n, n_neighbors), dev)
    eps = (
        epsilon
        if epsilon != "auto"
        else auto_epsilon(X, None if knn is None else knn[0], rng, dev, sample=sample,
                          reference=reference)[0]
    )
    op = diffusion_operator(X, float(eps), alpha, knn, dev)
    mu, _ = top_eigenpairs(op.A, min(max_clusters, n), "auto", dev, rng,
                           sqrt_degree=np.sqrt(op.degree))
    gaps = np.sort(1.0 - mu)
    count = int(np.sum(gaps < threshold))
    return (count, gaps) if return_eigenvalues else count
