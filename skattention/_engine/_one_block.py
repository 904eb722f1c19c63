"""Attention when one key block holds every key (torch only), without the blockwise loop.

* :func:`single_block_attention`: under autograd (a training step, a small differentiated
  call), one softmax over the block with its backward written out
  (:class:`_SingleBlockSoftmax`), pass by pass over cache-sized row chunks, or, for a large
  step, its chunks recomputed (``_recomputed.py``);
* :func:`one_block_attention`: a few queries without a graph (a web service's single row),
  the operations of ``OnlineSoftmax.single``, so each row equals the same row in any batch;
  :func:`few_rows_over_prepared_keys` takes such calls past the spec and the backend choice.
"""

import math

import torch

from ._budget import budget_bytes, cache_row_slices, dense_plan, pair_bytes
from ._distance_logits import distance_logits
from ._first_order import first_order_backward
from ._inputs import check_prepared, checked_log_prior, checked_values, values_for_products
from ._masks import mask_self
from ._parallel import _mkl_threads, rows_single_threaded
from ._recomputed import RecomputedEuclideanSoftmax, chunk_distance_grads
from ._scores import NEG_INF, ROW_MULTIPLE
from ._softmax import flushed_exp, flushed_softmax, rows_times


def single_block_attention(prepared, q, v, scale, log_prior, mask=None):
    """``softmax(logits) @ v`` of queries ``q`` against every key in one block, under autograd,
    or ``None`` where a row could have no unmasked key (the caller's general path handles it).

    A training step is this call plus its backward, and its time goes to passes over the
    (rows x keys) block, which is too large for the caches: :class:`_SingleBlockSoftmax`
    makes each pass over cache-sized row chunks, about a third of the memory traffic of
    autograd's chain of the same operations. ``mask(z, rows)`` masks the logits of the block's
    rows ``rows`` (a slice) in place (self-exclusion).
    """
    if log_prior is not None and bool(torch.isneginf(log_prior).any()):
        return None  # a zero-weight key: a row of such keys alone would have no softmax
    if mask is not None and prepared.n_keys < 2:
        return None
    if prepared.squared:
        z = prepared.logits(q, 0, prepared.n_keys, scale=scale, log_prior=log_prior)
        return _SingleBlockSoftmax.apply(z, None, None, None, v, mask)
    if recomputed_step(prepared.kind, q.shape[0] * prepared.n_keys):
        return RecomputedEuclideanSoftmax.apply(
            q, prepared.keys, prepared.key_offset, prepared.query_offset(q), scale, log_prior,
            v, mask)
    partial = prepared.block(q, 0, prepared.n_keys)
    return _SingleBlockSoftmax.apply(partial, prepared.query_offset(q), scale, log_prior, v, mask)


# From this many (query, key) pairs a training step's block of the "euclidean" kind is never
# stored whole (RecomputedEuclideanSoftmax): the smaller steps of small tables keep the
# products of the whole block (their rounding, their results).
RECOMPUTED_MIN_PAIRS = 1 << 21


def recomputed_step(kind, n_pairs):
    """Whether a training step of ``n_pairs`` (query, key) pairs of a map of ``kind`` takes
    :class:`RecomputedEuclideanSoftmax` (its row chunks on :func:`chunk_workers`)."""
    return kind == "euclidean" and n_pairs >= RECOMPUTED_MIN_PAIRS


def self_mask(own, n_keys):
    """The ``mask`` of :func:`single_block_attention` that excludes key ``own[i]`` from the
    block's row ``i`` (``-1``: none): ``mask(z, rows, fill=-inf)`` sets those entries of the
    block's rows ``rows`` (a slice) to ``fill`` in place (``inf`` for distances)."""
    return lambda z, rows, fill=NEG_INF: mask_self(z, own[rows], slice(None), 0, n_keys,
                                                   inplace=True, fill=fill)


def _outer_rows(a, b, out):
    """``a @ b`` into ``out`` for ``a`` with few columns: one broadcast pass per column, which
    beat BLAS's product of such thin operands when the small steps' softmax was written; they
    keep it (and their bits), though with torch 2.13 BLAS is now the faster here, as the large
    steps use it (docs/performance.md, "Engine design notes")."""
    if a.shape[1] > 8:
        return torch.mm(a, b, out=out)
    torch.mul(a[:, :1], b[0], out=out)
    for c in range(1, a.shape[1]):
        out.addcmul_(a[:, c : c + 1], b[c])
    return out


class _SingleBlockSoftmax(torch.autograd.Function):
    """``softmax(z) @ v`` with ``z`` the given logits (``offset`` None) or, for the
    ``"euclidean"`` kind, ``-scale * sqrt(max(offset - partial, 0)) + prior``; the backward
    written out: ``dz = p * (dO v^T - rowsum(dO * out))``, then the distance's chain rule.
    Both run chunk by chunk of rows; the probabilities ``p`` and distances are kept."""

    @staticmethod
    def forward(ctx, partial, offset, scale, prior, v, mask):
        ctx.scale = None if offset is None else float(scale)
        p = torch.empty_like(partial)
        d = None if offset is None else torch.empty_like(partial)
        v_t = v.T.contiguous()
        out = partial.new_empty((partial.shape[0], v.shape[1]))
        for rows in cache_row_slices(*partial.shape, partial.device):
            z = p[rows]
            if offset is None:
                z.copy_(partial[rows])
            else:
                distance_logits(partial[rows], offset[rows], ctx.scale, prior, d_out=d[rows],
                                z_out=z)
            if mask is not None:
                mask(z, rows)
            z.sub_(z.amax(1, keepdim=True))
            # flushed: subnormal weights slow this pass and the backward many times over
            # (docs/performance.md, "Fit")
            flushed_exp(z, inplace=True)
            z.div_(z.sum(1, keepdim=True))
            # z @ v as v^T's rows against z's: the form BLAS handles well for a few values
            # (docs/performance.md, "Fit")
            torch.nn.functional.linear(z, v_t, out=out[rows])
        ctx.save_for_backward(p, d, v_t, out, scale if isinstance(scale, torch.Tensor) else None)
        return out

    @staticmethod
    @first_order_backward
    def backward(ctx, d_out):
        p, d, v_t, out, scale = ctx.saved_tensors
        need_partial, need_offset, need_scale, need_prior, need_v, _ = ctx.needs_input_grad
        d_v = (d_out.T @ p).T if need_v else None
        # sum_j p_ij (d_out_i . v_j) = d_out_i . out_i: the softmax backward's row term
        row_term = (d_out * out).sum(1, keepdim=True)
        g = torch.empty_like(p)
        d_scale = d_prior = d_offset = None
        if d is not None:
            d_scale = p.new_zeros(()) if need_scale else None
            d_prior = p.new_zeros(p.shape[1]) if need_prior else None
            d_offset = p.new_empty(p.shape[0]) if need_offset else None
        for rows in cache_row_slices(*p.shape, p.device):
            dz = _outer_rows(d_out[rows], v_t, g[rows]).sub_(row_term[rows]).mul_(p[rows])
            if d is None:
                continue
            # dz becomes the partial scores' gradient in place (g's rows)
            chunk_distance_grads(dz, d[rows], ctx.scale, rows, (d_offset, d_scale, d_prior))
        if d is None:
            return g, None, None, None, d_v, None
        if d_scale is not None:
            d_scale = d_scale.reshape(scale.shape)
        return (g if need_partial else None), d_offset, d_scale, d_prior, d_v, None


def few_rows_over_prepared_keys(queries, prepared, values, metric, temperature, log_prior,
                                on_empty, device, dtype, working_memory):
    """Dense attention of a few query rows (a tensor, at most ``ROW_MULTIPLE``: a web
    service's single row) over keys prepared for the ``"euclidean"`` kind (a learned tabular
    metric's predict), computed as the streaming backend computes it when its plan holds every
    key in one block (:func:`one_block_attention`), without the spec and the backend choice of
    the general path (a good part of a single-row call: docs/performance.md, "One row at a
    time"). ``None`` where the general path applies
    (it then checks the arguments and says what is wrong): anything else, a result that is
    not finite."""
    if (prepared.squared or prepared.n_keys == 0 or not isinstance(queries, torch.Tensor)
            or queries.ndim != 2 or on_empty not in ("raise", "zero")
            or (torch.is_grad_enabled() and prepared.keys.requires_grad)
            or not 0 < queries.shape[0] <= ROW_MULTIPLE or queries.requires_grad
            or queries.dtype != prepared.raw.dtype or queries.device != prepared.raw.device
            or queries.shape[1] != prepared.n_features
            or not isinstance(temperature, float) or not 0.0 < temperature < math.inf
            or not isinstance(values, torch.Tensor) or values.requires_grad
            or not (log_prior is None or isinstance(log_prior, torch.Tensor))):
        return None
    n_q, n_k = queries.shape[0], prepared.n_keys
    dev, dt = prepared.raw.device, prepared.raw.dtype
    try:  # any error is the general path's to report, in its order
        check_prepared(prepared, metric, device, dtype)
        V = checked_values(prepared, values, n_k, dev, dt)
        prior_vec, _, key_mask = checked_log_prior(prepared, log_prior, n_k, dev, dt)
        n_values, budget = V.shape[1] if V.ndim == 2 else 1, budget_bytes(working_memory)
        # whether the streaming plan holds these rows and every key in one block: remembered
        # on the keys (the plan's arithmetic is a noticeable part of a single-row call)
        one_block = prepared.remembered(
            "one_block", prepared.raw, lambda: _one_block_plan(n_q, prepared, n_values, budget),
            n_q, n_values, budget)
    except (ValueError, TypeError, MemoryError):
        return None
    if not one_block or key_mask is not None or (
            prior_vec is not None and prior_vec.requires_grad):
        return None
    squeeze, V, values_mm_of = values_for_products(prepared, values, V)
    values_mm = values_mm_of()  # remembered on the keys: built outside inference mode
    # Inference mode: no view or version tracking on the call's dozen ops (docs/performance.md,
    # "One row at a time"). Its tensors stay inside: the result is returned as an ordinary
    # tensor, which autograd may use.
    with torch.inference_mode(), rows_single_threaded(prepared, n_q, V.shape[1]):
        out = one_block_attention(prepared, queries, temperature, prior_vec, values_mm,
                                  V.shape[1])
    if out is None:
        return None
    return (out[:, 0] if squeeze else out).clone()


def _one_block_plan(n_q, prepared, n_values, budget):
    """Whether :func:`dense_plan` of ``n_q`` queries over the prepared keys ``prepared`` puts
    them and every key in one block."""
    item = prepared.raw.element_size()
    _, bq, bk = dense_plan(n_q, prepared.n_keys, prepared.n_features, n_values, pair_bytes(item),
                           None, prepared.raw.device, True, budget, item)
    return bk >= prepared.n_keys and n_q <= bq


def one_block_attention(prepared, Q, T, prior_vec, values_mm, dv):
    """Dense attention of a few queries ``Q`` over every key in one block (a web service's
    single row), without the blockwise loop's machinery (closures, state objects, empty-row
    passes, which weigh on a single-row call): the operations of ``OnlineSoftmax.single``,
    so each row equals the same row in any batch. ``None`` where a result is not finite (an
    empty row, an overflow): the general path then says which."""
    with _mkl_threads(1):
        z = prepared.logits(prepared.prepare_queries(Q), 0, prepared.n_keys, scale=1.0 / T,
                            log_prior=prior_vec)
        out = rows_times(flushed_softmax(z, z.amax(1)), values_mm)[:, :dv]
    # every entry is finite when their sum is (one reduction; a sum that overflows sends the
    # call to the general path, which checks entry by entry)
    return out if math.isfinite(float(out.sum())) else None
