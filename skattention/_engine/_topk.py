"""The blockwise top-k merge of the attention backends (torch only): each row's best entries
of a ranking over key blocks, with their key indices."""

import torch

from ._exact import row_packed
from ._scores import NEG_INF

# A block's entries above their row's k-th best are found through the maxima of groups of
# this many columns (a block's rows viewed as (groups' members x groups): one reduction as
# fast as a row maximum, where a comparison of every entry costs about ten times as much on
# the CPU); blocks of fewer than _GROUPED_MIN_COLUMNS columns (or not contiguous) compare
# every entry.
_GROUP_SIZE = 16
_GROUPED_MIN_COLUMNS = 256
# entries of at most this many blocks wait for one merge
_MERGE_BLOCKS = 8
# top_indices of rows of 4 k such groups of columns up to 64 k columns: the k largest entries
# taken among the columns of the k groups whose maxima are largest (below 64 k columns torch's
# CPU top-k selects over every entry with nth_element, about twice as slow per entry as its
# heap above: docs/performance.md)
_TOP_GROUP = 8


class TopK:
    """Blockwise top-k merge of a ranking ``r`` (and an optional companion ``aux``) per row.

    A block's entries above their row's k-th best wait, with those of the next blocks, for one
    merge of several blocks' entries (:data:`_MERGE_BLOCKS`, or sooner where they outnumber
    the state's): a merge is a few dozen small kernels whose fixed costs dominate once few
    rows improve, and entries above a k-th best that a merge has not raised yet only make
    more candidates of it. The state (``r``, ``i``, ``aux``) is merged when read."""

    def __init__(self, n_rows, k, like, with_aux=False):
        self.k = k
        self._r = torch.full((n_rows, k), NEG_INF, dtype=like.dtype, device=like.device)
        self._i = torch.full((n_rows, k), -1, dtype=torch.long, device=like.device)
        self._aux = torch.full_like(self._r, NEG_INF) if with_aux else None
        self.fresh = True
        self._waiting, self._n_waiting = [], 0

    @property
    def r(self):
        self._merge()
        return self._r

    @property
    def i(self):
        self._merge()
        return self._i

    @property
    def aux(self):
        self._merge()
        return self._aux

    def update(self, r, start, aux=None):
        if self.fresh and self._aux is None and r.shape[1] >= self.k:
            # the first block: its top k are the state (a merge with the empty state would
            # only repeat them; a single row's k-NN call has one block); -inf entries keep -1
            self.fresh = False
            self._r, pos = r.topk(self.k, dim=1)
            self._i = torch.where(self._r > NEG_INF, pos + start, -1)
            return
        self.fresh = False
        # Only rows whose block maximum beats their current k-th best can change, and of
        # them only their entries above it (entries equal to it may stay out: they rank no
        # higher); late blocks rarely have any.
        found = _entries_above(r, self._r[:, -1], aux)
        if found is not None:
            rows, local, columns = found
            columns[1] = columns[1] + start
            self._waiting.append((rows.index_select(0, local), columns))
            self._n_waiting += local.numel()
        if len(self._waiting) >= _MERGE_BLOCKS or self._n_waiting > self._r.numel():
            self._merge()

    def _merge(self):
        """Merge the waiting entries into the state: each row's k best of its state and its
        entries, those in the order they came (by block, then by column)."""
        if not self._waiting:
            return
        if len(self._waiting) == 1:
            entry_rows, columns = self._waiting[0]
        else:
            entry_rows = torch.cat([w[0] for w in self._waiting])
            columns = [torch.cat(c) for c in zip(*(w[1] for w in self._waiting))]
            order = torch.argsort(entry_rows, stable=True)
            entry_rows = entry_rows.index_select(0, order)
            columns = [c.index_select(0, order) for c in columns]
        self._waiting, self._n_waiting = [], 0
        rows, local = torch.unique_consecutive(entry_rows, return_inverse=True)
        with_aux = self._aux is not None
        fill = [NEG_INF, -1] + ([NEG_INF] if with_aux else [])
        packed = row_packed(local, rows.numel(), *columns, fill=fill)
        full = rows.numel() == self._r.shape[0]
        state = (self._r, self._i) + ((self._aux,) if with_aux else ())
        old = [t if full else t.index_select(0, rows) for t in state]
        merged_r, order = torch.cat([old[0], packed[0]], 1).topk(self.k, dim=1)
        merged = [merged_r] + [torch.cat([o, p], 1).gather(1, order)
                               for o, p in zip(old[1:], packed[1:])]
        if full:
            self._r, self._i = merged[0], merged[1]
            if with_aux:
                self._aux = merged[2]
        else:
            self._r[rows], self._i[rows] = merged[0], merged[1]
            if with_aux:
                self._aux[rows] = merged[2]


def _entries_above(r, kth, aux):
    """The entries of the block ``r`` above their row's ``kth``: ``(rows, local, columns)``,
    the rows that have any (ascending), each entry's position among them (ascending, and
    within a row by column, as ``nonzero`` gives them), and the columns ``[values, block
    columns]`` (and ``aux``'s values where given); ``None`` where no entry is."""
    n, width = r.shape
    if width < _GROUPED_MIN_COLUMNS or width % _GROUP_SIZE or not r.is_contiguous():
        rows = (r.amax(1) > kth).nonzero().squeeze(1)
        if rows.numel() == 0:
            return None
        full = rows.numel() == n
        # index_select: half the time of advanced indexing for these row gathers
        sub = r if full else r.index_select(0, rows)
        local, cols = (sub > (kth if full else kth.index_select(0, rows))[:, None]).nonzero(
            as_tuple=True)
        flat = local * width + cols
        columns = [sub.reshape(-1).index_select(0, flat), cols]
        if aux is not None:
            sub_aux = aux if full else aux.index_select(0, rows)
            columns.append(sub_aux.reshape(-1).index_select(0, flat))
        return rows, local, columns
    # group g of a row: its columns g, g + span, g + 2 span, ...
    span = width // _GROUP_SIZE
    group_max = r.view(n, _GROUP_SIZE, span).amax(1)
    rows = (group_max.amax(1) > kth).nonzero().squeeze(1)
    if rows.numel() == 0:
        return None
    row_kth = kth.index_select(0, rows)
    at, group = (group_max.index_select(0, rows) > row_kth[:, None]).nonzero(as_tuple=True)
    members = r.view(n, _GROUP_SIZE, span)[rows.index_select(0, at), :, group]
    hit, member = (members > row_kth.index_select(0, at)[:, None]).nonzero(as_tuple=True)
    local = at.index_select(0, hit)
    cols = group.index_select(0, hit) + member * span
    # by row, then by column: the order of the entries' comparison above
    order = torch.argsort(local * width + cols)
    local, cols = local.index_select(0, order), cols.index_select(0, order)
    columns = [members[hit, member].index_select(0, order), cols]
    if aux is not None:
        columns.append(aux[rows.index_select(0, local), cols])
    return rows, local, columns


def top_indices(scores, k):
    """The columns of each row's ``k`` largest ``scores``, largest first: ``topk``'s indices
    (the same set but at ties of the k-th entry; a row's alone). On the CPU from ``4 k``
    groups of :data:`_TOP_GROUP` columns to ``64 k`` columns, taken among the columns of the
    ``k`` groups whose maxima are largest, which hold every entry above the k-th largest
    (such an entry outside them would have ``k`` larger group maxima, each an entry above
    it); a row with fewer than ``k`` entries above ``-inf`` gets ``topk``'s."""
    n, width = scores.shape
    if (not n or scores.device.type != "cpu"
            or not 4 * k * _TOP_GROUP <= width < 64 * k):
        return scores.topk(k, 1).indices
    padded = torch.nn.functional.pad(scores, (0, -width % _TOP_GROUP), value=NEG_INF)
    groups = padded.view(n, -1, _TOP_GROUP).amax(2).topk(k, 1).indices
    columns = (groups[:, :, None] * _TOP_GROUP
               + torch.arange(_TOP_GROUP, device=scores.device)).view(n, -1)
    values, picked = padded.gather(1, columns).topk(k, 1)
    top = columns.gather(1, picked)
    few = values[:, -1].isneginf()  # a padding column may be among such a row's k
    if bool(few.any()):
        top[few] = scores[few].topk(k, 1).indices
    return top
