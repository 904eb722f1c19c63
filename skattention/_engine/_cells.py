"""Key cells for the k-NN selection: the keys grouped into blocks of nearby keys (torch only).

The keys are clustered by a few Lloyd steps on a sample (``_cluster.kmeans_step``), reordered
cell by cell, and each cell cut into blocks of at most ``CELL_KEYS`` keys; every block keeps a
centre ``c`` and a radius ``r`` (the largest distance of its keys to ``c``, float64). By the
triangle inequality a key ``k`` of the block is at squared distance at least
``max(0, ||q - c|| - r)^2`` from a query ``q``: a block of queries skips a key block when that
bound exceeds, for every query, what its ``k`` nearest can still be (``_knn._select_in_cells``).
The selection stays exact: a skipped key is provably farther than each query's k-th nearest.
On clustered keys most blocks are skipped; on keys without structure (a Gaussian cloud in 32
dimensions) none are, and the selection falls back to the plain loop after its first query
block.
"""

import math

import torch

from ._cluster import kmeans_step, sqdist_to_centers
from ._scores import PreparedKeys

# Keys per cell block: the CPU selection's key block.
CELL_KEYS = 512
# Lloyd steps on a sample of this many keys per cell (the cells need not be good clusters,
# only compact: a few steps on a sample cost a few percent of one large selection).
_SAMPLE_PER_CELL = 32
_LLOYD_STEPS = 6
# Queries sampled to tell whether the cells pay for a call, and the mean fraction of the keys
# a sampled query may not rule out up to which they do.
_PAY_SAMPLE = 128
_PAYS_UP_TO = 0.3
# Cells hold the keys again in cell order (about 3.5 times their memory: the reordered keys
# in the two layouts of a PreparedKeys, and the permutation): not for more than this many key
# entries (about 230 MB more for float32 keys).
MAX_CELL_ENTRIES = 1 << 24
# At most this many cells (their chain holds a square matrix of their distances); a cell of
# more keys is cut into more blocks.
_MAX_CELLS = 1024
# Calls the cells serve: at least this many queries, key blocks and query-key pairs: enough
# selection work that building the cells (once per prepared keys) and telling whether they pay
# (once per call) cost little beside it (docs/performance.md, "Key cells").
MIN_QUERIES = 2048
MIN_BLOCKS = 16
MIN_PAIRS = 1 << 28


class KeyCells:
    """The keys of ``prepared`` (a distance kind, no ``phi``) in cell blocks.

    Attributes: ``keys`` the keys in cell order (a :class:`PreparedKeys` of their own), ``perm``
    the original index of each of them, ``bounds`` the block boundaries (a list, ``n_blocks +
    1`` positions) of blocks of at most ``block_keys`` keys, ``shift`` / ``centres`` /
    ``radii`` the blocks' centres (float64, less ``shift``) and radii (float64),
    ``cell_centres`` the cells' k-means centres (less ``shift``, compute dtype) by which
    queries are grouped. ``working_memory`` (MiB) bounds the scratch of the build.
    """

    def __init__(self, prepared, working_memory):
        raw = prepared.raw.detach()
        n, d = raw.shape
        self.block_keys = CELL_KEYS
        n_cells = min(_MAX_CELLS, max(2, n // CELL_KEYS))
        gen = torch.Generator(device=raw.device).manual_seed(0)
        pick = torch.randperm(n, generator=gen, device=raw.device)[: _SAMPLE_PER_CELL * n_cells]
        sample = raw[pick]
        self.shift = sample.mean(0)
        sample = sample - self.shift
        centres = sample[:n_cells].clone()
        ones = torch.ones(sample.shape[0], dtype=raw.dtype, device=raw.device)
        for _ in range(_LLOYD_STEPS):
            step = kmeans_step(sample, centres, ones, working_memory=working_memory)
            mass = step["mass"][:, None]
            centres = torch.where(mass > 0, step["sums"] / mass.clamp(min=1), centres)
        # cells numbered along a nearest-neighbour chain of their centres: queries sorted by
        # cell then fill a block with neighbouring cells (numbered by k-means alone, a block of
        # a few dozen cells spread over the whole set and needed every key block)
        self.cell_centres = centres[_chain(centres, working_memory)]
        labels = self.cell_of(raw, working_memory)
        self.perm = torch.argsort(labels, stable=True)
        counts = torch.bincount(labels, minlength=n_cells).tolist()
        bounds, start = [], 0
        for count in counts:  # each cell cut into nearly equal blocks of at most block_keys
            pieces = -(-count // self.block_keys)
            bounds.extend(start + count * j // pieces for j in range(pieces))
            start += count
        self.bounds = [*bounds, n]
        self.keys = PreparedKeys(raw[self.perm], prepared.metric, check_finite=False)
        sizes = torch.tensor(
            [b - a for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)],
            device=raw.device,
        )
        block_of = torch.repeat_interleave(torch.arange(sizes.numel(), device=raw.device), sizes)
        shift64 = self.shift.double()
        sums = torch.zeros((sizes.numel(), d), dtype=torch.float64, device=raw.device)
        # float64 copies of keys and their differences, a few within the budget at once
        budget = int(working_memory * 2**20)
        chunk = max(1, budget // (32 * max(1, d)))
        for s in range(0, n, chunk):
            keys = self.keys.raw[s : s + chunk].double() - shift64
            sums.index_add_(0, block_of[s : s + chunk], keys)
        self.centres = sums / sizes[:, None].double()
        self.radii = torch.zeros(sizes.numel(), dtype=torch.float64, device=raw.device)
        for s in range(0, n, chunk):
            keys = self.keys.raw[s : s + chunk].double() - shift64
            dist = (keys - self.centres[block_of[s : s + chunk]]).norm(dim=1)
            self.radii.scatter_reduce_(0, block_of[s : s + chunk], dist, "amax")
        self._centre_sq = (self.centres * self.centres).sum(1)

    @property
    def n_blocks(self):
        return len(self.bounds) - 1

    def pays(self, queries, k, budget):
        """Whether a selection of the k nearest of ``queries`` (raw, the call's order) is
        expected to skip enough keys to pay for the blocks' bounds: for a sample of the
        queries, an upper bound on each one's k-th nearest ``f`` (its k-th exact ``f`` over the
        keys of its nearest blocks) against every block's lower bound; the cells pay when the
        keys a sampled query cannot rule out are at most ``_PAYS_UP_TO`` of all on average
        (clustered keys rule out most, a cloud without clusters none: docs/performance.md,
        "Key cells")."""
        n_q = queries.shape[0]
        sample = queries[torch.linspace(0, n_q - 1, min(n_q, _PAY_SAMPLE),
                                        device=queries.device).long()]
        lower = self.lower_bounds(sample)
        sizes = torch.tensor(self.bounds, dtype=torch.float64, device=sample.device).diff()
        # the nearest blocks (by their bounds) that hold at least k keys
        nearest = torch.argsort(lower, dim=1)
        reach = (torch.cumsum(sizes[nearest], 1) < k).sum(1)
        upper = torch.empty(sample.shape[0], dtype=torch.float64, device=sample.device)
        for i, (blocks, count) in enumerate(zip(nearest.tolist(), reach.tolist(), strict=True)):
            index = torch.cat([torch.arange(self.bounds[j], self.bounds[j + 1])
                               for j in blocks[: count + 1]]).to(sample.device)
            f = self.keys.exact_f(sample[i : i + 1], index[None], budget)[0]
            upper[i] = f.kthvalue(min(k, f.numel())).values
        needed = ((lower <= upper[:, None]).double() @ sizes) / self.keys.n_keys
        return float(needed.mean()) <= _PAYS_UP_TO

    def cell_of(self, points, working_memory):
        """The cell (nearest k-means centre) of each raw point."""
        return kmeans_step(points, self.cell_centres, None, update=False, shift=self.shift,
                           working_memory=working_memory)["labels"]

    def lower_bounds(self, q_raw):
        """(b, n_blocks) float64: a lower bound on the exact squared distance of each raw
        query to every key of each block. The distance to a centre comes from one float64
        product (its rounding error, at most about ``2 (d + 2) eps (||q||^2 + ||c||^2)``,
        is taken off before the square root: the bound stays a bound)."""
        q = q_raw.detach().double() - self.shift.double()
        q_sq = (q * q).sum(1)
        sq = torch.addmm(self._centre_sq, q, self.centres.T, alpha=-2.0).add_(q_sq[:, None])
        err = (4 * q.shape[1] + 8) * torch.finfo(torch.float64).eps * (
            q_sq[:, None] + self._centre_sq)
        dist = (sq - err).clamp_(min=0).sqrt_()
        gap = (dist - self.radii * (1 + 1e-12)).clamp_(min=0)
        return gap.mul_(gap).mul_(1 - 1e-12)


def _chain(points, working_memory):
    """An order of ``points`` (n, d) in which each is the nearest not yet taken to the one
    before (from point 0): nearby points get nearby positions."""
    p = points.double()
    dist = sqdist_to_centers(p, p, working_memory)
    taken = torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)
    order = [0]
    taken[0] = True
    for _ in range(p.shape[0] - 1):
        row = dist[order[-1]].masked_fill(taken, math.inf)
        order.append(int(row.argmin()))
        taken[order[-1]] = True
    return torch.tensor(order, device=p.device)


def key_cells(prepared, n_queries, working_memory):
    """The :class:`KeyCells` of prepared keys (remembered on them), or ``None`` where the cells
    cannot serve: keys that require grad or are mapped by a callable, the ``"dot"`` kind, too
    few keys or queries for the cells to pay, too many key entries to hold twice."""
    n, d = prepared.raw.shape
    if (prepared.phi is not None or not prepared.is_distance or prepared.raw.requires_grad
            or n < MIN_BLOCKS * CELL_KEYS or n_queries < MIN_QUERIES
            or n * n_queries < MIN_PAIRS or n * d > MAX_CELL_ENTRIES
            or not math.isfinite(prepared.max_key_sq)):
        return None
    return prepared.remembered("cells", prepared.raw, lambda: KeyCells(prepared, working_memory))
