"""The calls the key tree (``_tree.py``) serves: when it applies and pays, and the blocks of
queries over it, with the query's own key and one radius."""

import math

import torch

from ._budget import plan_rows
from ._masks import query_index
from ._parallel import map_blocks, n_workers
from ._progress import track
from ._tree import key_tree, pays

# Bytes per query and key it asks of the tree of a chunk of the call: SciPy's distances and
# indices, their exact f, the order's check and the selection.
_QUERY_KEY_BYTES = 96
# Scratch bytes of a worker's block at most, whatever the budget (its ball queries are
# chunked to it).
_WORKER_SCRATCH = 1 << 26
# Blocks per worker of a chunk, and queries per block at least: a worker that is free takes
# the next block when another is descheduled, and a block's fixed work stays a small part.
_BLOCKS_PER_WORKER = 2
_MIN_BLOCK = 256


def tree_for(spec, k):
    """The key tree of the selection where it applies and is expected to pay: exact k nearest
    on the CPU, no mask or prior but self-exclusion and one radius, keys of a distance kind of
    at most ``MAX_DIM`` dimensions. Keys prepared by ``prepare_keys`` keep their tree for later
    calls; a call's own keys build one for a call of enough queries."""
    if (spec.device.type != "cpu" or spec.grad
            or (spec.radius is not None and spec.radius.radius is None)
            or spec.prior_fn is not None or spec.prior_vec is not None
            or spec.key_mask is not None or k + _own(spec) > spec.keys.n_keys):
        return None
    if not pays(spec.keys.n_keys, k + _own(spec)):
        return None
    return key_tree(spec.keys, spec.n_queries, spec.prepared)


def _own(spec):
    """Keys selected beyond k: one for the query's own key when it is excluded."""
    return int(spec.self_index is not None)


def _cap(spec):
    return math.inf if spec.radius is None else spec.radius.bound


def _excluded(spec, rows, f, idx, k):
    """The k of ``k + 1`` nearest (``f``, ``idx``) of query ``rows`` that remain without each
    query's own key (the last one where its own is not among them; the order is kept), then
    those beyond the radius made padding (they come last)."""
    if spec.self_index is not None:
        own = spec.self_index[rows][:, None]
        drop = (idx == own) & (own >= 0)
        drop[:, -1] |= ~drop.any(1)
        keep = ~drop
        f, idx = f[keep].view(-1, k), idx[keep].view(-1, k)
    if spec.radius is not None:
        inside = spec.radius.inside(f, idx)
        f, idx = f.masked_fill(~inside, math.inf), idx.masked_fill(~inside, -1)
    return f, idx


def tree_blocks(spec, tree, k, query_bytes, what):
    """``_knn.nearest_blocks`` over the key tree: the queries taken in chunks of the call, each
    cut into a few blocks per worker, and yielded in their own order; a query's selection does
    not depend on its chunk or block. ``query_bytes``: what the caller holds per query of a
    chunk it is given (the selected keys' values gathered)."""
    prepared, Q = spec.keys, spec.queries
    n_q, workers = Q.shape[0], n_workers(spec)
    wanted, cap = k + _own(spec), _cap(spec)
    scratch = min(spec.budget // workers, _WORKER_SCRATCH)
    chunk = plan_rows(n_q, row_bytes=_QUERY_KEY_BYTES * (wanted + 1) + query_bytes,
                      budget=spec.budget)
    for cs in track(range(0, n_q, chunk), spec.progress, total=-(-n_q // chunk), desc=what,
                    unit="block"):
        ce = min(n_q, cs + chunk)
        q_raw = prepared.map_queries(Q[cs:ce]).detach()
        # a few blocks per single-threaded worker (docs/performance.md, "Under load"), the
        # budget shared among them
        part = max(_MIN_BLOCK, -(-(ce - cs) // (workers * _BLOCKS_PER_WORKER)))
        parts = list(map_blocks(
            lambda s, q_raw=q_raw, part=part: tree.nearest(
                prepared, q_raw[s : s + part], wanted, scratch, cap),
            range(0, ce - cs, part), workers))
        f, idx = _excluded(spec, torch.arange(cs, ce, device=Q.device),
                           torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), k)
        q = prepared.centre(q_raw)
        yield cs, ce, q, query_index(spec, slice(cs, ce), q.device), f, idx
