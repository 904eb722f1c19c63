"""The blockwise top-k merge of the attention backends (torch only): each row's best entries
of a ranking over key blocks, with their key indices."""

import torch

from ._exact import row_packed
from ._scores import NEG_INF


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
        # Only rows whose block maximum beats their current k-th best can change; late blocks
        # rarely do, which makes the merge cheap.
        kth = self.r[:, -1]
        rows = (r.amax(1) > kth).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        full = rows.numel() == r.shape[0]
        # index_select: half the time of advanced indexing for these row gathers
        sub = r if full else r.index_select(0, rows)
        # ... and only their entries above it, packed by row: after the first blocks a row
        # has a few, where a top-k over its whole block row costs several nanoseconds an entry
        # on the CPU (entries equal to the k-th best may stay out: they rank no higher)
        local, cols = (sub > (kth if full else kth.index_select(0, rows))[:, None]).nonzero(
            as_tuple=True)
        flat = local * sub.shape[1] + cols
        columns, fill = [sub.reshape(-1).index_select(0, flat), cols + start], [NEG_INF, -1]
        if self.aux is not None:
            sub_aux = aux if full else aux.index_select(0, rows)
            columns.append(sub_aux.reshape(-1).index_select(0, flat))
            fill.append(NEG_INF)
        packed = row_packed(local, rows.numel(), *columns, fill=fill)
        old_r = self.r if full else self.r.index_select(0, rows)
        old_i = self.i if full else self.i.index_select(0, rows)
        merged_r, order = torch.cat([old_r, packed[0]], 1).topk(self.k, dim=1)
        merged_i = torch.cat([old_i, packed[1]], 1).gather(1, order)
        if self.aux is not None:
            old_a = self.aux if full else self.aux.index_select(0, rows)
            merged_a = torch.cat([old_a, packed[2]], 1).gather(1, order)
        if full:
            self.r, self.i = merged_r, merged_i
            if self.aux is not None:
                self.aux = merged_a
        else:
            self.r[rows], self.i[rows] = merged_r, merged_i
            if self.aux is not None:
                self.aux[rows] = merged_a
