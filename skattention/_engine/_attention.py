"""Exact, streaming, memory-bounded attention (THEORY.md sections 2 and 3).

    a_ij = p0_ij exp(s(q_i, k_j) / T) / sum_l p0_il exp(s(q_i, k_l) / T),   out_i = sum_j a_ij v_j

with s = -f the score of a pseudo-metric f and log p0 an additive log-prior (masks are -inf).
Three execution paths compute the same quantity:

* ``_stream_attention``: query blocks x key blocks with an online softmax (running max, sum and
  weighted sum, rescaled when the max grows); optional blockwise top-weight tracking.
* ``_knn_attention``: a blockwise top-k merge selects the ``n_neighbors`` best keys per query (the
  k-NN prior), then a softmax over those.
* ``_sdpa_attention``: dense attention with a per-key prior through
  ``torch.nn.functional.scaled_dot_product_attention`` and the augmented-coordinate identity
  q' = [q, 1], k' = [2k, -||k||^2 + T log p0], scale 1/T, restricted to the O(n)-memory kernels.
"""

import contextlib
import math
import threading
from numbers import Integral, Real

import numpy as np
import torch
import torch.nn.functional as F

from .._config import get_config
from ._device import resolve_device, resolve_dtype
from ._progress import track
from ._scores import METRICS, Scorer

# On the CPU a score block of about 2**20 entries (4 MiB in float32) stays in cache; larger
# blocks are slower, not faster. Accelerators want blocks as large as the budget allows.
_CPU_BLOCK_ENTRIES = 1 << 20
_CPU_KEY_BLOCK = 1024
_ACCEL_KEY_BLOCK = 16384
# Queries per scaled_dot_product_attention call (its fused kernels need O(n) memory only).
_SDPA_QUERY_BLOCK = 8192
_NEG_INF = float("-inf")

# torch's sdpa_kernel() switches process-wide flags and restores, on exit, what it found on entry:
# two threads inside it at once (joblib's threading backend) can restore each other's restriction
# and leave SDPA's math kernel disabled for the whole process. Every SDPA call of the library
# (this module and skattention.nn) holds this lock.
SDPA_LOCK = threading.RLock()


@contextlib.contextmanager
def _linear_memory_sdpa():
    """Restrict scaled_dot_product_attention to its O(n)-memory kernels (never the math kernel,
    which materialises the n_queries x n_keys score matrix), thread-safely."""
    backends = [torch.nn.attention.SDPBackend.FLASH_ATTENTION, torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]
    with SDPA_LOCK, torch.nn.attention.sdpa_kernel(backends):
        yield


def attention(
    queries,
    keys,
    values,
    *,
    metric="sqeuclidean",
    temperature=1.0,
    n_neighbors=None,
    radius=None,
    log_prior=None,
    exclude_self=False,
    return_weights=False,
    n_weights=None,
    on_empty="raise",
    device="auto",
    dtype=None,
    working_memory=None,
    backend="auto",
    progress=False,
):
    """Propagate ``values`` from ``keys`` to ``queries`` with exact, memory-bounded attention.

    Computes ``out_i = sum_j a_ij v_j`` with
    ``a_ij = p0_ij exp(s(q_i, k_j) / T) / sum_l p0_il exp(s(q_i, k_l) / T)``, where
    ``s = -f`` is the score of the pseudo-metric and ``log p0`` the sum of all priors (masks are
    ``-inf``). Queries and keys are processed in blocks with an online softmax, so the scratch
    memory is bounded by ``working_memory`` rather than by ``n_queries * n_keys``.

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    values : array-like or Tensor of shape (n_keys,) or (n_keys, n_values)
    metric : {"sqeuclidean", "dot"} or callable, default="sqeuclidean"
        ``"sqeuclidean"``: s = -||q - k||^2. ``"dot"``: s = q.k. A callable ``phi`` mapping a
        ``(n, n_features)`` tensor to ``(n, d)`` gives s = -||phi(q) - phi(k)||^2.
    temperature : float >= 0 or 0-d Tensor, default=1.0
        ``0`` is the arg-max limit (weights spread, by prior, over the keys tied at the best
        score); ``inf`` the uniform limit (weights proportional to the prior over unmasked keys).
        A tensor that requires grad is differentiated through.
    n_neighbors : int, default=None
        k-NN prior: only the ``n_neighbors`` best-scoring unmasked keys of each query get weight.
    radius : float or (array-like, array-like), default=None
        Radius prior (distance metrics only): only keys with ``f(q, k) <= radius**2`` get weight.
        A pair ``(query_radius, key_radius)`` of arrays of shape ``(n_queries,)`` and
        ``(n_keys,)`` keeps key ``j`` for query ``i`` when
        ``f(q_i, k_j) <= max(query_radius[i], key_radius[j])**2``: with the distances to the
        k-th neighbours as radii, this is the symmetric k-NN graph (``j`` among the k nearest
        keys of ``i``, or ``i`` within ``j``'s own k-NN ball).
    log_prior : array-like of shape (n_keys,) or callable, default=None
        Additive log-bias per key (log sample weights, class balance; ``-inf`` masks a key), or a
        callable ``(query_index, key_index) -> Tensor`` returning the log-bias for broadcastable
        integer index tensors (e.g. a relative-position bias); it is evaluated block by block.
    exclude_self : bool or array-like of int of shape (n_queries,), default=False
        ``True`` masks key ``i`` for query ``i`` (queries are the keys). An integer array masks key
        ``exclude_self[i]`` for query ``i`` (``-1``: nothing).
    return_weights : bool, default=False
        Also return the largest attention weights of each query and their key indices.
    n_weights : int, default=None
        How many weights to return: by default ``n_neighbors`` with a k-NN prior, else all keys.
        Rows are sorted by decreasing weight (by increasing distance with a k-NN prior or at
        ``temperature=inf``); padding entries have weight 0 and index -1.
    on_empty : {"raise", "zero"}, default="raise"
        What to do with a query whose keys are all masked: raise ``ValueError`` or output zeros
        (its weights are then all 0).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
    dtype : torch.dtype or str, default=None
        Compute dtype. ``None``: the floating dtype of tensor inputs, float32 otherwise.
    working_memory : float, default=None
        Scratch memory budget in MiB; ``None`` uses ``skattention.get_config()``.
    backend : {"auto", "stream", "sdpa"}, default="auto"
        ``"auto"`` uses ``scaled_dot_product_attention`` for dense attention with a per-key prior
        and a finite positive temperature, and the streaming path otherwise.
    progress : int or bool, default=False
        Verbosity: a progress bar over the query blocks (on standard error, tqdm when installed)
        when there are several and the call lasts more than a couple of seconds.

    Returns
    -------
    out : ndarray or Tensor of shape (n_queries,) or (n_queries, n_values)
        NumPy when ``queries`` is not a tensor, else a tensor on the compute device.
    weights : ndarray or Tensor of shape (n_queries, n_weights)
        Only with ``return_weights=True``.
    indices : ndarray or Tensor of int64, shape (n_queries, n_weights)
        Only with ``return_weights=True``.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention import attention
    >>> keys = np.array([[0.0], [1.0], [10.0]])
    >>> values = np.array([0.0, 1.0, 2.0])
    >>> attention(np.array([[0.2]]), keys, values, n_neighbors=2, temperature=np.inf)
    array([0.5], dtype=float32)
    >>> out, w, idx = attention(np.array([[0.2]]), keys, values, temperature=0,
    ...                         return_weights=True, n_weights=2)
    >>> out, idx
    (array([0.], dtype=float32), array([[0, 1]]))
    """
    as_numpy = not isinstance(queries, torch.Tensor)
    P = _Problem(
        queries, keys, values, metric=metric, n_neighbors=n_neighbors, radius=radius,
        log_prior=log_prior, exclude_self=exclude_self, device=device, dtype=dtype,
        working_memory=working_memory,
    )
    Q, V, n_k, n_neighbors = P.Q, P.V, P.n_k, P.n_neighbors
    squeeze = V.ndim == 1
    V2 = V[:, None] if squeeze else V
    T = _check_temperature(temperature, P.device, P.dtype)
    if on_empty not in ("raise", "zero"):
        raise ValueError(f"on_empty must be 'raise' or 'zero', got {on_empty!r}.")
    if backend not in ("auto", "stream", "sdpa"):
        raise ValueError(f"backend must be 'auto', 'stream' or 'sdpa', got {backend!r}.")
    if return_weights:
        limit = n_neighbors if n_neighbors is not None else n_k
        n_weights = limit if n_weights is None else _check_count(n_weights, "n_weights", limit)
    else:
        n_weights = None
    scorer, prior_vec, prior_fn, radius, self_index = P.scorer, P.prior_vec, P.prior_fn, P.radius, P.self_index
    budget = P.budget

    # A learned phi shows up as keys that require grad.
    grad = torch.is_grad_enabled() and (
        Q.requires_grad
        or scorer.keys.requires_grad
        or V.requires_grad
        or isinstance(T, torch.Tensor)
        or (prior_vec is not None and prior_vec.requires_grad)
    )
    common = dict(
        scorer=scorer, Q=Q, V=V2, T=T, prior_vec=prior_vec, prior_fn=prior_fn,
        radius=radius, self_index=self_index, on_empty=on_empty, budget=budget,
        inplace=not grad, progress=progress,
    )
    with torch.set_grad_enabled(grad):
        sdpa_ok = (
            n_neighbors is None
            and radius is None
            and self_index is None
            and prior_fn is None
            and n_weights is None
            and isinstance(T, float)
            and 0.0 < T < math.inf
        )
        if backend == "sdpa" and not sdpa_ok:
            raise ValueError(
                "backend='sdpa' needs dense attention with a finite positive float temperature, "
                "a per-key log_prior at most, and return_weights=False."
            )
        result = None
        if n_neighbors is not None:
            result = _knn_attention(k=n_neighbors, n_weights=n_weights, grad=grad, **common)
        elif sdpa_ok and backend != "stream" and (backend == "sdpa" or _sdpa_pays(scorer, V2)):
            result = _sdpa_attention(strict=backend == "sdpa", **common)
        if result is None:
            result = _stream_attention(n_weights=n_weights, **common)

    out = result[0]
    if not bool(torch.isfinite(out).all()):
        raise ValueError(
            "attention produced non-finite values: the scores overflow the compute dtype at this "
            "temperature; rescale the data, raise the temperature or use dtype=torch.float64."
        )
    if squeeze:
        out = out[:, 0]
    if as_numpy:
        out = out.detach().cpu().numpy()
    if n_weights is None:
        return out
    weights, indices = result[1], result[2]
    if as_numpy:
        weights, indices = weights.detach().cpu().numpy(), indices.cpu().numpy()
    return out, weights, indices


def kneighbors(
    queries,
    keys,
    n_neighbors,
    *,
    metric="sqeuclidean",
    radius=None,
    log_prior=None,
    exclude_self=False,
    device="auto",
    dtype=None,
    working_memory=None,
    progress=False,
):
    """The ``n_neighbors`` nearest keys of each query under a pseudo-metric (blockwise top-k).

    The selection step of k-NN attention on its own, like
    :meth:`sklearn.neighbors.NearestNeighbors.kneighbors`. Keys masked by ``radius``,
    ``exclude_self`` or a ``-inf`` ``log_prior`` are never returned; ``log_prior`` does not
    otherwise change the ranking.

    Parameters
    ----------
    queries : array-like or Tensor of shape (n_queries, n_features)
    keys : array-like or Tensor of shape (n_keys, n_features)
    n_neighbors : int
    metric, radius, log_prior, exclude_self, device, dtype, working_memory, progress
        As in :func:`attention`.

    Returns
    -------
    distances : ndarray or Tensor of shape (n_queries, n_neighbors)
        Pseudo-metric values f(q, k), ascending (squared Euclidean distances for
        ``"sqeuclidean"``, ``-q.k`` for ``"dot"``); ``inf`` where fewer keys are unmasked.
    indices : ndarray or Tensor of int64, shape (n_queries, n_neighbors)
        Key indices; ``-1`` for padding.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention import kneighbors
    >>> keys = np.array([[0.0], [1.0], [3.0]])
    >>> kneighbors(np.array([[0.9]]), keys, 2, dtype="float64")
    (array([[0.01, 0.81]]), array([[1, 0]]))
    """
    as_numpy = not isinstance(queries, torch.Tensor)
    P = _Problem(
        queries, keys, None, metric=metric, n_neighbors=n_neighbors, radius=radius,
        log_prior=log_prior, exclude_self=exclude_self, device=device, dtype=dtype,
        working_memory=working_memory,
    )
    if P.n_neighbors is None:
        raise ValueError("n_neighbors must be a positive integer.")
    ctx = _context(1.0, P.prior_vec, P.prior_fn, P.radius, P.self_index, inplace=True)
    dists, indices = [], []
    with torch.no_grad():
        for qs, qe, q, q_index, top in _topk_blocks(P.scorer, P.Q, P.n_neighbors, ctx, P.budget, 0, "kneighbors", progress):
            valid = top.r > _NEG_INF
            f = P.scorer.query_offset(q)[:, None] - top.r
            if P.scorer.is_distance:
                f = f.clamp(min=0)
            dists.append(torch.where(valid, f, math.inf))
            indices.append(torch.where(valid, top.i, -1))
    like = P.Q
    dist = _cat_or_empty(dists, (0, P.n_neighbors), like)
    idx = _cat_or_empty(indices, (0, P.n_neighbors), like, torch.long)
    if as_numpy:
        return dist.cpu().numpy(), idx.cpu().numpy()
    return dist, idx


class _Problem:
    """Validated, device-placed inputs shared by :func:`attention` and :func:`kneighbors`."""

    def __init__(self, queries, keys, values, *, metric, n_neighbors, radius, log_prior,
                 exclude_self, device, dtype, working_memory):
        self.device = dev = resolve_device(device)
        self.dtype = dt = resolve_dtype(dtype, queries, keys, values)
        self.Q = Q = _as_tensor(queries, "queries", dev, dt, ndims=(2,))
        K = _as_tensor(keys, "keys", dev, dt, ndims=(2,))
        self.n_q, self.n_k = n_q, n_k = Q.shape[0], K.shape[0]
        if n_k == 0:
            raise ValueError("keys is empty: attention needs at least one key.")
        if not callable(metric) and Q.shape[1] != K.shape[1]:
            raise ValueError(
                f"queries have {Q.shape[1]} features but keys have {K.shape[1]}; they must match."
            )
        if values is not None:
            self.V = _as_tensor(values, "values", dev, dt, ndims=(1, 2))
            if self.V.shape[0] != n_k:
                raise ValueError(
                    f"values has {self.V.shape[0]} rows but there are {n_k} keys; they must match."
                )
        if not (callable(metric) or (isinstance(metric, str) and metric in METRICS)):
            raise ValueError(f"metric={metric!r} is not supported; use one of {METRICS} or a callable.")
        self.n_neighbors = None
        if n_neighbors is not None:
            self.n_neighbors = _check_count(n_neighbors, "n_neighbors", n_k, "the number of keys")
        if radius is not None:
            if metric == "dot":
                raise ValueError("radius needs a distance metric; metric='dot' has none.")
            radius = _Radius.check(radius, n_q, n_k, dev, dt)
        self.radius = radius
        self.prior_vec, self.prior_fn = _check_log_prior(log_prior, n_k, dev, dt)
        self.self_index = _check_exclude_self(exclude_self, n_q, n_k, dev)
        self.budget = _budget_bytes(working_memory)
        self.scorer = Scorer(K, metric)


# --------------------------------------------------------------------------- validation


def _as_tensor(x, name, device, dtype, ndims):
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:
            raise TypeError(f"{name} could not be converted to an array: {exc}") from exc
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be numeric, got an array of dtype {arr.dtype}.")
        if not arr.flags.writeable:
            arr = arr.copy()  # torch cannot wrap read-only memory (e.g. memory-mapped inputs)
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.is_complex():
        raise TypeError(f"{name} must be real-valued, got dtype {t.dtype}.")
    if t.ndim not in ndims:
        expected = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {expected}, got an array of shape {tuple(t.shape)}.")
    t = t.to(device=device, dtype=dtype)
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or infinity.")
    return t


def _check_temperature(temperature, device, dtype):
    if isinstance(temperature, torch.Tensor):
        if temperature.numel() != 1:
            raise ValueError("temperature must be a scalar.")
        value = float(temperature.detach())
        if math.isnan(value) or value < 0:
            raise ValueError(f"temperature must be >= 0, got {value}.")
        if value == 0 or math.isinf(value) or not temperature.requires_grad:
            return value
        return temperature.reshape(()).to(device=device, dtype=dtype)
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise ValueError(f"temperature must be a number >= 0 (inf allowed), got {temperature!r}.")
    value = float(temperature)
    if math.isnan(value) or value < 0:
        raise ValueError(f"temperature must be >= 0 (inf allowed), got {temperature!r}.")
    return value


def _check_log_prior(log_prior, n_keys, device, dtype):
    if log_prior is None:
        return None, None
    if callable(log_prior) and not isinstance(log_prior, (np.ndarray, torch.Tensor)):
        return None, log_prior
    prior = _as_tensor_allow_neginf(log_prior, device, dtype)
    if prior.shape != (n_keys,):
        raise ValueError(
            f"log_prior must have shape (n_keys,) = ({n_keys},), got {tuple(prior.shape)}."
        )
    if bool(torch.isnan(prior).any()) or bool((prior == math.inf).any()):
        raise ValueError("log_prior contains NaN or +inf; use -inf to mask a key.")
    return prior, None


def _as_tensor_allow_neginf(x, device, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    arr = np.array(x, copy=True)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"log_prior must be numeric, got dtype {arr.dtype}.")
    return torch.from_numpy(arr).to(device=device, dtype=dtype)


def _check_exclude_self(exclude_self, n_q, n_k, device):
    if exclude_self is None or exclude_self is False:
        return None
    if exclude_self is True:
        if n_q != n_k:
            raise ValueError(
                f"exclude_self=True needs the queries to be the keys, but there are {n_q} queries "
                f"and {n_k} keys; pass an index array instead."
            )
        return torch.arange(n_q, device=device)
    idx = torch.as_tensor(np.asarray(exclude_self) if not isinstance(exclude_self, torch.Tensor) else exclude_self)
    if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.shape != (n_q,):
        raise ValueError(
            f"exclude_self must be a bool or an integer array of shape ({n_q},), got "
            f"dtype {idx.dtype} and shape {tuple(idx.shape)}."
        )
    if n_q and (int(idx.min()) < -1 or int(idx.max()) >= n_k):
        raise ValueError("exclude_self indices must lie in [-1, n_keys).")
    return idx.to(device=device, dtype=torch.long)


class _Radius:
    """The radius prior: key j is kept for query i when f(q_i, k_j) <= r_ij**2, where r_ij is one
    number or ``max(query_radius[i], key_radius[j])``.

    Blocks hold partial scores ``s = ||q||^2 - f`` (see ``Scorer``), so the test is
    ``s >= ||q||^2 - r_ij**2``; :meth:`threshold` returns the right-hand side for a block.
    """

    def __init__(self, radius=None, query_r2=None, key_r2=None):
        self.radius, self.query_r2, self.key_r2 = radius, query_r2, key_r2
        self._qoff = self._q_r2 = None

    @classmethod
    def check(cls, radius, n_q, n_k, device, dtype):
        """Validate ``radius``; ``None`` for an infinite radius (no mask)."""
        if isinstance(radius, tuple) and len(radius) == 2:
            query_r, key_r = (
                _as_tensor(r, name, device, dtype, ndims=(1,))
                for r, name in zip(radius, ("query radius", "key radius"))
            )
            if query_r.shape[0] != n_q or key_r.shape[0] != n_k:
                raise ValueError(
                    f"a (query_radius, key_radius) pair needs shapes ({n_q},) and ({n_k},), got "
                    f"{tuple(query_r.shape)} and {tuple(key_r.shape)}."
                )
            if bool((query_r < 0).any()) or bool((key_r < 0).any()):
                raise ValueError("radii must be >= 0.")
            return cls(query_r2=query_r * query_r, key_r2=key_r * key_r)
        if not isinstance(radius, Real) or isinstance(radius, bool) or not radius > 0:
            raise ValueError(
                f"radius must be a positive number, a (query_radius, key_radius) pair of arrays "
                f"or None, got {radius!r}."
            )
        return None if math.isinf(radius) else cls(radius=float(radius))

    def start_block(self, query_offset, qs, qe):
        self._qoff = query_offset[:, None]
        if self.radius is not None:
            self._qoff = self._qoff - self.radius**2
        else:
            self._q_r2 = self.query_r2[qs:qe, None]

    def threshold(self, ks, ke):
        if self.radius is not None:
            return self._qoff
        return self._qoff - torch.maximum(self._q_r2, self.key_r2[None, ks:ke])

    def pair_bytes(self, item):
        """Extra scratch bytes per score entry: per-point radii need a threshold block."""
        return 0 if self.radius is not None else item + 1

    def __str__(self):
        return f"radius={self.radius}" if self.radius is not None else "the per-point radii"


def _check_count(value, name, limit, limit_name=None):
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}.")
    if value > limit:
        what = limit_name or f"the {limit} keys that can get weight"
        raise ValueError(f"{name}={value} is larger than {what} ({limit}).")
    return int(value)


def _budget_bytes(working_memory):
    mib = get_config()["working_memory"] if working_memory is None else working_memory
    if isinstance(mib, bool) or not isinstance(mib, Real) or not mib > 0:
        raise ValueError(f"working_memory must be a positive number of MiB, got {mib!r}.")
    return int(mib * 2**20)


# --------------------------------------------------------------------------- planning


def _plan_blocks(n_q, n_k, *, pair_bytes, query_bytes, budget, device, what, cache_sized=True):
    """Query and key block sizes whose scratch memory fits ``budget`` bytes.

    ``pair_bytes``: scratch bytes per (query, key) entry of a score block (scores and their
    temporaries). ``query_bytes``: per-query scratch (softmax state, top-k buffers, gathers).
    ``cache_sized``: on the CPU, cap blocks at a cache-friendly size. Under autograd every block
    stays alive in the graph anyway, so fewer, larger blocks (fewer ops to differentiate) win.
    """
    if device.type == "cpu" and cache_sized:
        bk = min(n_k, _CPU_KEY_BLOCK)
        target = _CPU_BLOCK_ENTRIES
    else:
        bk = min(n_k, _ACCEL_KEY_BLOCK)
        target = max(1, budget // pair_bytes)
    while bk > 1 and bk * pair_bytes + query_bytes > budget:
        bk //= 2
    if bk * pair_bytes + query_bytes > budget:
        raise MemoryError(
            f"{what} needs at least {(pair_bytes + query_bytes) / 2**20:.1f} MiB of scratch memory "
            f"per query but the budget is {budget / 2**20:.1f} MiB; raise working_memory "
            "(skattention.config_context(working_memory=...)) or use a smaller n_neighbors."
        )
    bq = budget // (bk * pair_bytes + query_bytes)
    bq = max(1, min(bq, max(1, target // bk), n_q))
    return bq, bk


# --------------------------------------------------------------------------- shared pieces


class _OnlineSoftmax:
    """Running max ``m``, sum ``l`` and weighted sum ``o`` of exp(z - m) over key blocks."""

    def __init__(self, n_rows, n_values, like):
        self.m = torch.full((n_rows,), _NEG_INF, dtype=like.dtype, device=like.device)
        self.l = torch.zeros(n_rows, dtype=like.dtype, device=like.device)
        self.o = torch.zeros(n_rows, n_values, dtype=like.dtype, device=like.device)

    def reset(self, rows):
        """Forget the rows in boolean mask ``rows`` (used by the arg-max limit)."""
        self.m = torch.where(rows, _NEG_INF, self.m)
        self.l = torch.where(rows, 0.0, self.l)
        self.o = torch.where(rows[:, None], 0.0, self.o)

    def update(self, z, v, inplace):
        new_m = torch.maximum(self.m, z.amax(1))
        # A row whose keys are all masked so far keeps m = -inf; shift it by 0, not by -inf.
        shift = torch.where(torch.isfinite(new_m), new_m, 0.0)
        alpha = torch.exp(self.m - shift)
        p = z.sub_(shift[:, None]).exp_() if inplace else torch.exp(z - shift[:, None])
        self.l = self.l * alpha + p.sum(1)
        self.o = self.o * alpha[:, None] + p @ v
        self.m = new_m

    def single(self, z, v):
        """The whole softmax at once, when one key block holds every key (fewer ops to
        differentiate than the streaming update)."""
        self.m = z.amax(1)
        empty = torch.isneginf(self.m)
        p = torch.softmax(torch.where(empty[:, None], 0.0, z), 1)  # no NaN rows to differentiate
        self.o = torch.where(empty[:, None], 0.0, p @ v)
        self.l = (~empty).to(z.dtype)

    def result(self):
        return self.o / torch.where(self.l > 0, self.l, 1.0)[:, None]


class _TopK:
    """Blockwise top-k merge of a ranking ``r`` (and an optional companion ``aux``) per row."""

    def __init__(self, n_rows, k, like, with_aux=False):
        self.k = k
        self.r = torch.full((n_rows, k), _NEG_INF, dtype=like.dtype, device=like.device)
        self.i = torch.full((n_rows, k), -1, dtype=torch.long, device=like.device)
        self.aux = torch.full_like(self.r, _NEG_INF) if with_aux else None

    def update(self, r, start, aux=None):
        # Only rows whose block maximum beats their current k-th best can change; late blocks
        # rarely do, which makes the merge cheap.
        rows = (r.amax(1) > self.r[:, -1]).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        full = rows.numel() == r.shape[0]
        sub = r if full else r[rows]
        val, pos = sub.topk(min(self.k, sub.shape[1]), dim=1)
        old_r = self.r if full else self.r[rows]
        old_i = self.i if full else self.i[rows]
        merged_r, order = torch.cat([old_r, val], 1).topk(self.k, dim=1)
        merged_i = torch.cat([old_i, pos + start], 1).gather(1, order)
        if self.aux is not None:
            sub_aux = aux if full else aux[rows]
            old_a = self.aux if full else self.aux[rows]
            merged_a = torch.cat([old_a, sub_aux.gather(1, pos)], 1).gather(1, order)
        if full:
            self.r, self.i = merged_r, merged_i
            if self.aux is not None:
                self.aux = merged_a
        else:
            self.r[rows], self.i[rows] = merged_r, merged_i
            if self.aux is not None:
                self.aux[rows] = merged_a


def _mask_self(s, self_index, qs, qe, ks, ke, inplace):
    """Set s[i, j] = -inf where key ks + j is query qs + i's excluded index."""
    local = self_index[qs:qe] - ks
    rows = ((local >= 0) & (local < ke - ks)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return s
    cols = local[rows]
    fill = torch.full((rows.numel(),), _NEG_INF, dtype=s.dtype, device=s.device)
    return s.index_put_((rows, cols), fill) if inplace else s.index_put((rows, cols), fill)


def _masked(s, mask, inplace):
    return s.masked_fill_(mask, _NEG_INF) if inplace else s.masked_fill(mask, _NEG_INF)


def _raw_scores(scorer, q, qs, qe, ks, ke, ctx, q_index):
    """Partial scores of a block with every mask applied (-inf), and the callable prior's bias."""
    s = scorer.block(q, ks, ke)
    inplace = ctx["inplace"]
    if ctx["radius"] is not None:
        s = _masked(s, s < ctx["radius"].threshold(ks, ke), inplace)
    if ctx["self_index"] is not None:
        s = _mask_self(s, ctx["self_index"], qs, qe, ks, ke, inplace)
    if ctx["key_mask"] is not None:
        s = _masked(s, ctx["key_mask"][None, ks:ke], inplace)
    bias = None
    if ctx["prior_fn"] is not None:
        bias = _call_prior_fn(ctx["prior_fn"], q_index, torch.arange(ks, ke, device=s.device)[None, :], s)
        s = _masked(s, torch.isneginf(bias), inplace)
    return s, bias


def _call_prior_fn(prior_fn, q_index, k_index, like):
    try:
        bias = prior_fn(q_index, k_index)
    except Exception as exc:
        raise ValueError(f"log_prior callable failed: {exc}") from exc
    bias = torch.as_tensor(bias, dtype=like.dtype, device=like.device)
    try:
        bias = torch.broadcast_to(bias, like.shape)
    except RuntimeError:
        raise ValueError(
            f"log_prior callable returned shape {tuple(bias.shape)}, not broadcastable to "
            f"{tuple(like.shape)}."
        ) from None
    if bool(torch.isnan(bias).any()) or bool((bias == math.inf).any()):
        raise ValueError("log_prior callable returned NaN or +inf; use -inf to mask.")
    return bias


def _context(T, prior_vec, prior_fn, radius, self_index, inplace):
    key_mask = None
    if prior_vec is not None:
        neg = torch.isneginf(prior_vec)
        key_mask = neg if bool(neg.any()) else None
    return dict(
        T=T, prior_vec=prior_vec, prior_fn=prior_fn, radius=radius, self_index=self_index,
        key_mask=key_mask, inplace=inplace,
    )


def _empty_rows(l, qs, on_empty, radius):
    empty = l <= 0
    if on_empty == "raise" and bool(empty.any()):
        rows = (empty.nonzero().squeeze(1) + qs).tolist()
        hint = f" within {radius}" if radius is not None else ""
        raise ValueError(
            f"{len(rows)} quer{'y has' if len(rows) == 1 else 'ies have'} no unmasked key{hint} "
            f"(first: {rows[:5]}); every key was removed by the masks or priors. Use a larger "
            "radius or fewer masks, or on_empty='zero'."
        )
    return empty


# --------------------------------------------------------------------------- streaming path


def _stream_attention(scorer, Q, V, T, prior_vec, prior_fn, radius, self_index, on_empty, budget, inplace, n_weights,
                      progress=False):
    n_q, n_k, dv = Q.shape[0], scorer.n_keys, V.shape[1]
    item = Q.element_size()
    ctx = _context(T, prior_vec, prior_fn, radius, self_index, inplace)
    argmax = T == 0.0
    uniform = T == math.inf
    # Raw scores are needed for the limits and for masks defined on distances; otherwise one
    # addmm gives the logits (scale and per-key prior folded in) and self-exclusion is masked on
    # them directly. The block is fresh, so masking it in place is safe under autograd too.
    need_raw = argmax or uniform or radius is not None or prior_fn is not None
    query_bytes = item * (2 * dv + 4 + 2 * Q.shape[1]) + (n_weights or 0) * 3 * (2 * item + 8)
    bq, bk = _plan_blocks(
        n_q, n_k, pair_bytes=3 * item + 2 + (radius.pair_bytes(item) if radius else 0),
        query_bytes=query_bytes, budget=budget, device=Q.device, what="dense attention",
        cache_sized=inplace,
    )
    single_block = bk >= n_k and not argmax and not n_weights
    outs, weights, indices = [], [], []
    for qs in track(range(0, n_q, bq), progress, desc="attention", unit="block"):
        qe = min(n_q, qs + bq)
        q = scorer.prepare_queries(Q[qs:qe])
        q_index = torch.arange(qs, qe, device=q.device)[:, None] if prior_fn is not None else None
        if radius is not None:
            radius.start_block(scorer.query_offset(q), qs, qe)
        state = _OnlineSoftmax(qe - qs, dv, q)
        best = torch.full((qe - qs,), _NEG_INF, dtype=q.dtype, device=q.device)  # arg-max limit
        top = _TopK(qe - qs, n_weights, q, with_aux=argmax or uniform) if n_weights else None
        for ks in range(0, n_k, bk):
            ke = min(n_k, ks + bk)
            if need_raw:
                s, bias = _raw_scores(scorer, q, qs, qe, ks, ke, ctx, q_index)
                prior = _block_prior(prior_vec, bias, ks, ke, s)
                if argmax:
                    new_best = torch.maximum(best, s.amax(1))
                    state.reset(new_best > best)
                    best = new_best
                    tie = (s == best[:, None]) & (s > _NEG_INF)
                    aux = prior.expand_as(s)
                    z = torch.where(tie, aux, _NEG_INF)
                    rank = s
                elif uniform:
                    z = aux = torch.where(s > _NEG_INF, prior.expand_as(s), _NEG_INF)
                    rank = s
                else:
                    z = _scaled(s, T) + prior
                    rank, aux = z, None
            else:
                z = scorer.block(q, ks, ke, scale=1.0 / T, log_prior=prior_vec)
                if self_index is not None:
                    z = _mask_self(z, self_index, qs, qe, ks, ke, inplace=True)
                rank, aux = z, None
            if top is not None:
                # Before the in-place exp below: the merge copies what it keeps.
                top.update(rank, ks, aux)
            if single_block:
                state.single(z, V)
            else:
                state.update(z, V[ks:ke], inplace)
        empty = _empty_rows(state.l, qs, on_empty, radius)
        outs.append(state.result())
        if top is not None:
            if argmax:
                logw = torch.where(top.r == best[:, None], top.aux, _NEG_INF)
            elif uniform:
                logw = top.aux
            else:
                logw = top.r
            shift = torch.where(torch.isfinite(state.m), state.m, 0.0)
            w = torch.exp(logw - shift[:, None]) / torch.where(state.l > 0, state.l, 1.0)[:, None]
            w = torch.where(empty[:, None], 0.0, w)
            idx = torch.where(top.r > _NEG_INF, top.i, -1)
            weights.append(torch.where(idx >= 0, w, 0.0))
            indices.append(idx)
    out = torch.cat(outs) if outs else V.new_zeros((0, dv))
    if n_weights is None:
        return (out,)
    return out, _cat_or_empty(weights, (0, n_weights), out), _cat_or_empty(indices, (0, n_weights), out, torch.long)


def _scaled(s, T):
    """s / T. With a learned temperature, masked (-inf) scores are kept out of the product:
    d(s/T)/dT is infinite there and 0 * inf would poison the gradient with NaN."""
    if not isinstance(T, torch.Tensor):
        return s * (1.0 / T)
    masked = torch.isneginf(s)
    return torch.where(masked, 0.0, s).div(T).masked_fill(masked, _NEG_INF)


def _block_prior(prior_vec, bias, ks, ke, s):
    """Log-prior of a block as a tensor broadcastable to ``s`` (0 when there is none)."""
    prior = None if prior_vec is None else prior_vec[None, ks:ke]
    if bias is not None:
        prior = bias if prior is None else prior + bias
    if prior is None:
        prior = s.new_zeros((1, 1))
    return prior


def _cat_or_empty(parts, shape, like, dtype=None):
    if parts:
        return torch.cat(parts)
    return torch.zeros(shape, dtype=dtype or like.dtype, device=like.device)


# --------------------------------------------------------------------------- k-NN path


def _topk_blocks(scorer, Q, k, ctx, budget, query_bytes, what, progress=False):
    """Yield ``(qs, qe, q, q_index, top)`` per query block, ``top`` holding the k best keys.

    Selection runs without autograd; callers recompute what they differentiate.
    """
    n_q, n_k = Q.shape[0], scorer.n_keys
    item = Q.element_size()
    radius = ctx["radius"]
    bq, bk = _plan_blocks(
        n_q, n_k, pair_bytes=3 * item + 2 + (radius.pair_bytes(item) if radius else 0),
        query_bytes=query_bytes + 3 * k * (item + 8) + 2 * item * Q.shape[1],
        budget=budget, device=Q.device, what=what,
    )
    for qs in track(range(0, n_q, bq), progress, desc=what, unit="block"):
        qe = min(n_q, qs + bq)
        q = scorer.prepare_queries(Q[qs:qe])
        q_index = torch.arange(qs, qe, device=q.device)[:, None] if ctx["prior_fn"] is not None else None
        with torch.no_grad():
            qd = q.detach()
            if ctx["radius"] is not None:
                ctx["radius"].start_block(scorer.query_offset(qd), qs, qe)
            top = _TopK(qe - qs, k, qd)
            for ks in range(0, n_k, bk):
                ke = min(n_k, ks + bk)
                s, _ = _raw_scores(scorer, qd, qs, qe, ks, ke, ctx, q_index)
                top.update(s, ks)
        yield qs, qe, q, q_index, top


def _knn_attention(scorer, Q, V, T, prior_vec, prior_fn, radius, self_index, on_empty, budget, inplace, k, n_weights, grad,
                   progress=False):
    dv = V.shape[1]
    ctx = _context(T, prior_vec, prior_fn, radius, self_index, inplace=True)
    gather_bytes = k * Q.element_size() * (dv + (scorer.dim if grad else 0) + 6)
    blocks = _topk_blocks(scorer, Q, k, ctx, budget, gather_bytes, f"k-NN attention with n_neighbors={k}", progress)
    outs, weights, indices = [], [], []
    for qs, qe, q, q_index, top in blocks:
        valid = top.r > _NEG_INF
        idx = torch.where(valid, top.i, -1)
        safe_idx = idx.clamp(min=0)
        # Exact scores: recomputed with the graph when differentiating, else from the selection.
        s = scorer.exact(q, idx) if grad else top.r - scorer.query_offset(q)[:, None]
        s = torch.where(valid, s, _NEG_INF)
        prior = torch.zeros_like(s) if prior_vec is None else prior_vec[safe_idx]
        if prior_fn is not None:
            prior = prior + _call_prior_fn(prior_fn, q_index, safe_idx, s)
        if T == 0.0:
            tie = valid & (s == s.amax(1, keepdim=True))
            z = torch.where(tie, prior, _NEG_INF)
        elif T == math.inf:
            z = torch.where(valid, prior, _NEG_INF)
        else:
            z = torch.where(valid, _scaled(s, T) + prior, _NEG_INF)
        m = z.amax(1, keepdim=True)
        p = torch.exp(z - torch.where(torch.isfinite(m), m, 0.0))
        l = p.sum(1)
        empty = _empty_rows(l, qs, on_empty, radius)
        w = p / torch.where(l > 0, l, 1.0)[:, None]
        out = torch.bmm(w[:, None, :], V[safe_idx]).squeeze(1)
        outs.append(torch.where(empty[:, None], 0.0, out))
        if n_weights is not None:
            weights.append(w[:, :n_weights])
            indices.append(idx[:, :n_weights])
    out = _cat_or_empty(outs, (0, dv), V)
    if n_weights is None:
        return (out,)
    return out, _cat_or_empty(weights, (0, n_weights), out), _cat_or_empty(indices, (0, n_weights), out, torch.long)


# --------------------------------------------------------------------------- SDPA path


def _sdpa_pays(scorer, V):
    # The fused kernels need q, k and v padded to one head size; when the values are much wider
    # than the keys the padding costs more than the kernel saves.
    return V.shape[1] <= 2 * (scorer.dim + 2) + 16


def _sdpa_attention(scorer, Q, V, T, prior_vec, prior_fn, radius, self_index, on_empty, budget, inplace, strict,
                    progress=False):
    keys, offset = scorer.keys, scorer.key_offset
    prior = prior_vec
    if prior is not None and bool(torch.isneginf(prior).any()):
        keep = ~torch.isneginf(prior)
        keys, V, prior = keys[keep], V[keep], prior[keep]
        offset = None if offset is None else offset[keep]
    n_q, dv = Q.shape[0], V.shape[1]
    if keys.shape[0] == 0:
        _empty_rows(Q.new_zeros(n_q), 0, on_empty, radius)
        return (V.new_zeros((n_q, dv)),)
    # Augmented coordinates (THEORY.md section 3): q'.k' / T = (2 q.k - ||k||^2) / T + log p0.
    extra = None
    if offset is not None:
        extra = offset
    if prior is not None:
        extra = prior * T if extra is None else extra + prior * T
    # Scratch: padded copies of the keys and values (n_keys x width each, plus the unmasked
    # keys' copies), and per query its padded row, its output row and the kernel's per-row
    # state. When they do not fit the budget the streaming path (blocks of keys) is used instead.
    d, augmented = keys.shape[1], extra is not None
    width = max(d + augmented, dv)
    width = -(-width // 8) * 8
    item = Q.element_size()
    key_bytes = keys.shape[0] * item * (2 * width + 2 + (d + dv + 1 if keys is not scorer.keys else 0))
    query_bytes = 4 * width * item
    if key_bytes + query_bytes > budget:
        if strict:
            raise MemoryError(
                f"backend='sdpa' needs {(key_bytes + query_bytes) / 2**20:.1f} MiB of scratch memory "
                f"for its padded keys and values but the budget is {budget / 2**20:.1f} MiB; raise "
                "working_memory (skattention.config_context(working_memory=...)) or use backend='stream'."
            )
        return None
    query_block = max(1, min(_SDPA_QUERY_BLOCK, (budget - key_bytes) // query_bytes))
    differentiable = torch.is_grad_enabled() and any(
        torch.is_tensor(t) and t.requires_grad for t in (keys, extra, scorer.coef)
    )
    if differentiable:  # autograd cannot record writes into a preallocated buffer (out=)
        columns = [keys * scorer.coef] + ([extra[:, None].to(keys.dtype)] if augmented else [])
        k_aug = F.pad(torch.cat(columns, 1), (0, width - d - augmented))
    else:  # one buffer: no temporary copy of the keys
        k_aug = keys.new_zeros((keys.shape[0], width))
        torch.mul(keys, scorer.coef, out=k_aug[:, :d])
        if augmented:
            k_aug[:, d] = extra
    del extra
    v_pad = F.pad(V, (0, width - dv))
    outs = []
    try:
        for qs in track(range(0, n_q, query_block), progress, desc="attention", unit="block"):
            q = scorer.prepare_queries(Q[qs : qs + query_block])
            if augmented:
                q = torch.cat([q, torch.ones_like(q[:, :1])], 1)
            q = F.pad(q, (0, width - q.shape[1]))
            with _linear_memory_sdpa():
                o = F.scaled_dot_product_attention(
                    q[None, None], k_aug[None, None], v_pad[None, None], scale=1.0 / T
                )
            outs.append(o[0, 0, :, :dv].contiguous())  # drop the padded columns now
    except RuntimeError:
        if strict:
            raise
        return None  # no O(n)-memory kernel for this device/dtype/shape: use the streaming path
    return (torch.cat(outs) if outs else V.new_zeros((0, dv)),)
