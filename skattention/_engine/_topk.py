"""The blockwise top-k merge of the attention backends (torch only): each row's best entries
of a ranking over key blocks, with their key indices."""

import torch

from ._exact import row_packed
from ._scores import NEG_INF

# A block's entries above their row's k-th best are found through the maxima of groups of
# this many columns (a block's rows viewed as (groups' members x groups): one reduction as
# fast as a row maximum, where a comparison of every entry costs about ten times as much on
# the CPU); blocks of fewer than _GROUPED_MIN_COLUMNS columns compare every entry.
_GROUP_SIZE = 16
_GROUPED_MIN_COLUMNS = 256


class TopK:
    """Blockwise top-k merge of a ranking ``r`` (and an optional companion ``aux``) per row."""

    def __init__(self, n_rows, k, like, with_aux=False):
        self.k = k
        self.r = torch.full((n_rows, k), NEG_INF, dtype=like.dtype, device=like.device)
        self.i = torch.full((n_rows, k), -1, dtype=torch.long, device=like.device)
        self.aux = torch.full_like(self.r, NEG_INF) if with_aux else None
        self.fresh = True

    def update(self, r, start, aux=None):
        if self.fresh and self.aux is None and r.shape[1] >= self.k:
            # the first block: its top k are the state (a merge with the empty state would
            # only repeat them; a single row's k-NN call has one block); -inf entries keep -1
            self.fresh = False
            self.r, pos = r.topk(self.k, dim=1)
            self.i = torch.where(self.r > NEG_INF, pos + start, -1)
            return
        self.fresh = False
        # Only rows whose block maximum beats their current k-th best can change, and of
        # them only their entries above it (entries equal to it may stay out: they rank no
        # higher); late blocks rarely have any, which makes the merge cheap.
        found = _entries_above(r, self.r[:, -1], aux)
        if found is None:
            return
        rows, local, columns = found
        columns[1] = columns[1] + start
        fill = [NEG_INF, -1] + ([NEG_INF] if aux is not None else [])
        packed = row_packed(local, rows.numel(), *columns, fill=fill)
        full = rows.numel() == r.shape[0]
        old = [t if full else t.index_select(0, rows)
               for t in (self.r, self.i) + ((self.aux,) if aux is not None else ())]
        merged_r, order = torch.cat([old[0], packed[0]], 1).topk(self.k, dim=1)
        merged = [merged_r] + [torch.cat([o, p], 1).gather(1, order)
                               for o, p in zip(old[1:], packed[1:])]
        if full:
            self.r, self.i = merged[0], merged[1]
            if aux is not None:
                self.aux = merged[2]
        else:
            self.r[rows], self.i[rows] = merged[0], merged[1]
            if aux is not None:
                self.aux[rows] = merged[2]


def _entries_above(r, kth, aux):
    """The entries of the block ``r`` above their row's ``kth``: ``(rows, local, columns)``,
    the rows that have any (ascending), each entry's position among them (ascending, and
    within a row by column, as ``nonzero`` gives them), and the columns ``[values, block
    columns]`` (and ``aux``'s values where given); ``None`` where no entry is."""
    n, width = r.shape
    if width < _GROUPED_MIN_COLUMNS or width % _GROUP_SIZE:
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
