"""A k-d tree of the keys for the exact k-NN selection at low dimension (torch only).

The keys are split at the median of their widest coordinate, level by level (a batched sort
per level), into ``2**h`` leaves of equal size (padding points at infinity fill the last
ones); every node of the perfect binary tree keeps the bounding box of its keys (float64, the
keys' own coordinates), which bounds the squared distance between its keys and any box of
queries from below.

The k-th exact f of each query over the keys of its node of about ``_GROUP_KEYS`` keys bounds
its k-th nearest; the queries of a larger node form groups of at most ``_GROUP``, and a group
descends the tree, a few levels a step, keeping the nodes whose box bound does not exceed the
largest bound of its queries, all groups at once (no loop per query or per group). Each query
keeps the group's nodes within its own bound and their keys within it, computed once in
``exact_f_of_pairs``'s arithmetic, and takes the k nearest in (distance, index) order. A key
left out is farther than the bound, so farther than the k-th nearest and never tied with it:
the selection is exact, and the same whatever the other queries of the call.
"""

import math

import torch

from ._budget import plan_rows
from ._exact import row_packed, sort_exact
from ._kinds import SEQUENTIAL_DIMS, sequential_squares
from ._parallel import one_thread

# Keys per leaf at least (fewer than twice as many): small leaves prune finely at low
# dimension; more leaves make the descent longer (docs/performance.md, "The key tree").
LEAF_KEYS = 16
# Levels split at the medians of a sample of this many keys a node, and the points a node's
# widest coordinate is estimated on.
_TOP_LEVELS = 8
_TOP_SAMPLE = 128
_SPREAD_SAMPLE = 64
# Keys of the nodes the descent stops at (their keys are the candidates), and of the nodes whose
# keys bound a query's k-th nearest.
_NODE_KEYS = 16
_GROUP_KEYS = 32
# Queries per group at most (the descent's and the candidates' work is shared by a group).
_GROUP = 8
# Levels of the tree descended per step (children per pair: 2**_STEP_LEVELS), and the level the
# descent starts at (every group against every node there).
_STEP_LEVELS = 3
_START_LEVEL = 4
# Relative slack of the bounds on f (the distances are exact f; the slack covers a radius's
# bound and keeps the box bounds' margin on the safe side).
_F_SLACK = 1e-12
# Columns of the final selection's rows at least (rows of fewer candidates share them: one
# top-k over a few more columns costs less than a call per size).
_MIN_CLASS_ENTRIES = 64
# The tree serves calls of at most this dimension, at least this many keys and queries, and
# keys whose coordinates it can hold (a float64 copy of the keys in tree order, their indices,
# and the boxes: about 8 d + 8 + 4 d bytes a key, padding included).
MAX_DIM = 3
MIN_KEYS = 4096
MIN_QUERIES = 256
# ... and at least this many query-key pairs (below, the blocked scan costs about as little).
MIN_PAIRS = 1 << 22
MAX_TREE_ENTRIES = 1 << 25
# Queries sampled to tell whether the tree pays for a call, and the mean fraction of the keys
# whose distances a sampled query computes up to which it does.
_PAY_SAMPLE = 256
PAYS_UP_TO = 0.05
# Scratch bytes per (query, candidate key) entry, per dimension (the differences) and fixed
# (distances, selected entries, key indices), and per candidate key of a group.
_ENTRY_BYTES = 6 * 8
_CANDIDATE_BYTES = 8 * 8
# Scratch bytes per child box of a descent step, per dimension and fixed.
_CHILD_BYTES_PER_DIM = 6 * 8
_CHILD_BYTES = 48


class KeyTree:
    """The keys of ``prepared`` (a distance kind) in a k-d tree with bounding boxes.

    Attributes: ``perm`` the original index of the keys in tree order (``-1``: padding),
    ``blocks`` their float64 coordinates, by node of the descent's last level (nodes, d, w;
    ``inf`` for padding), ``split_dim`` /
    ``split_at`` the splits of each level's nodes, ``lo`` / ``hi`` the float64 box corners of
    the nodes of each level (level ``l``: ``2**l`` nodes of ``N / 2**l`` positions; empty
    nodes have ``lo = inf``, ``hi = -inf``).
    """

    def __init__(self, prepared, working_memory):
        x = prepared.raw.detach().double()
        n, d = x.shape
        self.n_keys, self.dim = n, d
        self.height = max(0, int(math.floor(math.log2(max(1, n // LEAF_KEYS)))))
        top = min(self.height, _TOP_LEVELS, int(math.log2(max(1, n // _TOP_SAMPLE))))
        self.split_dim, self.split_at = [], []
        if top:
            # The top levels split at the medians of a sample (their sorts of every key would
            # cost most of the build); a node then holds about as many keys as its sibling.
            gen = torch.Generator(device=x.device).manual_seed(0)
            sample = x[torch.randperm(n, generator=gen, device=x.device)[: _TOP_SAMPLE << top]]
            self._split(sample.T.contiguous(), torch.arange(sample.shape[0], device=x.device),
                        0, top)
        node = self.node_of(x, top)
        count = torch.bincount(node, minlength=1 << top)
        bottom = self.height - top
        size = (-(-int(count.max()) >> bottom)) << bottom  # positions per top node
        order = torch.sort(node.double(), stable=True).indices
        node = node[order]
        dest = node * size + torch.arange(n, device=x.device) - (torch.cumsum(count, 0)
                                                                  - count)[node]
        # padding positions (key n: a point at infinity) go right at every split and fill the
        # last leaves of their top node
        perm = torch.full((size << top,), n, dtype=torch.long, device=x.device)
        perm[dest] = order
        planes = torch.cat([x.T, x.new_full((d, 1), math.inf)], 1)
        perm = self._split(planes, perm, top, self.height)
        pts = planes[:, perm].T
        perm = torch.where(perm < n, perm, -1)
        self.perm = perm
        leaves = pts.view(1 << self.height, -1, d)
        lo, hi = leaves.amin(1), _finite_max(leaves).nan_to_num_(-math.inf)
        self.lo, self.hi = [lo], [hi]
        for _ in range(self.height):
            lo = lo.view(-1, 2, d).amin(1)
            hi = hi.view(-1, 2, d).amax(1)
            self.lo.insert(0, lo)
            self.hi.insert(0, hi)
        self.depth = self._level_of(_NODE_KEYS)
        # the coordinates of the keys of each node the descent stops at, one row per
        # dimension: a node's keys are one slice, gathered once for all dimensions
        self.blocks = pts.view(1 << self.depth, -1, d).transpose(1, 2).contiguous()

    def _split(self, planes, perm, first, last):
        """``perm`` (positions -> columns of ``planes``, the points' coordinates d x m)
        reordered by the median splits of levels ``first`` to ``last - 1`` (the nodes of a
        level: equal runs of positions), each node split on its widest coordinate (estimated
        on a strided sample of its points); the splits recorded."""
        total = perm.numel()
        flat = planes.reshape(-1)
        for level in range(first, last):
            view = perm.view(1 << level, -1)
            some = view[:, :: max(1, view.shape[1] // _SPREAD_SAMPLE)]
            sample = planes[:, some].permute(1, 2, 0)
            widest = (_finite_max(sample) - sample.amin(1)).nan_to_num_(0.0).argmax(1)
            coord = flat[widest[:, None] * planes.shape[1] + view]
            coord, order = torch.sort(coord, dim=1)
            # the first half of a node's keys (padding, at infinity, sorts last) to the left
            # child and the rest to the right, the padding shared out after them: every
            # node of a level holds nearly the same number of keys
            count = torch.isfinite(coord).sum(1, keepdim=True)
            first = (count + 1) // 2
            half = view.shape[1] // 2
            at = torch.arange(view.shape[1], device=perm.device)
            i = at % half
            source = torch.where(at < half, torch.where(i < first, i, count + i - first),
                                 torch.where(i < count - first, first + i, half + i))
            self.split_dim.append(widest)
            below = coord.gather(1, (first - 1).clamp(min=0))
            self.split_at.append(((below + coord.gather(1, first.clamp(max=2 * half - 1))) / 2)
                                 [:, 0])
            perm = view.gather(1, order.gather(1, source)).view(total)
        return perm

    @property
    def n_positions(self):
        return self.perm.numel()

    def _level_of(self, keys):
        """The deepest level whose nodes hold at least ``keys`` positions (the root if none)."""
        level = self.height
        while level > 0 and self.n_positions >> level < keys:
            level -= 1
        return level

    def node_of(self, q, level):
        """The node of ``level`` that float64 points ``q`` (b, d) fall in, down the splits."""
        node = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        for lev in range(level):
            coord = q.gather(1, self.split_dim[lev][node][:, None])[:, 0]
            node = 2 * node + (coord > self.split_at[lev][node])
        return node

    def group_bounds(self, groups, nodes, level, k, budget):
        """(n, G) float64 upper bounds on the k-th nearest f of the queries of ``groups`` (n,
        G, d; float64): the k-th exact f over the keys of their node ``nodes`` of ``level``
        (at least ``k`` keys), with a margin."""
        width = self.n_positions >> level
        out = torch.empty(groups.shape[:2], dtype=torch.float64, device=groups.device)
        chunk = plan_rows(groups.shape[0], budget=budget,
                          row_bytes=groups.shape[1] * width * (_ENTRY_BYTES + 8 * self.dim))
        for s in range(0, groups.shape[0], chunk):
            out[s : s + chunk] = self._sq_dists(groups[s : s + chunk],
                                                nodes[s : s + chunk, None], level).topk(
                k, dim=2, largest=False, sorted=False).values.amax(2)
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

    def nearest(self, prepared, q_raw, k, budget, cap=math.inf):
        """``(f, idx, computed)``: the exact k nearest keys of raw mapped queries ``q_raw``
        (b, d) in (distance, index) order (float64 f, original key indices) and the mean
        number of keys per query whose distance was computed.

        The queries go in groups (of a node each); a group keeps the nodes within its box's
        bound (the largest upper bound of its queries), and each of its queries takes the k
        nearest of their keys (:meth:`_nearest_in`). ``cap``: an upper bound on the f of the
        keys wanted (a radius squared): nodes and keys beyond it are left out too, and the
        keys beyond the k-th found are padding (``inf``, ``-1``) where fewer are within it."""
        b = q_raw.shape[0]
        q = q_raw.detach().double()
        # each query's bound: the k-th f over the keys of its node of at least _GROUP_KEYS
        # keys and twice k positions (padding is a small share of a node; one short of k keys
        # only loosens its bound)
        fine = min(self._level_of(_GROUP_KEYS), self._level_of(2 * k + LEAF_KEYS))
        home = self.node_of(q, fine)
        bound = self.group_bounds(q[:, None], home, fine, k, budget)[:, 0]
        # groups: the queries of a node large enough that a group fills about half its slots
        # on average (a group's descent is shared by its slots)
        level = min(fine, max(0, int(math.log2(max(1, 2 * b // _GROUP)))))
        home = home >> (fine - level)
        order = torch.sort(home.double(), stable=True).indices
        home = home[order]
        new = torch.ones(b, dtype=torch.bool, device=q.device)
        new[1:] = home[1:] != home[:-1]
        run_start = new.nonzero().squeeze(1)
        offset = torch.arange(b, device=q.device) - run_start[torch.cumsum(new, 0) - 1]
        starts = (new | (offset % _GROUP == 0)).nonzero().squeeze(1)
        sizes = torch.cat([starts[1:], starts.new_tensor([b])]) - starts
        slot = torch.arange(_GROUP, device=q.device)
        real = slot < sizes[:, None]
        members = order[torch.where(real, starts[:, None] + slot, starts[:, None])]
        groups = q[members]
        upper = bound[members].clamp_(max=cap * (1 + _F_SLACK))
        rows, nodes = self.leaves_within(groups.amin(1), groups.amax(1), upper.amax(1),
                                         budget)
        f_out = torch.empty((b, k), dtype=torch.float64, device=q.device)
        i_out = torch.empty((b, k), dtype=torch.long, device=q.device)
        computed = 0
        for sel, cand in self._candidates(rows, nodes, members.shape[0], budget):
            at, f, idx = self._nearest_in(groups[sel], members[sel], real[sel], upper[sel],
                                          cand, k)
            f_out[at], i_out[at] = f, idx
            computed += int((cand >= 0).sum()) * _GROUP
        return f_out, i_out, computed / b

    def _candidates(self, rows, nodes, n_groups, budget):
        """Yield ``(sel, cand)``: groups ``sel`` and their nodes (``-1`` padding), groups of
        similar counts together (to the next power of two) in blocks that fit ``budget``."""
        width = self.n_positions >> self.depth
        counts = torch.bincount(rows, minlength=n_groups)
        cls = torch.ceil(torch.log2(counts.clamp(min=1).double())).long()
        for c in torch.unique(cls).tolist():
            in_class = cls == c
            chosen = in_class[rows]
            sel = in_class.nonzero().squeeze(1)
            local = torch.searchsorted(sel, rows[chosen])
            cand = row_packed(local, sel.numel(), nodes[chosen], fill=(-1,))[0]
            chunk = plan_rows(sel.numel(), budget=budget, row_bytes=cand.shape[1] * _GROUP * (
                width * (_ENTRY_BYTES + 8 * self.dim) + _CANDIDATE_BYTES))
            for s in range(0, sel.numel(), chunk):
                yield sel[s : s + chunk], cand[s : s + chunk]

    def _sq_dists(self, points, nodes, level):
        """(n, P, C * w) exact float64 f of points ``points`` (n, P, d) to the keys of
        ``nodes`` of ``level`` (n, C; ``-1``: padding, ``inf``; w positions a node).

        The arithmetic is ``exact_f_of_pairs``'s (``PreparedKeys.exact_f``) on the same
        float64 values (:func:`_f_of`): each is the exact f every path settles on, bit for
        bit."""
        n, n_p = nodes.shape[0], points.shape[1]
        d, width = self.dim, self.blocks.shape[2]
        keys = self.blocks.view(1 << level, -1, d, width).index_select(
            0, nodes.clamp(min=0).view(-1)).view(n, -1, self.blocks.shape[0] >> level, d, width)
        diff = points.view(n, n_p, 1, 1, d, 1) - keys[:, None]
        f = _f_of(diff, 4)
        padding = (nodes < 0)[:, None, :, None].expand(-1, -1, -1, keys.shape[2] * width)
        return f.view(n, n_p, -1).masked_fill_(padding.reshape(n, 1, -1), math.inf)

    def _nearest_in(self, groups, members, real, upper, cand, k):
        """The k nearest of the queries of some groups (``groups``: their float64 queries, n
        x G x d; ``members`` their rows of the call, ``real`` whether a slot is not padding;
        ``upper`` their bounds, n x G) among the keys of the nodes ``cand`` (n, C; ``-1``
        padding): ``(rows, f, idx)``, the real queries' rows, exact f and key indices in (f,
        index) order. Each query keeps the nodes within its own bound; the distances of their
        keys are the exact f (:meth:`_sq_dists`), so one selection on them decides."""
        n, group = groups.shape[0], groups.shape[1]
        # index_select and flat indices throughout: torch's advanced indexing costs more
        safe = cand.clamp(min=0).view(-1)
        lo = self.lo[self.depth].index_select(0, safe).view(n, 1, -1, self.dim)
        hi = self.hi[self.depth].index_select(0, safe).view(n, 1, -1, self.dim)
        bound = None
        for j in range(self.dim):  # one coordinate at a time: no reduction over a short axis
            q_j = groups[:, :, j, None]
            gap = (lo[..., j] - q_j).clamp_(min=0) + (q_j - hi[..., j]).clamp_(min=0)
            bound = gap.mul_(gap) if bound is None else bound.addcmul_(gap, gap)
        keep = (bound.mul_(1 - 1e-12) <= upper[:, :, None]) & (cand >= 0)[:, None, :]
        keep &= real[:, :, None]
        # the real queries' rows only (a group's padding repeats its first query)
        query = real.view(-1).nonzero().squeeze(1)
        n_rows, n_cand = query.numel(), cand.shape[1]
        kept = keep.view(n * group, -1).index_select(0, query).view(-1).nonzero().squeeze(1)
        rows = kept // n_cand
        pair = query.index_select(0, rows)
        node = cand.view(-1).index_select(0, pair // group * n_cand + kept % n_cand)
        # the exact f of the kept (query, node) pairs only
        f = self._pair_dists(groups.view(n * group, -1).index_select(0, pair), node)
        width = f.shape[1]
        # only keys within a query's bound can be among its k nearest (or within its cap)
        within = (f <= upper.view(-1).index_select(0, pair)[:, None]).view(-1).nonzero()[:, 0]
        at_pair = within // width
        idx = self.perm.index_select(0, node.index_select(0, at_pair) * width + within % width)
        out_f, out_i = _smallest_by_row(rows.index_select(0, at_pair), n_rows,
                                        f.view(-1).index_select(0, within), idx, k)
        return members.view(-1).index_select(0, query), out_f, out_i

    def _pair_dists(self, points, nodes):
        """(P, w) exact float64 f of points ``points`` (P, d) to the keys of their nodes of
        the descent's last level ``nodes`` (P,), as :meth:`_sq_dists` computes them."""
        return _f_of(points[:, :, None] - self.blocks.index_select(0, nodes), 1)

    def pays(self, prepared, queries, k, budget, cap=math.inf):
        """Whether the tree is expected to pay for a selection of the k nearest of raw
        ``queries`` (within ``cap``, as in :meth:`nearest`): a sample of them, each alone,
        keeps nodes of at most ``PAYS_UP_TO`` of the keys on average."""
        n_q = queries.shape[0]
        sample = queries[torch.linspace(0, n_q - 1, min(n_q, _PAY_SAMPLE),
                                        device=queries.device).long()].detach().double()
        level = self._level_of(2 * k + LEAF_KEYS)
        upper = self.group_bounds(sample[:, None], self.node_of(sample, level), level, k,
                                  budget)[:, 0].clamp_(max=cap * (1 + _F_SLACK))
        rows, _ = self.leaves_within(sample, sample, upper, budget)
        computed = rows.numel() / sample.shape[0] * (self.n_positions >> self.depth)
        return computed <= PAYS_UP_TO * self.n_positions


def _f_of(diff, dim):
    """``exact_f_of_pairs``'s sum of the squares of float64 differences ``diff`` (overwritten)
    along ``dim``: in order up to ``SEQUENTIAL_DIMS`` dimensions, else over a contiguous last
    dimension, as it sums them."""
    if diff.shape[dim] <= SEQUENTIAL_DIMS:
        return sequential_squares(diff, dim, inplace=True)
    diff = diff.movedim(dim, -1).contiguous()
    return diff.mul_(diff).sum(-1)


def _finite_max(points):
    """The largest finite coordinates of each node's points (nodes, m, d) (``-inf`` or
    ``nan``-free: padding points are at ``+inf``)."""
    return torch.where(torch.isinf(points), -math.inf, points).amax(1)


def box_bound(lo, hi, node_lo, node_hi):
    """A lower bound on the exact squared distance between any points of the float64 boxes
    ``[lo, hi]`` and ``[node_lo, node_hi]`` (row by row): the boxes' distance, less a relative
    rounding margin (the exact f may sum its squares in another order)."""
    gap = (node_lo - hi).clamp_(min=0) + (lo - node_hi).clamp_(min=0)
    return gap.mul_(gap).sum(1).mul_(1 - 1e-12)


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


def key_tree(prepared, n_queries, working_memory):
    """The :class:`KeyTree` of prepared keys (remembered on them), or ``None`` where the tree
    cannot serve: keys that require grad or are mapped by a callable, the ``"dot"`` kind, more
    than ``MAX_DIM`` dimensions, too few keys, queries or pairs, too many key entries."""
    n, d = prepared.raw.shape
    if (prepared.phi is not None or not prepared.is_distance or prepared.raw.requires_grad
            or d > MAX_DIM or n < MIN_KEYS or n_queries < MIN_QUERIES
            or n * n_queries < MIN_PAIRS
            or n * d > MAX_TREE_ENTRIES or not math.isfinite(prepared.max_key_sq)):
        return None
    return prepared.remembered("tree", prepared.raw, lambda: _built(prepared, working_memory))


def _built(prepared, working_memory):
    """A :class:`KeyTree` built on one thread: its many short kernels would each wait for a
    descheduled thread on a busy machine (docs/performance.md, "The key tree")."""
    with one_thread():
        return KeyTree(prepared, working_memory)
