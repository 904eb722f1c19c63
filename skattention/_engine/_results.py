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


def backend_result(outs, weights, indices, n_weights, values):
    """A backend's ``(out,)``, or ``(out, weights, indices)`` with ``n_weights``, from the parts
    of its query blocks."""
    # (half-precision values' blocks come in float32, their accumulation dtype)
    out = cat_or_empty(outs, (0, values.shape[1]), values).to(values.dtype)
    if n_weights is None:
        return (out,)
    return (
        out,
        cat_or_empty(weights, (0, n_weights), out),
        cat_or_empty(indices, (0, n_weights), out, torch.long),
    )
