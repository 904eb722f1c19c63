"""The blockwise top-k merge of the attention backends (torch only): each row's best entries
of a ranking over key blocks, with their key indices."""

import torch

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
        rows = (r.amax(1) > self.r[:, -1]).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        full = rows.numel() == r.shape[0]
        # index_select: half the time of advanced indexing for these row gathers
        sub = r if full else r.index_select(0, rows)
        val, pos = sub.topk(min(self.k, sub.shape[1]), dim=1)
        old_r = self.r if full else self.r.index_select(0, rows)
        old_i = self.i if full else self.i.index_select(0, rows)
        merged_r, order = torch.cat([old_r, val], 1).topk(self.k, dim=1)
        merged_i = torch.cat([old_i, pos + start], 1).gather(1, order)
        if self.aux is not None:
            sub_aux = aux if full else aux.index_select(0, rows)
            old_a = self.aux if full else self.aux.index_select(0, rows)
            merged_a = torch.cat([old_a, sub_aux.gather(1, pos)], 1).gather(1, order)
        if full:
            self.r, self.i = merged_r, merged_i
            if self.aux is not None:
                self.aux = merged_a
        else:
            self.r[rows], self.i[rows] = merged_r, merged_i
            if self.aux is not None:
                self.aux[rows] = merged_a
