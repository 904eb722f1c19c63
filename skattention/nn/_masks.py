"""The masks of :class:`MetricAttention` as one additive float mask (torch only).

``attn_mask``, ``key_padding_mask``, ``is_causal`` and a layer's ``prior`` are all an additive
log-prior on the scores (the documentation's theory page), so they are summed into one float
mask, with :class:`torch.nn.MultiheadAttention`'s shapes and meanings.
"""

import torch
import torch.nn.functional as F


def merged_mask(attn_mask, key_padding_mask, is_causal, prior, *, n, num_heads, length,
                src_len, extra_keys, dtype, device):
    """One additive float mask broadcastable to (N, H, L, S + extra_keys), or None.

    ``extra_keys`` keys appended after the ``src_len`` given ones (``add_bias_kv``,
    ``add_zero_attn``) are masked by nothing (0), as ``nn.MultiheadAttention`` pads its masks.
    """
    mask = None
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(length, src_len, dtype=torch.bool, device=device).triu(1)
    if attn_mask is not None:
        attn_mask = as_additive(attn_mask, dtype, "attn_mask")
        if attn_mask.dim() == 2:
            _check_shape(attn_mask, (length, src_len), "attn_mask")
            mask = attn_mask[None, None]
        elif attn_mask.dim() == 3:
            _check_shape(attn_mask, (n * num_heads, length, src_len), "attn_mask")
            mask = attn_mask.view(n, num_heads, length, src_len)
        else:
            raise ValueError(f"attn_mask must be 2-D or 3-D, got {attn_mask.dim()}-D.")
    if key_padding_mask is not None:
        key_padding_mask = as_additive(key_padding_mask, dtype, "key_padding_mask")
        _check_shape(key_padding_mask, (n, src_len), "key_padding_mask")
        kpm = key_padding_mask[:, None, None, :]
        mask = kpm if mask is None else mask + kpm
    if prior is not None:
        table = as_additive(prior(length, src_len, device=device), dtype, "prior")
        table = table if table.dim() == 4 else table[None]
        if table.shape[0] not in (1, n):
            raise ValueError(f"prior is for a batch of {table.shape[0]}, the inputs have {n}.")
        mask = table if mask is None else mask + table
    if mask is not None and extra_keys:
        mask = F.pad(mask, (0, extra_keys))
    return mask


def _check_shape(mask, shape, name):
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(mask.shape)}.")


def as_additive(mask, dtype, name):
    """A boolean mask (True: not allowed) as 0 / -inf, a float one as is, in ``dtype``."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf")
        )
    if not mask.is_floating_point():
        raise TypeError(f"{name} must be bool or float, got {mask.dtype}.")
    return mask.to(dtype)
