"""The SDPA backend: ``scaled_dot_product_attention`` on augmented coordinates (docs/theory.md,
"Computing it exactly").

Squared-distance scores are dot products of augmented coordinates,

    q' = [q, 1],  k' = [2 k, -||k||^2 + T log p0]:   q'.k' / T = -||q - k||^2 / T + log p0 + c_q

with ``c_q = ||q||^2 / T`` constant along a softmax row, so the fused kernels of
``torch.nn.functional.scaled_dot_product_attention`` compute exact Euclidean attention with a
per-key prior. The engine's dense attention (:func:`sdpa_attention`, restricted to the
O(n)-memory kernels) and ``skattention.nn.MetricAttention`` (batched, per-head temperatures,
masks and dropout) both build their coordinates with :func:`augmented_queries` /
:func:`augmented_keys` and call :func:`scaled_dot_product`.
"""

import contextlib
import threading

import torch
import torch.nn.functional as F

from ._budget import memory_error, plan_rows
from ._first_order import first_order
from ._progress import track
from ._results import empty_rows
from ._scores import padded_rows

# Queries per scaled_dot_product_attention call (its fused kernels need O(n) memory only).
_SDPA_QUERY_BLOCK = 8192
# Query rows per group of the fused CPU kernel (a multiple of its row splits, 32 and up).
_SDPA_ROW_GROUP = 32
# The fused kernels want a head size that is a multiple of 8.
_HEAD_ALIGN = 8

# torch's sdpa_kernel() switches process-wide flags and restores, on exit, what it found on entry:
# two threads inside it at once (joblib's threading backend) can restore each other's restriction
# and leave SDPA's math kernel disabled for the whole process. Every SDPA call of the library
# goes through scaled_dot_product(), which holds this lock.
SDPA_LOCK = threading.RLock()
_LINEAR_MEMORY_KERNELS = (
    torch.nn.attention.SDPBackend.FLASH_ATTENTION,
    torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
)


def scaled_dot_product(q, k, v, *, scale, attn_mask=None, dropout_p=0.0, linear_memory=False,
                       is_causal=False):
    """``F.scaled_dot_product_attention`` under the library's SDPA lock.

    ``linear_memory``: only the O(n)-memory kernels (never the math kernel, which materialises
    the score matrix); a RuntimeError when none accepts the inputs. ``is_causal``: SDPA's own
    causal mask (upper left), which no ``L x S`` array holds.
    """
    # torch.compile traces the call (it cannot trace a lock); its compiled kernels do not go
    # through sdpa_kernel's process-wide flags
    with contextlib.nullcontext() if torch.compiler.is_compiling() else SDPA_LOCK:
        if not linear_memory:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                is_causal=is_causal,
            )
        with torch.nn.attention.sdpa_kernel(list(_LINEAR_MEMORY_KERNELS)):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                is_causal=is_causal,
            )


def augmented_queries(q, width=None):
    """``q' = [q, 1]`` along the last axis, zero-padded to ``width`` columns."""
    q_aug = torch.cat([q, torch.ones_like(q[..., :1])], -1)
    return _pad(q_aug, width)


def augmented_keys(keys, coef, offset, width=None):
    """``k' = [coef k, offset]`` along the last axis, zero-padded to ``width`` columns, so that
    ``[q, 1] . k' = coef q.k + offset``.

    ``offset``: a tensor of trailing size 1, ``None`` (no column), or a function of the keys
    giving it, evaluated after ``coef k`` (autograd then accumulates the keys' gradient in a
    fixed order). Outside autograd the columns are written into one buffer (no temporary copy of
    the keys); autograd cannot record writes into a preallocated buffer, so it gets a
    concatenation.
    """
    d = keys.shape[-1]
    n_cols = d + (offset is not None)
    differentiable = torch.is_grad_enabled() and (
        keys.requires_grad or any(torch.is_tensor(t) and t.requires_grad for t in (offset, coef))
    )
    if differentiable:
        scaled = keys * coef
        if callable(offset):
            offset = offset(keys)
        columns = [scaled] + ([offset.to(keys.dtype)] if offset is not None else [])
        return _pad(torch.cat(columns, -1), width)
    k_aug = keys.new_zeros((*keys.shape[:-1], max(n_cols, width or 0)))
    torch.mul(keys, coef, out=k_aug[..., :d])
    if offset is not None:
        k_aug[..., d:n_cols] = offset(keys) if callable(offset) else offset
    return k_aug


def _pad(x, width):
    if width is None or width == x.shape[-1]:
        return x
    return F.pad(x, (0, width - x.shape[-1]))


def augmented_coordinates(q, k, inv_temperature):
    """Augmented queries and keys whose dot product is ``-||q - k||^2 / T`` up to a row constant.

    Parameters
    ----------
    q : Tensor of shape (..., L, d)
    k : Tensor of shape (..., S, d)
    inv_temperature : Tensor broadcastable to q[..., :1, :1] (e.g. shape (H, 1, 1)) or float

    Returns
    -------
    q_aug : Tensor of shape (..., L, d + 1)
        ``[q - c, 1] / T`` with ``c`` the mean key.
    k_aug : Tensor of shape (..., S, d + 1)
        ``[2 (k - c), -||k - c||^2]``.

    ``q_aug @ k_aug.T == (2 q.k - ||k||^2) / T`` (centred), so a softmax over the last axis equals
    ``softmax(-||q - k||^2 / T)``.
    """
    centre = key_centre(k)
    return centred_queries(q, centre, inv_temperature), centred_keys(k, centre)


def key_centre(k):
    """The common shift of :func:`augmented_coordinates`: the mean key (any shift leaves the
    distances unchanged; the mean key is a good one numerically)."""
    return k.detach().mean(dim=-2, keepdim=True)


def centred_queries(q, centre, inv_temperature):
    """The queries' half of :func:`augmented_coordinates` about ``centre``:
    ``[q - c, 1] / T``."""
    return augmented_queries(q - centre) * inv_temperature


def centred_keys(k, centre):
    """The keys' half of :func:`augmented_coordinates` about ``centre``:
    ``[2 (k - c), -||k - c||^2]``."""
    return augmented_keys(k - centre, 2.0, _minus_squared_norm)


def _minus_squared_norm(k):
    return -(k * k).sum(-1, keepdim=True)


def sdpa_pays(spec):
    """Whether SDPA is worth trying: the fused kernels need q, k and v padded to one head size;
    when the values are much wider than the keys the padding costs more than the kernel saves.
    Not the number of queries: a query's output must not depend on the batch it comes in
    (SDPA and the streaming path round differently), so one query and many take the same path."""
    return spec.values.shape[1] <= 2 * (spec.keys.dim + 2) + 16


def sdpa_attention(spec, strict):
    """``(out,)`` of dense attention with at most a per-key prior, or ``None`` when SDPA cannot
    run it within the budget or on this device/dtype (``strict``: raise instead)."""
    prepared, Q, V, T = spec.keys, spec.queries, spec.values, spec.temperature
    keys, offset, prior = prepared.keys, prepared.key_offset, spec.prior_vec
    if spec.key_mask is not None:
        keep = ~spec.key_mask
        keys, V, prior = keys[keep], V[keep], prior[keep]
        offset = None if offset is None else offset[keep]
    n_q, dv = Q.shape[0], V.shape[1]
    if keys.shape[0] == 0:
        empty_rows(Q.new_zeros(n_q), 0, spec.on_empty, spec.radius)
        return (V.new_zeros((n_q, dv)),)
    # q'.k' / T = (2 q.k - ||k||^2) / T + log p0: the key column is -||k||^2 + T log p0.
    extra = offset
    if prior is not None:
        extra = prior * T if extra is None else extra + prior * T
    d, augmented = keys.shape[1], extra is not None
    width = -(-max(d + augmented, dv) // _HEAD_ALIGN) * _HEAD_ALIGN
    # Scratch: padded copies of the keys and values (n_keys x width each, plus the unmasked
    # keys' copies), and per query its padded row, its output row and the kernel's per-row
    # state. When they do not fit the budget the streaming path (blocks of keys) is used instead.
    item = Q.element_size()
    key_bytes = (
        keys.shape[0] * item * (2 * width + 2 + (d + dv + 1 if keys is not prepared.keys else 0))
    )
    query_bytes = 4 * width * item
    if key_bytes + query_bytes > spec.budget:
        if strict:
            raise memory_error(
                "backend='sdpa'", key_bytes + query_bytes, spec.budget, "use backend='stream'",
                per="for its padded keys and values",
            )
        return None
    query_block = plan_rows(
        n_q, row_bytes=query_bytes, fixed_bytes=key_bytes, budget=spec.budget,
        max_rows=_SDPA_QUERY_BLOCK,
    )
    k_aug = augmented_keys(keys, prepared.coef, extra[:, None] if augmented else None, width)
    del extra
    v_pad = _pad(V, width)
    outs = []
    try:
        for qs in track(range(0, n_q, query_block), spec.progress, desc="attention", unit="block"):
            q = prepared.prepare_queries(Q[qs : qs + query_block])
            q = augmented_queries(q, width) if augmented else _pad(q, width)
            rows = q.shape[0]
            # The CPU kernel rounds a last partial group of rows differently from full ones:
            # full groups keep a query's output independent of the batch it comes in.
            q = padded_rows(q, _SDPA_ROW_GROUP)
            o = scaled_dot_product(
                q[None, None], k_aug[None, None], v_pad[None, None], scale=1.0 / T,
                linear_memory=True,
            )
            outs.append(first_order(o[0, 0, :rows, :dv].contiguous()))  # padding dropped
    except RuntimeError:
        if strict:
            raise
        return None  # no O(n)-memory kernel for this device/dtype/shape: use the streaming path
    return (torch.cat(outs) if outs else V.new_zeros((0, dv)),)
