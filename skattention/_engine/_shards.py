"""Attention over keys split into shards, merged exactly (torch only).

When the keys live in several pieces (a Dask array's partitions, files, machines), each shard
computes a partial result for the same queries and the partials merge with the rules the engine
already uses between its key blocks:

* dense attention (a finite temperature or ``inf``, a radius, per-key priors): the online softmax
  state of each query, its running max ``m``, sum ``l`` of ``exp(z - m)`` and weighted values
  ``o``; states merge by rescaling to the larger max (``_softmax.OnlineSoftmax``);
* a selection (``n_neighbors``, ``temperature=0``, the k-NN prior with a radius): each shard's
  nearest keys in exact (distance, global index) order with their values and log-priors; the
  merge keeps the first ones in that order, and the softmax runs once over the merged
  selection (``_knn.softmax_over_selected``).

So the merged result is the one-call result: the same keys selected (global indices break ties
as in one call), the outputs equal to float rounding. :func:`shard_attention` computes a shard's
:class:`Partial` (NumPy arrays: small, picklable, what a worker sends back),
:func:`merge_partials` combines any number of them (associative: merge on the workers in a
tree, or on the client), :func:`finish_partial` turns the merged one into the outputs and
:func:`partial_neighbors` into ``kneighbors``' distances and indices.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._inputs import make_spec
from ._knn import nearest_blocks, softmax_over_selected
from ._multiplicity import keys_to_select, lightest_weights
from ._results import empty_rows
from ._scores import NEG_INF
from ._stream import stream_attention


@dataclass
class Partial:
    """One shard's (or several merged shards') share of attention for a block of queries.

    ``kind="softmax"``: the online softmax state ``max_z`` (n_queries,), ``total``
    (n_queries,) the sum of ``exp(z - max_z)``, ``weighted`` (n_queries, n_values) the values
    summed with those weights.
    ``kind="nearest"``: ``f`` (n_queries, n) exact pseudo-metric values (float64, ascending,
    ``inf`` for padding), ``index`` global key indices (``-1`` for padding), ``values``
    (n_queries, n, n_values) and ``log_weight`` (n_queries, n; ``None`` without a per-key prior)
    of those keys.
    """

    kind: str
    max_z: np.ndarray = None
    total: np.ndarray = None
    weighted: np.ndarray = None
    f: np.ndarray = None
    index: np.ndarray = None
    values: np.ndarray = None
    log_weight: np.ndarray = None


def is_selection(temperature, n_neighbors):
    """Whether attention with these settings is a selection (merged as nearest keys)."""
    return n_neighbors is not None or float(temperature) == 0.0


def shard_lightest_weights(log_prior, n_neighbors):
    """What a shard sends so that the k-NN prior's selection size can be computed over all
    shards (:func:`selection_size`): its lightest key weights, ascending (NumPy float64)."""
    prior = torch.as_tensor(np.asarray(log_prior, dtype=np.float64))
    return lightest_weights(prior, n_neighbors).numpy()


def selection_size(n_neighbors, lightest=None):
    """How many nearest keys each shard returns for a k-NN prior of ``n_neighbors`` (``None``
    at ``temperature=0``: 1); with per-key priors, from every shard's
    :func:`shard_lightest_weights`, as one call over all keys computes it."""
    if n_neighbors is None:
        return 1
    if lightest is None:
        return int(n_neighbors)
    weights = np.sort(np.concatenate([np.asarray(w, np.float64) for w in lightest]))
    return keys_to_select(torch.as_tensor(weights), n_neighbors)


def shard_attention(
    queries,
    keys,
    values,
    *,
    key_offset=0,
    n_select=None,
    metric="sqeuclidean",
    temperature=1.0,
    n_neighbors=None,
    radius=None,
    log_prior=None,
    device="auto",
    dtype=None,
    working_memory=None,
):
    """One shard's :class:`Partial` of ``attention(queries, all_keys, all_values, ...)``.

    ``keys`` / ``values`` / ``log_prior`` are the shard's rows, which are rows
    ``key_offset, key_offset + 1, ...`` of all keys. ``n_select``: for a selection, how many
    nearest keys to keep (:func:`selection_size`; default ``n_neighbors``, or 1 at
    ``temperature=0``). The other arguments are :func:`attention`'s.
    """
    selection = is_selection(temperature, n_neighbors)
    n_keys = len(keys)
    if selection:
        n_select = selection_size(n_neighbors) if n_select is None else int(n_select)
    spec = make_spec(
        queries, keys, values, metric=metric, temperature=temperature,
        n_neighbors=min(n_select, n_keys) if selection and n_keys else None, radius=radius,
        log_prior=log_prior, exclude_self=False, on_empty="zero", device=device, dtype=dtype,
        working_memory=working_memory,
    )
    with torch.no_grad():
        if not selection:
            max_z, total, weighted = stream_attention(spec, state_only=True)
            return Partial("softmax", max_z=_np(max_z), total=_np(total), weighted=_np(weighted))
        return _nearest_partial(spec, n_select, key_offset)


def _nearest_partial(spec, n_select, key_offset):
    V = spec.values
    n_q = spec.n_queries
    fs, idxs = [], []
    for *_, f, idx in nearest_blocks(spec, spec.n_neighbors, 0, "shard selection"):
        fs.append(f if spec.keys.squared else f.sqrt())  # kneighbors' distances
        idxs.append(idx)
    f = torch.cat(fs) if fs else torch.zeros((n_q, spec.n_neighbors), dtype=torch.float64)
    idx = torch.cat(idxs) if idxs else torch.full((n_q, spec.n_neighbors), -1)
    pad = n_select - f.shape[1]  # a shard with fewer keys than the selection
    if pad > 0:
        f = torch.nn.functional.pad(f, (0, pad), value=math.inf)
        idx = torch.nn.functional.pad(idx, (0, pad), value=-1)
    valid = idx >= 0
    safe = idx.clamp(min=0)
    values = torch.where(valid[:, :, None], V[safe], 0.0)
    log_weight = None
    if spec.prior_vec is not None:
        log_weight = _np(torch.where(valid, spec.prior_vec[safe], NEG_INF))
    return Partial(
        "nearest", f=_np(f), index=_np(torch.where(valid, idx + key_offset, -1)),
        values=_np(values), log_weight=log_weight,
    )


def merge_partials(partials):
    """One :class:`Partial` from the partials of disjoint shards for the same queries."""
    partials = list(partials)
    if not partials:
        raise ValueError("merge_partials needs at least one partial result.")
    kinds = {p.kind for p in partials}
    if len(kinds) != 1:
        raise ValueError(f"cannot merge partial results of different kinds: {sorted(kinds)}.")
    if len(partials) == 1:
        return partials[0]
    if partials[0].kind == "softmax":
        max_z = np.max([p.max_z for p in partials], axis=0)
        shift = np.where(np.isfinite(max_z), max_z, 0.0)
        scales = [np.exp(p.max_z - shift) for p in partials]  # 0 for a shard with no key
        return Partial(
            "softmax", max_z=max_z,
            total=sum(s * p.total for s, p in zip(scales, partials, strict=True)),
            weighted=sum(s[:, None] * p.weighted for s, p in zip(scales, partials, strict=True)),
        )
    n_select = max(p.f.shape[1] for p in partials)
    f = np.concatenate([p.f for p in partials], axis=1)
    index = np.concatenate([p.index for p in partials], axis=1)
    # (f, global index) order, padding last: lexsort's last key is the primary one
    order = np.lexsort((np.where(index >= 0, index, np.iinfo(np.int64).max), f), axis=1)
    order = order[:, :n_select]
    take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
    values = np.concatenate([p.values for p in partials], axis=1)
    has_weight = partials[0].log_weight is not None
    return Partial(
        "nearest", f=take(f), index=take(index),
        values=np.take_along_axis(values, order[:, :, None], axis=1),
        log_weight=take(np.concatenate([p.log_weight for p in partials], axis=1))
        if has_weight else None,
    )


def finish_partial(partial, *, temperature, n_neighbors=None, on_empty="raise", radius=None):
    """The attention outputs (n_queries, n_values) of a merged :class:`Partial`, as
    :func:`attention` with these settings returns them over all keys."""
    if on_empty not in ("raise", "zero"):
        raise ValueError(f"on_empty must be 'raise' or 'zero', got {on_empty!r}.")
    radius_text = None if radius is None else f"radius={radius}"
    if partial.kind == "softmax":
        total = torch.as_tensor(partial.total)
        empty = empty_rows(total, 0, on_empty, radius_text)
        out = torch.as_tensor(partial.weighted) / torch.where(total > 0, total, 1.0)[:, None]
        return _np(torch.where(empty[:, None], 0.0, out))
    values = torch.as_tensor(partial.values)
    s = (-torch.as_tensor(partial.f)).to(values.dtype)
    log_weight = None if partial.log_weight is None else torch.as_tensor(partial.log_weight)
    out, _, _ = softmax_over_selected(
        s, torch.as_tensor(partial.index), values, log_weight, None, float(temperature),
        n_neighbors, lambda total: empty_rows(total, 0, on_empty, radius_text),
    )
    return _np(out)


def partial_neighbors(partial, n_neighbors):
    """``(distances, indices)`` of the ``n_neighbors`` nearest keys from a merged selection, as
    :func:`kneighbors` returns them (pseudo-metric values, ``inf`` / ``-1`` for padding)."""
    if partial.kind != "nearest":
        raise ValueError("partial_neighbors needs the partials of a selection (n_neighbors).")
    return partial.f[:, :n_neighbors], partial.index[:, :n_neighbors]


def _np(t):
    return t.detach().cpu().numpy()
