"""What a backend returns (torch only): the rows left without a key (``on_empty``), and its
outputs and weights assembled from the parts of its query blocks."""

import torch


def empty_rows(normaliser, qs, on_empty, radius):
    """Rows whose softmax normaliser is 0 (every key masked): ValueError or a mask of them."""
    empty = normaliser <= 0
    if on_empty == "raise" and bool(empty.any()):
        rows = (empty.nonzero().squeeze(1) + qs).tolist()
        hint = f" within {radius}" if radius is not None else ""
        raise ValueError(
            f"{len(rows)} quer{'y has' if len(rows) == 1 else 'ies have'} no unmasked key{hint} "
            f"(first: {rows[:5]}); every key was removed by the masks or priors. Use a larger "
            "radius or fewer masks, or on_empty='zero'."
        )
    return empty


def cat_or_empty(parts, shape, like, dtype=None):
    if parts:
        return torch.cat(parts)
    return torch.zeros(shape, dtype=dtype or like.dtype, device=like.device)


class BlockRows:
    """A backend's ``(out,)``, or ``(out, weights, indices)`` with ``n_weights``, from its query
    blocks, in order (:meth:`add`, then :meth:`result`): each block is written into the rows
    of the whole result as it comes, so the result is held once (blocks kept in a list and
    joined at the end held it twice). Under autograd the blocks are joined (a write into a
    buffer would make the graph copy it)."""

    def __init__(self, n_rows, values, n_weights, grad):
        self.n_rows, self.values, self.n_weights, self.grad = n_rows, values, n_weights, grad
        self.start = 0
        self.parts = None  # (out, weights, indices): whole tensors, or lists under autograd

    def add(self, out, weights=None, indices=None):
        """The next query block's outputs (and tracked weights and their indices)."""
        blocks = (out, weights, indices)[:1 if self.n_weights is None else 3]
        if self.grad:
            self.parts = self.parts or tuple([] for _ in blocks)
            for part, block in zip(self.parts, blocks, strict=True):
                part.append(block)
            return
        if self.parts is None:
            # (half-precision values' blocks come in float32, their accumulation dtype)
            dtypes = (self.values.dtype, *(b.dtype for b in blocks[1:]))
            self.parts = tuple(
                torch.empty((self.n_rows, b.shape[1]), dtype=dtype, device=b.device)
                for b, dtype in zip(blocks, dtypes, strict=True)
            )
        stop = self.start + out.shape[0]
        for whole, block in zip(self.parts, blocks, strict=True):
            whole[self.start:stop] = block
        self.start = stop

    def result(self):
        if self.parts is None:  # no query
            out = self.values.new_zeros((0, self.values.shape[1]))
            if self.n_weights is None:
                return (out,)
            return (out, out.new_zeros((0, self.n_weights)),
                    out.new_zeros((0, self.n_weights), dtype=torch.long))
        if not self.grad:
            return self.parts
        out, *tracked = (torch.cat(part) for part in self.parts)
        return (out.to(self.values.dtype), *tracked)
