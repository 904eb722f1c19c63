"""A tree of key leaves for the exact k-NN selection at low dimension (torch only).

The keys are sorted along a Morton (Z-order) curve of their quantised coordinates (one sort)
and cut into leaves: the aligned cells of the curve (a linear octree) of at most ``LEAF_KEYS``
keys, compact whatever the density. A perfect binary tree over the leaves in curve order keeps
the bounding box of each node's keys (float64, the keys' own coordinates), which bounds the
squared distance between the node's keys and any box of queries from below.

Queries are processed the same way: sorted along the curve and grouped into aligned cells of at
most ``_GROUP`` queries. A group descends the tree, a few levels a step, keeping the nodes whose
box bound does not exceed the largest upper bound on its queries' k-th nearest ``f`` (the k-th
over keys next to them along the curve), all groups at once: no loop per query or per group.
Each query of a group then takes the k nearest keys of the group's leaves, in (distance, index)
order on exact ``f``. A key of a leaf left out is farther than the bound, so farther than the
k-th nearest and never tied with it: the selection is exact, and the same whatever the other
queries of the call.
"""

import math

import torch

from ._budget import plan_rows
from ._exact import row_packed, sort_exact
from ._masks import query_index
from ._progress import track

# Keys per leaf at most (the curve's cells of more keys are split): small leaves prune finely at
# low dimension; more leaves make the descent longer (docs/performance.md, "The key tree").
LEAF_KEYS = 16
# Queries per group at most (the descent's and the candidates' work is shared by a group).
_GROUP = 16
# Levels of the tree descended per step (children per pair: 2**_STEP_LEVELS), and the level the
# descent starts at (every group against every node there).
_STEP_LEVELS = 3
_START_LEVEL = 6
# Mean keys of the nodes the descent stops at (its candidates).
_NODE_KEYS = 16
# Keys next to a query along the curve whose k-th nearest bounds its k-th nearest, and keys
# from a group's first query whose k-th nearest bound each of its queries'.
_WINDOW_KEYS = 16
_GROUP_WINDOW = 128
# Relative slack of the candidates' fast squared distances (float64, any order of the sum: a
# relative error of at most about (d + 2) eps each way).
_F_SLACK = 1e-12
# Bits spread by one lookup of the curve codes' table.
_SPREAD_BITS = 11
# The tree serves calls of at most this dimension, at least this many keys and queries, and
# keys whose coordinates it can hold (a float64 copy of the keys in curve order, the order and
# the codes: 8 d + 16 bytes a key, plus the leaves' boxes, at most 32 d + 16 bytes a leaf).
MAX_DIM = 10
MIN_KEYS = 4096
MIN_QUERIES = 256
MAX_TREE_ENTRIES = 1 << 25
# Queries sampled to tell whether the tree pays for a call, and the mean fraction of the keys
# whose distances a sampled query computes up to which it does.
_PAY_SAMPLE = 256
PAYS_UP_TO = 0.01
# Scratch bytes per (query, candidate key) entry of a group: the distances and their
# temporaries, and per candidate key of a group: positions and the candidates' packing.
_ENTRY_BYTES = 4 * 8
_CANDIDATE_BYTES = 8 * 8
# Scratch bytes per child box of a descent step, per dimension and fixed.
_CHILD_BYTES_PER_DIM = 6 * 8
_CHILD_BYTES = 48


class KeyTree:
    """The keys of ``prepared`` (a distance kind) in a tree of leaves with bounding boxes.

    Attributes: ``perm`` the original index of the keys in curve order, ``codes`` their curve
    codes, ``coords`` their float64 coordinates (d, n), ``leaf_start`` / ``leaf_size`` each
    leaf's first position in curve order and its number of keys, ``lo`` / ``hi`` the float64
    box corners of the nodes of each level (level ``l``: ``2**l`` nodes; empty padding nodes
    have ``lo = inf``, ``hi = -inf``).
    """

    def __init__(self, prepared, working_memory):
        x = prepared.raw.detach().double()
        n, d = x.shape
        self.n_keys, self.dim = n, d
        self.bits = max(1, min(20, 53 // d))
        self.origin = x.amin(0)
        span = x.amax(0) - self.origin
        self.scale = torch.where(span > 0, (2**self.bits - 1) / span.clamp(min=1e-300), 0.0)
        codes = self.code_of(x)
        # codes below 2**53 sort exactly as float64 (faster than as integers)
        self.perm = torch.sort(codes.double(), stable=True).indices
        self.codes = codes[self.perm]
        self.coords = x[self.perm].T.contiguous()
        starts = aligned_runs(self.codes, LEAF_KEYS, d, self.bits)
        self.leaf_start, self.leaf_size = starts[:-1], starts.diff()
        n_leaves = self.leaf_start.numel()
        self.height = max(0, math.ceil(math.log2(n_leaves)))
        leaf_of = torch.repeat_interleave(torch.arange(n_leaves, device=x.device), self.leaf_size)
        lo = torch.full((1 << self.height, d), math.inf, dtype=torch.float64, device=x.device)
        hi = torch.full_like(lo, -math.inf)
        at = leaf_of[:, None].expand(-1, d)
        keys = self.coords.T
        lo.scatter_reduce_(0, at, keys, "amin")
        hi.scatter_reduce_(0, at, keys, "amax")
        self.lo, self.hi = [lo], [hi]
        for _ in range(self.height):
            lo = lo.view(-1, 2, d).amin(1)
            hi = hi.view(-1, 2, d).amax(1)
            self.lo.insert(0, lo)
            self.hi.insert(0, hi)
        # The descent stops at the level of nodes of about _NODE_KEYS keys (a node's keys are
        # consecutive along the curve): deeper levels cost more steps than they save.
        self.depth = min(self.height, max(0, round(math.log2(max(1, n / _NODE_KEYS)))))
        ends = torch.full((1 << self.height,), n, device=x.device)
        ends[:n_leaves] = self.leaf_start
        self.node_start = ends[:: 1 << (self.height - self.depth)]
        self.node_size = torch.cat([self.node_start[1:], ends[-1:].clone().fill_(n)]) - \
            self.node_start

    @property
    def n_leaves(self):
        return self.leaf_start.numel()

    def code_of(self, x):
        """The curve codes (int64, below 2**53) of float64 points ``x`` (n, d): each
        coordinate's bits spread ``d`` apart by two table lookups, then interleaved."""
        cells = ((x - self.origin) * self.scale).clamp_(0, 2**self.bits - 1).long()
        table = _spread_table(self.dim, x.device)
        low = _SPREAD_BITS
        code = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        for j in range(self.dim):
            c = cells[:, j]
            spread = table[c & ((1 << low) - 1)] | (table[c >> low] << (low * self.dim))
            code |= spread << (self.dim - 1 - j)
        return code

    def upper_bounds(self, prepared, q_raw, codes, k, budget):
        """(b,) float64: the k-th exact f of each query over the keys next to it along the
        curve (at least ``k`` real keys): an upper bound on its k-th nearest."""
        n = self.n_keys
        width = min(n, max(k, _WINDOW_KEYS))
        pos = torch.searchsorted(self.codes, codes)
        start = (pos - width // 2).clamp_(0, n - width)
        window = self.perm[start[:, None] + torch.arange(width, device=pos.device)]
        f = prepared.exact_f(q_raw, window, budget)
        return f.topk(k, dim=1, largest=False, sorted=True).values[:, -1]

    def group_bounds(self, groups, first_codes, k, budget):
        """(n, G) float64 upper bounds on the k-th nearest f of the queries of ``groups`` (n,
        G, d; float64): the k-th over the ``_GROUP_WINDOW`` keys along the curve from the
        first query's place, with the rounding of their fast f (a query whose own window is
        far from it along the curve mostly has its group's keys near it)."""
        width = min(self.n_keys, max(k, _GROUP_WINDOW))
        first = torch.searchsorted(self.codes, first_codes)
        start = (first - _WINDOW_KEYS // 2).clamp_(0, self.n_keys - width)
        out = torch.empty(groups.shape[:2], dtype=torch.float64, device=groups.device)
        chunk = plan_rows(groups.shape[0], budget=budget,
                          row_bytes=groups.shape[1] * width * _ENTRY_BYTES)
        for s in range(0, groups.shape[0], chunk):
            pos = start[s : s + chunk, None] + torch.arange(width, device=groups.device)
            out[s : s + chunk] = self._sq_dists(groups[s : s + chunk], pos).topk(
                k, dim=2, largest=False, sorted=True).values[..., -1]
        return out * (1 + _F_SLACK)

    def leaves_within(self, lo, hi, upper, budget):
        """``(rows, leaves)``: the (box, leaf) pairs whose box-to-box bound is at most the
        box's ``upper`` bound, rows ascending (``lo`` / ``hi``: float64 boxes of queries, b x
        d; a query alone is its own box)."""
        level = min(self.depth, _START_LEVEL)
        rows = torch.arange(lo.shape[0], device=lo.device).repeat_interleave(1 << level)
        nodes = torch.arange(1 << level, device=lo.device).repeat(lo.shape[0])
        rows, nodes = self._kept(lo, hi, upper, rows, nodes, level, budget)
        while level < self.depth:
            step = min(_STEP_LEVELS, self.depth - level)
            level += step
            children = (nodes[:, None] << step) + torch.arange(1 << step, device=lo.device)
            rows = rows.repeat_interleave(1 << step)
            rows, nodes = self._kept(lo, hi, upper, rows, children.view(-1), level, budget)
        return rows, nodes

    def _kept(self, lo, hi, upper, rows, nodes, level, budget):
        """The pairs of ``(rows, nodes)`` (nodes of ``level``) within the rows' bounds, in
        chunks of pairs that fit ``budget``."""
        chunk = plan_rows(None, row_bytes=_CHILD_BYTES + _CHILD_BYTES_PER_DIM * self.dim,
                          budget=budget)
        kept_rows, kept_nodes = [], []
        for start in range(0, rows.numel(), chunk):
            r, c = rows[start : start + chunk], nodes[start : start + chunk]
            keep = box_bound(lo.index_select(0, r), hi.index_select(0, r),
                             self.lo[level].index_select(0, c),
                             self.hi[level].index_select(0, c)) <= upper.index_select(0, r)
            kept_rows.append(r[keep])
            kept_nodes.append(c[keep])
        if len(kept_rows) == 1:
            return kept_rows[0], kept_nodes[0]
        return torch.cat(kept_rows), torch.cat(kept_nodes)

    def nearest(self, prepared, q_raw, k, budget):
        """``(f, idx, computed)``: the exact k nearest keys of raw mapped queries ``q_raw``
        (b, d) in (distance, index) order (float64 f, original key indices) and the mean
        number of keys per query whose distance was computed.

        The queries go in groups (aligned cells of the curve); a group keeps the leaves
        within its box's bound (the largest upper bound of its queries), and each of its
        queries takes the k nearest of their keys (:meth:`_nearest_in`)."""
        b = q_raw.shape[0]
        codes = self.code_of(q_raw.detach().double())
        order = torch.sort(codes.double(), stable=True).indices
        q_raw, codes = q_raw[order], codes[order]
        q = q_raw.detach().double()
        upper = self.upper_bounds(prepared, q_raw, codes, k, budget)
        starts = aligned_runs(codes, _GROUP, self.dim, self.bits)
        slot = torch.arange(_GROUP, device=q.device)
        members = starts[:-1, None] + slot
        members = torch.where(slot < starts.diff()[:, None], members, starts[:-1, None])
        groups = q[members]
        upper = torch.minimum(upper[members],
                              self.group_bounds(groups, codes[starts[:-1]], k, budget))
        rows, leaves = self.leaves_within(groups.amin(1), groups.amax(1), upper.amax(1),
                                          budget)
        f_out = torch.empty((b, k), dtype=torch.float64, device=q.device)
        i_out = torch.empty((b, k), dtype=torch.long, device=q.device)
        computed = 0
        for sel, cand in self._candidates(rows, leaves, members.shape[0], budget):
            f, idx = self._nearest_in(prepared, q_raw, groups[sel], members[sel], cand, k,
                                      budget)
            at = order[members[sel]].view(-1)
            f_out[at], i_out[at] = f.view(-1, k), idx.view(-1, k)
            computed += int((cand >= 0).sum()) * _GROUP
        return f_out, i_out, computed / b

    def _candidates(self, rows, leaves, n_groups, budget):
        """Yield ``(sel, cand)``: groups ``sel`` and the curve positions of their leaves' keys
        (``-1`` padding), groups of similar counts together (to the next power of two) in
        blocks that fit ``budget``."""
        size = self.node_size[leaves]
        counts = torch.zeros(n_groups, dtype=torch.long, device=rows.device).index_add_(
            0, rows, size)
        cls = torch.ceil(torch.log2(counts.clamp(min=1).double())).long()
        for c in torch.unique(cls).tolist():
            in_class = cls == c
            chosen = in_class[rows]
            r, lv, sz = rows[chosen], leaves[chosen], size[chosen]
            first = torch.cumsum(sz, 0) - sz
            pos = (self.node_start[lv] - first).repeat_interleave(sz)
            rep = r.repeat_interleave(sz)
            pos += torch.arange(rep.numel(), device=rows.device)
            sel = in_class.nonzero().squeeze(1)
            local = torch.searchsorted(sel, rep)
            cand = row_packed(local, sel.numel(), pos, fill=(-1,))[0]
            chunk = plan_rows(sel.numel(), budget=budget, row_bytes=cand.shape[1] * (
                _GROUP * _ENTRY_BYTES + _CANDIDATE_BYTES))
            for s in range(0, sel.numel(), chunk):
                yield sel[s : s + chunk], cand[s : s + chunk]

    def _sq_dists(self, groups, pos):
        """(n, G, m) float64 squared distances of the queries of ``groups`` (n, G, d) to the
        keys at curve positions ``pos`` (n, m; ``-1``: padding, ``inf``), summed over the
        dimensions one at a time (a relative error of at most about (d + 2) eps)."""
        safe = pos.clamp(min=0)
        f = None
        for j in range(self.dim):
            diff = groups[:, :, j, None] - self.coords[j][safe][:, None, :]
            f = diff.mul_(diff) if f is None else f.addcmul_(diff, diff)
        return f.masked_fill_((pos < 0)[:, None, :], math.inf)

    def _nearest_in(self, prepared, q_raw, groups, members, pos, k, budget):
        """The k nearest of the queries of some groups (``groups``: their float64 queries, n
        x G x d; ``members`` their rows of ``q_raw``) among the keys at curve positions
        ``pos`` (n, m; ``-1`` padding): (n, G, k) exact f and key indices. The fast f
        (:meth:`_sq_dists`) pick the candidates within ``_F_SLACK`` of each query's k-th;
        their exact f (``PreparedKeys.exact_f``) decide."""
        n, group = groups.shape[0], groups.shape[1]
        f = self._sq_dists(groups, pos).view(n * group, -1)
        kth = f.topk(min(k, f.shape[1]), dim=1, largest=False, sorted=True).values[:, -1]
        rows, cols = (f <= kth[:, None] * (1 + _F_SLACK)).nonzero(as_tuple=True)
        at = pos[rows // group, cols]
        cand = row_packed(rows, n * group, torch.where(at >= 0, self.perm[at.clamp(min=0)], -1),
                          fill=(-1,))[0]
        exact = prepared.exact_f(q_raw.index_select(0, members.view(-1)), cand, budget)
        out_f, out_i = smallest_exact(torch.where(cand >= 0, exact, math.inf), cand, k)
        return out_f.view(n, group, k), out_i.view(n, group, k)

    def pays(self, prepared, queries, k, budget):
        """Whether the tree is expected to pay for a selection of the k nearest of raw
        ``queries``: a sample of them, each alone, keeps leaves of at most ``PAYS_UP_TO`` of
        the keys on average."""
        n_q = queries.shape[0]
        sample = queries[torch.linspace(0, n_q - 1, min(n_q, _PAY_SAMPLE),
                                        device=queries.device).long()].detach()
        point = sample.double()
        upper = self.upper_bounds(prepared, sample, self.code_of(point), k, budget)
        rows, leaves = self.leaves_within(point, point, upper, budget)
        computed = float(self.node_size[leaves].sum()) / sample.shape[0]
        return computed <= PAYS_UP_TO * self.n_keys


def aligned_runs(codes, limit, dim, bits):
    """The boundaries (positions, with ``codes.numel()`` last) of the runs of sorted curve
    ``codes`` that are the largest aligned cells of at most ``limit`` points (the leaves of a
    linear octree); a finest cell of more (duplicated points) is cut every ``limit``."""
    n = codes.numel()
    level = torch.full_like(codes, bits)
    open_ = torch.ones(n, dtype=torch.bool, device=codes.device)
    for lev in range(bits + 1):
        cell = codes >> (dim * (bits - lev))
        _, inverse, counts = torch.unique_consecutive(cell, return_inverse=True,
                                                      return_counts=True)
        small = open_ & (counts[inverse] <= limit)
        level.masked_fill_(small, lev)
        open_ &= ~small
        if not bool(open_.any()):
            break
    cell = codes >> (dim * (bits - level))
    boundary = torch.ones(n, dtype=torch.bool, device=codes.device)
    boundary[1:] = (cell[1:] != cell[:-1]) | (level[1:] != level[:-1])
    run_start = boundary.nonzero().squeeze(1)
    offset = torch.arange(n, device=codes.device) - run_start[torch.cumsum(boundary, 0) - 1]
    boundary |= offset % limit == 0
    end = torch.tensor([n], device=codes.device)
    return torch.cat([boundary.nonzero().squeeze(1), end])


def _spread_table(dim, device):
    """The values ``0 .. 2**_SPREAD_BITS - 1`` with their bits spread ``dim`` apart."""
    v = torch.arange(1 << _SPREAD_BITS, device=device)
    out = torch.zeros_like(v)
    for bit in range(_SPREAD_BITS):
        out |= ((v >> bit) & 1) << (bit * dim)
    return out


def box_bound(lo, hi, node_lo, node_hi):
    """A lower bound on the exact squared distance between any points of the float64 boxes
    ``[lo, hi]`` and ``[node_lo, node_hi]`` (row by row): the boxes' distance, less a relative
    rounding margin (the exact f may sum its squares in another order)."""
    gap = (node_lo - hi).clamp_(min=0) + (lo - node_hi).clamp_(min=0)
    return gap.mul_(gap).sum(1).mul_(1 - 1e-12)


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
    val, pos = f.topk(k, dim=1, largest=False)
    kth = val[:, -1:]
    out_f, out_i = sort_exact(val, index.gather(1, pos), k)
    tied = ((f == kth).sum(1) > (val == kth).sum(1)).nonzero().squeeze(1)
    if tied.numel():
        out_f[tied], out_i[tied] = sort_exact(f[tied], index[tied], k)
    return out_f, out_i


def key_tree(prepared, n_queries, working_memory):
    """The :class:`KeyTree` of prepared keys (remembered on them), or ``None`` where the tree
    cannot serve: keys that require grad or are mapped by a callable, the ``"dot"`` kind, more
    than ``MAX_DIM`` dimensions, too few keys or queries, too many key entries."""
    n, d = prepared.raw.shape
    if (prepared.phi is not None or not prepared.is_distance or prepared.raw.requires_grad
            or d > MAX_DIM or n < MIN_KEYS or n_queries < MIN_QUERIES
            or n * d > MAX_TREE_ENTRIES or not math.isfinite(prepared.max_key_sq)):
        return None
    return prepared.remembered("tree", prepared.raw, lambda: KeyTree(prepared, working_memory))


# Bytes per query of a chunk of the call: its results and a share of the descent's pairs.
_QUERY_BYTES = 4096


def tree_for(spec, k):
    """The key tree of the selection where it applies and is expected to pay: exact k nearest
    of many queries on the CPU, no mask or prior, prepared keys of a distance kind of at most
    ``MAX_DIM`` dimensions (the conditions of the key cells, ``_knn._cells_for``)."""
    if (not spec.prepared or spec.device.type != "cpu" or spec.grad or spec.radius is not None
            or spec.self_index is not None or spec.prior_fn is not None
            or spec.prior_vec is not None or spec.key_mask is not None):
        return None
    tree = key_tree(spec.keys, spec.n_queries, spec.budget / 2**20)
    if tree is None or not tree.pays(spec.keys, spec.keys.map_queries(spec.queries), k,
                                     spec.budget):
        return None
    return tree


def tree_blocks(spec, tree, k, what):
    """``_knn.nearest_blocks`` over the key tree: the queries taken in chunks of the call, in
    curve order within a chunk (neighbouring queries visit the same leaves), and yielded in
    their own order; a query's selection does not depend on its chunk."""
    prepared, Q = spec.keys, spec.queries
    n_q = Q.shape[0]
    chunk = plan_rows(n_q, row_bytes=_QUERY_BYTES + 16 * k, budget=spec.budget)
    for cs in track(range(0, n_q, chunk), spec.progress, total=-(-n_q // chunk), desc=what,
                    unit="block"):
        ce = min(n_q, cs + chunk)
        q_raw = prepared.map_queries(Q[cs:ce]).detach()
        with torch.no_grad():
            f, idx, _ = tree.nearest(prepared, q_raw, k, spec.budget)
        q = prepared.centre(q_raw)
        yield cs, ce, q, query_index(spec, slice(cs, ce), q.device), f, idx
