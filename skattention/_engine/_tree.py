"""The key tree: the exact k nearest keys at low dimension through SciPy's k-d tree.

A k-d tree searched depth first, one query at a time in compiled code (SciPy's ``cKDTree``,
which releases the GIL), visits a few leaves per query at low dimension; the same pruning done
by blocks of torch kernels over many queries at once cost several times more per query than
the whole search (docs/performance.md, "The key tree"). SciPy's tree ranks keys on squared
distances of its own arithmetic, which may round apart from the engine's exact f by a few
units in the last place (another order of sums, fused multiply-adds), and orders ties as it
meets them. So the tree proposes and the exact f decide:

- each query asks for k + 1 keys (those within a cap's distance, a radius, where there is one);
  their exact f (``PreparedKeys.exact_f``) in (f, index) order give the k nearest where the
  k-th is below the largest exact f found by more than the two roundings can move them apart
  (a key left out is then farther than the k-th and never tied with it), or where fewer keys
  were found than asked (every key within the cap was);
- the other queries (ties across the boundary: duplicated keys, integer grids) take every key
  within the k-th's distance (a ball query) and select on the exact f.

The selection is exact, and the same whatever the other queries of the call.
"""

import itertools
import math

import numpy as np
import torch
from scipy.spatial import cKDTree

from ._exact import row_packed, sort_exact

# Keys per leaf of SciPy's tree at most.
LEAF_KEYS = 16
# The tree serves keys of at most this dimension (it won up to 8 dimensions on clustered and
# Gaussian keys, tied at 10 and lost beyond: pruning fades and the blocked scan's products win;
# docs/performance.md, "The key tree"), at least this many keys, calls of at least this many
# queries when the keys are the call's own (the tree is then built for the call; prepared keys
# keep theirs), and keys whose float64 copy it can hold (about 8 d + 8 bytes a key).
MAX_DIM = 8
MIN_KEYS = 4096
MIN_QUERIES = 256
MAX_TREE_ENTRIES = 1 << 25
# The tree pays where a query's k nearest are at most this share of the keys.
PAYS_UP_TO = 0.05
# Relative margin of the exact f above the rounding of the tree's own squared distances (a few
# units in the last place), and of the distances asked of the tree above the exact ones.
_F_SLACK = 1e-12
_DISTANCE_SLACK = 1e-9
# Squared distances below this may be subnormal, whose rounding is not relative: the tree's
# proposals there are checked by a ball query, and its bounds reach this far at least.
_F_FLOOR = 1e-290
# Scratch bytes per key a ball query finds: its index from SciPy and as a tensor, its query
# row, exact f and the rows' packing.
_BALL_ENTRY_BYTES = 96
# Columns of the final selection's rows at least (rows of fewer candidates share them: one
# top-k over a few more columns costs less than a call per size).
_MIN_CLASS_ENTRIES = 64


class KeyTree:
    """The keys of ``prepared`` (a distance kind) in SciPy's k-d tree.

    Attributes: ``points`` the keys' float64 coordinates (NumPy; the tree's data), ``index``
    the ``cKDTree`` over them, ``n_keys`` and ``dim``.
    """

    def __init__(self, prepared):
        self.points = np.ascontiguousarray(prepared.raw.detach().double().cpu().numpy())
        self.n_keys, self.dim = self.points.shape
        self.index = cKDTree(self.points, leafsize=LEAF_KEYS, balanced_tree=False,
                             compact_nodes=False, copy_data=False)

    def nearest(self, prepared, q_raw, k, budget, cap=math.inf):
        """``(f, idx)``: the exact k nearest keys of raw mapped queries ``q_raw`` (b, d) in
        (distance, index) order (float64 f, key indices). ``cap``: an upper bound on the f of
        the keys wanted (a radius squared): keys beyond it may be left out, and padding
        (``inf``, ``-1``) follows the keys found where fewer are within it."""
        b = q_raw.shape[0]
        points = q_raw.detach().double().cpu().numpy()
        wanted = min(k + 1, self.n_keys)
        reach = math.inf if math.isinf(cap) else _reach(cap)
        _, found = self.index.query(points, wanted, distance_upper_bound=reach, workers=1)
        idx = torch.from_numpy(found.reshape(b, wanted)).to(q_raw.device, torch.long)
        idx = idx.masked_fill_(idx >= self.n_keys, -1)
        f = prepared.exact_f(q_raw, idx, budget).masked_fill_(idx < 0, math.inf)
        f, idx = _in_exact_order(f, idx)
        if wanted == k:  # every key found
            return f, idx
        settled = (idx[:, -1] < 0) | (f[:, k - 1] < f[:, -1] * (1 - _F_SLACK) - _F_FLOOR)
        f, idx = f[:, :k], idx[:, :k]
        tied = (~settled).nonzero().squeeze(1)
        if tied.numel():
            f[tied], idx[tied] = self._within(prepared, q_raw, points, tied, f[tied, -1], k,
                                              budget)
        return f, idx

    def _within(self, prepared, q_raw, points, rows, kth, k, budget):
        """The exact k nearest of queries ``rows`` from every key within their k-th exact f
        found (``kth``), in chunks of queries whose keys fit ``budget``."""
        reach = _reach(kth.cpu().numpy())
        rows_np = rows.cpu().numpy()
        lengths = self.index.query_ball_point(points[rows_np], reach, workers=1,
                                              return_length=True)
        # chunks of queries by their keys found (at least one query each)
        limit = max(1, budget // _BALL_ENTRY_BYTES)
        before = np.concatenate([[0], np.cumsum(lengths)])  # keys found by earlier queries
        out_f = kth.new_empty((rows.numel(), k))
        out_i = torch.empty((rows.numel(), k), dtype=torch.long, device=rows.device)
        start = 0
        while start < len(rows_np):
            stop = max(start + 1, int(np.searchsorted(before, before[start] + limit,
                                                      side="right")) - 1)
            balls = self.index.query_ball_point(points[rows_np[start:stop]],
                                                reach[start:stop], workers=1)
            keys = torch.from_numpy(np.fromiter(
                itertools.chain.from_iterable(balls), dtype=np.int64,
                count=int(before[stop] - before[start]))).to(rows.device)
            local = torch.repeat_interleave(
                torch.arange(stop - start, device=rows.device),
                torch.from_numpy(lengths[start:stop].astype(np.int64)).to(rows.device))
            f = prepared.exact_pairs(q_raw, rows[start:stop].index_select(0, local), keys,
                                     budget)
            out_f[start:stop], out_i[start:stop] = _smallest_by_row(local, stop - start, f,
                                                                    keys, k)
            start = stop
        return out_f, out_i


def _reach(f):
    """The distance bound to ask of SciPy's tree for the keys of exact f at most ``f``
    (a float or an array): widened relatively and by ``_F_FLOOR``, beyond both roundings."""
    return np.sqrt(f * (1 + 2 * _DISTANCE_SLACK) + _F_FLOOR)


def _in_exact_order(f, idx):
    """Rows of exact ``f`` and key indices (``inf`` / ``-1`` padding last), found in nearly
    (f, index) order, put in that order: only the rows out of it are sorted."""
    later, earlier = f[:, 1:], f[:, :-1]
    out_of_order = ((later < earlier) | ((later == earlier) & (idx[:, 1:] < idx[:, :-1]))
                    ).any(1).nonzero().squeeze(1)
    if out_of_order.numel():
        f[out_of_order], idx[out_of_order] = sort_exact(f[out_of_order], idx[out_of_order],
                                                        f.shape[1])
    return f, idx


def _smallest_by_row(rows, n_rows, f, index, k):
    """:func:`smallest_exact` of entries ``(rows[e], f[e], index[e])`` (rows ascending), the
    rows packed (:func:`row_packed`) with others of similar counts (to the next power of two):
    the selection's work grows with its columns, padding included."""
    counts = torch.bincount(rows, minlength=n_rows)
    out_f = f.new_empty((n_rows, k))
    out_i = torch.empty((n_rows, k), dtype=torch.long, device=f.device)
    cls = torch.ceil(torch.log2(counts.clamp(min=_MIN_CLASS_ENTRIES).double())).long()
    for c in torch.unique(cls).tolist():
        in_class = cls == c
        sel = in_class.nonzero().squeeze(1)
        chosen = in_class.index_select(0, rows).nonzero().squeeze(1)
        local = (torch.cumsum(in_class, 0) - 1).index_select(0, rows.index_select(0, chosen))
        packed_f, packed_i = row_packed(local, sel.numel(), f.index_select(0, chosen),
                                        index.index_select(0, chosen), fill=(math.inf, -1))
        out_f[sel], out_i[sel] = smallest_exact(packed_f, packed_i, k)
    return out_f, out_i


def smallest_exact(f, index, k):
    """:func:`sort_exact` of rows of exact values ``f`` (``inf`` for padding) and key indices:
    one top-k, and the full sort only for rows where keys tied with the k-th are left out."""
    if f.shape[1] <= k:
        out_f, out_i = sort_exact(f, index, k)
        pad = k - out_f.shape[1]
        if pad:
            out_f = torch.nn.functional.pad(out_f, (0, pad), value=math.inf)
            out_i = torch.nn.functional.pad(out_i, (0, pad), value=-1)
        return out_f, out_i
    val, pos = f.topk(k, dim=1, largest=False, sorted=False)  # sort_exact orders them
    kth = val.amax(1, keepdim=True)
    out_f, out_i = sort_exact(val, index.gather(1, pos), k)
    tied = ((f == kth).sum(1) > (val == kth).sum(1)).nonzero().squeeze(1)
    if tied.numel():
        out_f[tied], out_i[tied] = sort_exact(f[tied], index[tied], k)
    return out_f, out_i


def pays(n_keys, k):
    """Whether the tree is expected to pay for the k nearest of each query among ``n_keys``."""
    return k <= PAYS_UP_TO * n_keys


def key_tree(prepared, n_queries, prepared_by_caller):
    """The :class:`KeyTree` of prepared keys (remembered on them), or ``None`` where the tree
    cannot serve or would not pay its build: keys that require grad, mapped by a callable or
    not on the CPU, the ``"dot"`` kind, more than ``MAX_DIM`` dimensions, too few keys, too
    many key entries, or (keys not ``prepared_by_caller``: built for one call) too few
    queries."""
    n, d = prepared.raw.shape
    if (prepared.phi is not None or not prepared.is_distance or prepared.raw.requires_grad
            or prepared.raw.device.type != "cpu" or d > MAX_DIM or n < MIN_KEYS
            or (n_queries < MIN_QUERIES and not prepared_by_caller)
            or n * d > MAX_TREE_ENTRIES or not math.isfinite(prepared.max_key_sq)):
        return None
    return prepared.remembered("tree", prepared.raw, lambda: KeyTree(prepared))
