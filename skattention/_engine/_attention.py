"""Exact, streaming, memory-bounded attention (docs/theory.md): the entry points.

    a_ij = p0_ij exp(s(q_i, k_j) / T) / sum_l p0_il exp(s(q_i, k_l) / T),   out_i = sum_j a_ij v_j

with s = -f the score of a pseudo-metric f and log p0 an additive log-prior (masks are -inf).
:func:`attention` validates its arguments into one ``Spec`` (``_inputs.py``) and dispatches to
one of three backends that compute the same quantity:

* ``_stream.py``: query blocks x key blocks with an online softmax; every prior, both limits,
  the largest weights;
* ``_knn.py``: a blockwise top-k merge selects the ``n_neighbors`` best keys per query (the k-NN
  prior), then a softmax over those; :func:`kneighbors` is its selection alone;
* ``_sdpa.py``: dense attention with a per-key prior through
  ``torch.nn.functional.scaled_dot_product_attention`` on augmented coordinates.
"""

import math

import torch

from ._budget import all_finite
from ._device import accumulation_dtype, dtype_name
from ._inputs import check_weights_count, differentiated, make_spec
from ._knn import knn_attention, nearest_keys
from ._multiplicity import leave_one_unit_out, selection_count
from ._one_block import few_rows_over_prepared_keys
from ._parallel import small_calls_single_threaded
from ._scores import PreparedKeys, overflow_error
from ._sdpa import sdpa_attention, sdpa_pays
from ._stream import shifted_stream_pays, stream_attention

_BACKENDS = ("auto", "stream", "sdpa")


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
    leave_out="key",
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
    metric : str, ("minkowski", p) or callable, default="sqeuclidean"
        ``"sqeuclidean"``: s = -||q - k||^2. ``"euclidean"``: s = -||q - k|| (the non-squared
        distance; keys are selected on squared distances, which order them the same way).
        ``"dot"``: s = q.k. ``"manhattan"``: ``s = -sum_j |q_j - k_j|``. ``("minkowski", p)``
        (``1 <= p < inf``): ``s = -sum_j |q_j - k_j|^p``. ``"cosine"``: s = -(1 - cos(q, k))
        (a zero row is at distance 1). A callable ``phi`` mapping a ``(n, n_features)`` tensor to
        ``(n, d)`` gives s = -||phi(q) - phi(k)||^2.
    temperature : float >= 0 or 0-d Tensor, default=1.0
        ``0`` is the nearest-neighbour limit: all weight on the nearest unmasked key, the
        lowest index among keys at exactly the same distance (1-NN); ``inf`` the uniform limit
        (weights proportional to the prior over unmasked keys). A tensor that requires grad is
        differentiated through.
    n_neighbors : int, default=None
        k-NN prior: only the ``n_neighbors`` best-scoring unmasked keys of each query get weight,
        chosen in (exact distance, index) order: among keys tied at the k-th distance the lower
        index. With a per-key ``log_prior``, ``exp(log_prior)`` is each key's multiplicity: keys
        in that order until their weights add up to ``n_neighbors``, the last contributing the
        remainder (an integer weight acts as that many copies of the key).
    radius : float or (array-like, array-like), default=None
        Radius prior (distance metrics only): only keys within distance ``radius`` get weight
        (``||q - k||^2 <= radius**2``; for the other metrics ``f <= radius``, ``radius**p`` for
        Minkowski's), decided on exact distances: a key at distance exactly ``radius`` is
        kept.
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
    leave_out : {"key", "unit"}, default="key"
        What ``exclude_self`` leaves out: the whole key, or one unit of its weight
        ``w = exp(log_prior)`` (a per-key ``log_prior``), ``max(w - 1, 0)`` of it staying:
        with integer weights as counts of repeated points, the leave-one-out of one copy (in
        a k-NN prior too, where the own key then counts ``w - 1`` units).
    return_weights : bool, default=False
        Also return the largest attention weights of each query and their key indices (with
        a k-NN prior, or at ``temperature=inf`` where every key weighs alike, the nearest
        keys' weights instead: with a per-key ``log_prior`` at ``temperature=inf`` these are
        not necessarily the largest).
    n_weights : int, default=None
        How many weights to return: by default the keys a k-NN prior selects (``n_neighbors``,
        more where a per-key prior gives keys weights below 1), else all keys; at most all keys
        (a k-NN row is padded past its selection).
        Rows are sorted by decreasing weight (by increasing distance with a k-NN prior or at
        ``temperature=inf``, ties by key index); keys of exactly equal weight come in an order
        that does not depend on the batch but is not that of their indices; padding entries
        have weight 0 and index -1.
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
        and a finite positive temperature, and the streaming path otherwise; and the streaming
        path for such attention in float64 on the CPU over more than 16,384 keys, where it is
        faster (the choice never depends on the number of queries).
    progress : int or bool, default=False
        Verbosity: a progress bar over the query blocks (on standard error, tqdm when installed)
        when there are several and the call lasts more than a couple of seconds.

    Returns
    -------
    out : ndarray or Tensor of shape (n_queries,) or (n_queries, n_values)
        NumPy when ``queries`` is not a tensor, else a tensor on the compute device. In the
        compute dtype, except float64 values at ``temperature`` ``inf`` or ``0`` (uniform
        weights over the selected keys, the configurations equal to scikit-learn's neighbour
        estimators): they are averaged, and returned, in float64 whatever the compute dtype,
        as scikit-learn averages float64 targets for float32 inputs.
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
    array([0.5])
    >>> out, w, idx = attention(np.array([[0.2]]), keys, values, temperature=0,
    ...                         return_weights=True, n_weights=2)
    >>> out, idx
    (array([0.]), array([[0, 1]]))
    """
    if leave_out not in ("key", "unit"):
        raise ValueError(f"leave_out must be 'key' or 'unit', got {leave_out!r}.")
    if (isinstance(keys, PreparedKeys) and n_neighbors is None and radius is None
            and exclude_self is False and not return_weights and backend == "auto"):
        out = few_rows_over_prepared_keys(queries, keys, values, metric, temperature,
                                          log_prior, on_empty, device, dtype, working_memory)
        if out is not None:
            return out
    spec = make_spec(
        queries, keys, values, metric=metric, temperature=temperature, n_neighbors=n_neighbors,
        radius=radius, log_prior=log_prior, exclude_self=exclude_self, on_empty=on_empty,
        device=device, dtype=dtype, working_memory=working_memory, progress=progress,
    )
    if leave_out == "unit":
        leave_one_unit_out(spec)
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be 'auto', 'stream' or 'sdpa', got {backend!r}.")
    spec.n_weights = check_weights_count(
        spec, return_weights, n_weights,
        selection_count(spec, spec.n_neighbors) if return_weights and spec.n_neighbors else None)
    spec.grad = differentiated(spec)
    sdpa_ok = _sdpa_applies(spec, backend)
    with torch.set_grad_enabled(spec.grad), small_calls_single_threaded(spec):
        result = _backend_result(spec, backend, sdpa_ok)
    return _returned(spec, result)


def _sdpa_applies(spec, backend):
    """Whether the SDPA backend can compute this attention: dense, with a per-key prior at
    most, a finite positive float temperature, no weights returned (``backend="sdpa"`` where
    it cannot is an error)."""
    T = spec.temperature
    sdpa_ok = (
        spec.keys.squared  # SDPA's augmented coordinates give squared distances only
        and not spec.keys.pairwise  # (and products, not cdist's differences)
        and spec.n_neighbors is None
        and spec.radius is None
        and spec.self_index is None
        and spec.prior_fn is None
        and spec.n_weights is None
        and isinstance(T, float)
        and 0.0 < T < math.inf
    )
    if backend == "sdpa" and not sdpa_ok:
        raise ValueError(
            "backend='sdpa' needs dense attention with a finite positive float temperature, "
            "a per-key log_prior at most, and return_weights=False."
        )
    return sdpa_ok


def _backend_result(spec, backend, sdpa_ok):
    """The result of the backend that computes ``spec``: the k-NN one for a selection
    (``n_neighbors``, ``T = 0``), SDPA where it applies and pays (or is asked for), else the
    streaming one (also where SDPA cannot run this call after all)."""
    T = spec.temperature
    if spec.n_neighbors is not None or (isinstance(T, float) and T == 0.0):
        return knn_attention(spec)
    if sdpa_ok and backend != "stream" and (
        backend == "sdpa" or (sdpa_pays(spec) and not shifted_stream_pays(spec))
    ):
        result = sdpa_attention(spec, strict=backend == "sdpa")
        if result is not None:
            return result
    return stream_attention(spec)


def _non_finite_error(spec, dtype):
    """What overflowed where the output is not finite: the values' weighted sums (values near
    the dtype's largest number: each query's sum of weights times values, before the division
    by the weights' sum, overflows however the weights fall), else the scores at this
    temperature."""
    largest = float(spec.values.abs().amax()) if spec.values.numel() else 0.0
    if largest * spec.n_keys > torch.finfo(accumulation_dtype(spec.values.dtype)).max:
        return overflow_error(
            f"attention produced non-finite values: the values (up to {largest:.3g} in "
            f"absolute value) summed over the keys overflow the compute dtype "
            f"({dtype_name(dtype)})", dtype)
    return overflow_error(
        f"attention produced non-finite values: the scores overflow the compute dtype "
        f"({dtype_name(dtype)}) at this temperature", dtype, by_temperature=True)


def _returned(spec, result):
    """What :func:`attention` returns from a backend's result: checked finite, as the caller's
    values were shaped, NumPy for NumPy queries."""
    out = result[0]
    if not all_finite(out):
        raise _non_finite_error(spec, out.dtype)
    if spec.squeeze:
        out = out[:, 0]
    if spec.n_weights is None:
        return _to_numpy(out) if spec.as_numpy else out
    if spec.as_numpy:
        return tuple(_to_numpy(t) for t in (out, *result[1:]))
    return (out, *result[1:])


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
        ``"sqeuclidean"``, Euclidean ones for ``"euclidean"``, ``-q.k`` for ``"dot"``),
        computed exactly; among equal values the
        lower key index comes first. ``inf`` where fewer keys are unmasked.
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
    if n_neighbors is None:  # attention's n_neighbors may be None, a selection's not
        raise ValueError("n_neighbors must be a positive integer, got None.")
    spec = make_spec(
        queries, keys, None, metric=metric, n_neighbors=n_neighbors, radius=radius,
        log_prior=log_prior, exclude_self=exclude_self, device=device, dtype=dtype,
        working_memory=working_memory, progress=progress,
    )
    with small_calls_single_threaded(spec):
        dist, idx = nearest_keys(spec)
    if spec.as_numpy:
        return _to_numpy(dist), _to_numpy(idx)
    return dist, idx


def _to_numpy(t):
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: the nearest wider type
        t = t.float()
    return t.detach().cpu().numpy()
