"""Gaussian kernels between point sets, computed blockwise (diffusion operators, docs/theory.md).

The attention (Markov) operator of a point set is ``S = softmax_j(-||x_i - x_j||^2 / T)``; these
helpers produce its raw pieces under the same working-memory budget as :func:`attention`:
the dense kernel matrix, log row sums of the kernel (degrees), and a histogram of squared
distances from which a bandwidth can be chosen.
"""

import math

import numpy as np
import torch

from ._budget import budget_bytes, plan_blocks
from ._device import resolve_device, resolve_dtype
from ._exact import settle
from ._inputs import as_tensor, check_nonnegative_real, check_temperature
from ._parallel import map_blocks
from ._scores import PreparedKeys


def _setup(queries, keys, device, dtype, working_memory):
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, queries, keys)
    Q = as_tensor(queries, "queries", dev, dt, ndims=(2,))
    K = as_tensor(keys, "keys", dev, dt, ndims=(2,))
    if Q.shape[1] != K.shape[1]:
        raise ValueError(
            f"queries have {Q.shape[1]} features but keys have {K.shape[1]}; they must match."
        )
    if K.shape[0] == 0:
        raise ValueError("keys is empty.")
    return Q, PreparedKeys(K, "sqeuclidean"), budget_bytes(working_memory)


def _sqdist_blocks(Q, prepared, budget, what, pair_bytes, whole_rows=False, with_queries=False):
    """Yield ``(qs, qe, ks, ke, d2)``: squared distances of a query block to a key block (fast,
    rounded values; with ``with_queries``, also the block's centred and raw queries)."""
    n_q, n_k = Q.shape[0], prepared.n_keys
    item = Q.element_size()
    # Callers that fill whole rows of an output want few, wide blocks.
    bq, bk = plan_blocks(
        n_q, n_k, pair_bytes=pair_bytes * item, row_bytes=2 * item * Q.shape[1], budget=budget,
        device=Q.device, what=what, hint="use n_neighbors", whole_rows=whole_rows,
    )
    for qs in range(0, n_q, bq):
        qe = min(n_q, qs + bq)
        q_raw = Q[qs:qe]
        q = prepared.centre(q_raw)
        q_off = prepared.query_offset(q)[:, None]
        for ks in range(0, n_k, bk):
            ke = min(n_k, ks + bk)
            # partial score = 2 q.k - ||k||^2 = ||q||^2 - d^2
            d2 = prepared.block(q, ks, ke).neg_().add_(q_off).clamp_(min=0)
            yield (qs, qe, ks, ke, d2, q, q_raw) if with_queries else (qs, qe, ks, ke, d2)


@torch.no_grad()
def gaussian_kernel(
    queries, keys, temperature, *, out=None, device="auto", dtype=None, working_memory=None
):
    """The dense kernel matrix ``exp(-||q_i - k_j||^2 / temperature)``, filled block by block.

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    temperature : float > 0
    out : ndarray of shape (n_queries, n_keys), default=None
        Written in place when given (its dtype is kept); else a new float64 array. Only the
        output is ``n_queries x n_keys``: scratch memory stays within ``working_memory``.
    device, dtype, working_memory
        As in :func:`skattention.attention`.

    Returns
    -------
    kernel : ndarray of shape (n_queries, n_keys)

    Examples
    --------
    >>> import numpy as np
    >>> from skattention._engine import gaussian_kernel
    >>> Q, K = np.array([[0.0], [1.0]]), np.array([[0.0], [2.0]])
    >>> gaussian_kernel(Q, K, 1.0, dtype="float64").round(4)
    array([[1.    , 0.0183],
           [0.3679, 0.3679]])
    """
    temperature = check_temperature(temperature, positive_finite=True)
    Q, prepared, budget = _setup(queries, keys, device, dtype, working_memory)
    if out is None:
        out = np.empty((Q.shape[0], prepared.n_keys), dtype=np.float64)
    elif out.shape != (Q.shape[0], prepared.n_keys):
        raise ValueError(f"out has shape {out.shape}, expected {(Q.shape[0], prepared.n_keys)}.")
    for qs, qe, ks, ke, d2 in _sqdist_blocks(
        Q, prepared, budget, "the kernel matrix", 2, whole_rows=True
    ):
        out[qs:qe, ks:ke] = d2.mul_(-1.0 / temperature).exp_().cpu().numpy()
    return out


@torch.no_grad()
def sqdist_log_histogram(queries, keys, *, n_bins=512, self_index=None, device="auto", dtype=None,
                         working_memory=None):
    """Histogram of the logarithms of the positive squared distances between queries and keys.

    Two streaming passes (range, then counts), so memory stays within ``working_memory`` however
    many pairs there are. The summary behind data-driven bandwidth rules: any kernel sum
    ``sum_ij g(d_ij^2)`` is ``sum_b counts[b] g(exp(centre_b))`` up to the bin width.

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    n_bins : int, default=512
    self_index : array-like of int of shape (n_queries,), default=None
        Index of each query among the keys: that pair's distance is taken as exactly 0 (the
        blockwise formula can leave a rounding residue that would stretch the histogram).
    device, dtype, working_memory
        As in :func:`skattention.attention`.

    Returns
    -------
    log_edges : ndarray of shape (n_bins + 1,)
        Bin edges in log squared distance; empty when no pair has a positive distance.
    counts : ndarray of shape (n_bins,)
    n_zero : int
        Pairs at distance 0 (self pairs and duplicates), not in the histogram.
    """
    Q, prepared, budget = _setup(queries, keys, device, dtype, working_memory)
    skip = None if self_index is None else torch.as_tensor(np.asarray(self_index), device=Q.device)
    n_zero = 0

    def positive_logs():
        for qs, qe, ks, ke, d2 in _sqdist_blocks(Q, prepared, budget, "the distance histogram", 3):
            if skip is not None:
                local = skip[qs:qe] - ks
                rows = ((local >= 0) & (local < ke - ks)).nonzero().squeeze(1)
                d2[rows, local[rows]] = 0.0
            positive = d2 > 0
            yield torch.log(d2[positive]), int(positive.numel() - positive.sum())

    lo, hi = math.inf, -math.inf
    for logs, zeros in positive_logs():
        n_zero += zeros
        if logs.numel():
            lo, hi = min(lo, float(logs.min())), max(hi, float(logs.max()))
    if lo == math.inf:
        return np.empty(0), np.zeros(n_bins), n_zero
    hi = max(hi, lo + 1e-6)
    counts = torch.zeros(n_bins, dtype=torch.float64, device=Q.device)
    for logs, _ in positive_logs():
        counts += _histc(logs, n_bins, lo, hi)
    return np.linspace(lo, hi, n_bins + 1), counts.cpu().numpy(), n_zero


@torch.no_grad()
def mean_kth_distance(points, k, *, device="auto", working_memory=None):
    """The mean over ``points`` of each one's distance to its ``k``-th nearest point, itself
    counted as its nearest (scikit-learn's ``estimate_bandwidth`` with ``n_neighbors=k``, its
    mean of each point's largest distance to its ``k`` nearest).

    Blocks of points against every point (float64): the ``k``-th smallest of each row's fast
    squared distances picks the neighbour, whose distance is then computed from the explicit
    differences (a point's distance to itself or to its duplicates exactly 0).

    Parameters
    ----------
    points : array-like or Tensor of shape (n_points, n_features)
    k : int
        Which neighbour, from 1 (the point itself) to ``n_points``.
    device, working_memory
        As in :func:`skattention.attention`.

    Returns
    -------
    mean : float
    """
    X, prepared, budget = _setup(points, points, device, torch.float64, working_memory)
    n = X.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}] (the number of points).")
    total = torch.zeros((), dtype=torch.float64, device=X.device)
    for qs, qe, _, _, d2 in _sqdist_blocks(X, prepared, budget, "the k-th distances", 3,
                                           whole_rows=True):
        rows = torch.arange(qs, qe, device=X.device)
        d2[rows - qs, rows] = 0.0  # the point itself (the fast form leaves a residue)
        if d2.device.type == "cpu":  # NumPy's introselect: several times torch's kthvalue
            kth = _kth_smallest_cpu(d2, k)
        else:
            kth = d2.kthvalue(k, dim=1).indices
        total += (X[qs:qe] - X[kth]).square_().sum(1).sqrt_().sum()
    return float(total) / n


def _kth_smallest_cpu(d2, k):
    """The column of each row's ``k``-th smallest entry of a CPU matrix, by NumPy's introselect
    (which releases the GIL) on row slices shared out to the caller's torch threads as workers:
    each row's column depends on that row alone."""
    rows = d2.numpy()
    workers = max(1, torch.get_num_threads())
    step = -(-rows.shape[0] // workers)
    parts = map_blocks(lambda s: np.argpartition(rows[s : s + step], k - 1, axis=1)[:, k - 1],
                       range(0, rows.shape[0], step), workers)
    return torch.from_numpy(np.concatenate(list(parts)))


def _histc(x, n_bins, lo, hi, deterministic=None):
    """``torch.histc`` as float64 counts. CUDA's histc has no deterministic implementation (it
    raises under ``torch.use_deterministic_algorithms(True)``); there, count with an integer
    ``bincount`` of the same bin indices instead."""
    if deterministic is None:
        deterministic = x.is_cuda and torch.are_deterministic_algorithms_enabled()
    if not deterministic:
        return torch.histc(x, bins=n_bins, min=lo, max=hi).to(torch.float64)
    inside = x[(x >= lo) & (x <= hi)]
    bins = ((inside - lo) * (n_bins / (hi - lo))).long().clamp_(0, n_bins - 1)
    return torch.bincount(bins, minlength=n_bins).to(torch.float64)


@torch.no_grad()
def gaussian_kernel_log_sums(
    queries, keys, temperature, *, device="auto", dtype=None, working_memory=None
):
    """``log sum_j exp(-||q_i - k_j||^2 / temperature)`` for every query, streamed over key blocks.

    The log-degrees of the kernel graph: the density estimate behind Coifman–Lafon's
    normalisation, and, negated, the log-prior that turns attention into the ``alpha``-normalised
    diffusion operator. Stable for any temperature (a running log-sum-exp).

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    temperature : float > 0
    device, dtype, working_memory
        As in :func:`skattention.attention`.

    Returns
    -------
    log_sums : ndarray or Tensor of shape (n_queries,)
        NumPy when ``queries`` is not a tensor, else a tensor on the compute device.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention._engine import gaussian_kernel_log_sums
    >>> float(np.exp(gaussian_kernel_log_sums(np.zeros((1, 1)), np.zeros((3, 1)), 1.0)[0]))
    3.0
    """
    temperature = check_temperature(temperature, positive_finite=True)
    Q, prepared, budget = _setup(queries, keys, device, dtype, working_memory)
    out = torch.full((Q.shape[0],), -math.inf, dtype=Q.dtype, device=Q.device)
    for qs, qe, _, _, d2 in _sqdist_blocks(Q, prepared, budget, "kernel sums", 2):
        out[qs:qe] = torch.logaddexp(out[qs:qe], torch.logsumexp(d2.mul_(-1.0 / temperature), 1))
    return out if isinstance(queries, torch.Tensor) else out.cpu().numpy()


def _inside_blocks(Q, prepared, budget, radius, what):
    """Yield ``(qs, qe, ks, ke, inside)``: which keys of a block are within ``radius`` of which
    queries, exactly (keys within rounding error of the boundary are settled on exact
    distances, so a key at distance exactly ``radius`` is inside, as in scikit-learn)."""
    r2 = radius * radius
    eps = torch.finfo(Q.dtype).eps
    # per entry: the distances, their excess and its magnitude, the mask as values
    for qs, qe, ks, ke, d2, q, q_raw in _sqdist_blocks(
        Q, prepared, budget, what, 4, with_queries=True
    ):
        margin = (prepared.margin(q) + 4 * eps * r2)[:, None]

        def exact_excess(rows, cols, q_raw=q_raw, ks=ks):
            return prepared.exact_pairs(q_raw, rows, cols + ks, budget) - r2

        yield qs, qe, ks, ke, ~settle(d2.sub_(r2), margin, exact_excess)


@torch.no_grad()
def ball_counts(queries, keys, radius, *, device="auto", dtype=None, working_memory=None):
    """Number of keys within ``radius`` of each query (``||q - k|| <= radius``), streamed.

    The flat kernel's density (mean shift's intensity of a mode). Exact: a key at distance
    exactly ``radius`` counts, as in scikit-learn's ``radius_neighbors``.

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    radius : float >= 0
    device, dtype, working_memory
        As in :func:`skattention.attention`.

    Returns
    -------
    counts : ndarray or Tensor of int64, shape (n_queries,)
        NumPy when ``queries`` is not a tensor, else a tensor on the compute device.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention._engine import ball_counts
    >>> ball_counts(np.array([[0.0], [5.0]]), np.array([[0.0], [0.5], [2.0]]), 1.0)
    array([2, 0])
    """
    counts, _ = ball_sums(
        queries, keys, radius, device=device, dtype=dtype, working_memory=working_memory
    )
    return counts


@torch.no_grad()
def ball_sums(queries, keys, radius, values=None, *, device="auto", dtype=None,
              working_memory=None):
    """Number of keys within ``radius`` of each query and the sum of their ``values``: the
    flat kernel's step (mean shift's mean of the points within the bandwidth is
    ``sums / counts``), with the exact boundary of :func:`ball_counts`.

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    radius : float >= 0
    values : array-like or Tensor of shape (n_keys, n_values), default=None
        ``None``: counts only.
    device, dtype, working_memory
        As in :func:`skattention.attention`.

    Returns
    -------
    counts : ndarray or Tensor of int64, shape (n_queries,)
    sums : ndarray or Tensor of shape (n_queries, n_values), or None
        In the compute dtype. NumPy when ``queries`` is not a tensor, else tensors on the
        compute device.
    """
    radius = check_nonnegative_real(radius, "radius")
    Q, prepared, budget = _setup(queries, keys, device, dtype, working_memory)
    counts = torch.zeros(Q.shape[0], dtype=torch.long, device=Q.device)
    V = None if values is None else as_tensor(values, "values", Q.device, Q.dtype, ndims=(2,))
    sums = None if V is None else Q.new_zeros((Q.shape[0], V.shape[1]))
    for qs, qe, ks, ke, inside in _inside_blocks(Q, prepared, budget, radius, "ball sums"):
        counts[qs:qe] += inside.sum(1)
        if V is not None:
            sums[qs:qe] += inside.to(V.dtype) @ V[ks:ke]
    if isinstance(queries, torch.Tensor):
        return counts, sums
    return counts.cpu().numpy(), None if sums is None else sums.cpu().numpy()
