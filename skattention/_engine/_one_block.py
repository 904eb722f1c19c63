"""Attention when one key block holds every key (torch only), without the blockwise loop.

* :func:`single_block_attention`: under autograd (a training step, a small differentiated
  call), one softmax over the block with its backward written out
  (:class:`_SingleBlockSoftmax`), pass by pass over cache-sized row chunks;
* :func:`one_block_attention`: a few queries without a graph (a web service's single row),
  the operations of ``OnlineSoftmax.single``, so each row equals the same row in any batch;
  :func:`few_rows_over_prepared_keys` takes such calls past the spec and the backend choice.
"""

import functools
import math

import torch

from ._budget import budget_bytes, cache_row_slices, dense_plan, pair_bytes
from ._inputs import check_prepared, checked_log_prior, checked_values, values_for_products
from ._masks import mask_self
from ._parallel import _mkl_threads, map_chunk_groups, rows_single_threaded
from ._scores import (
    NEG_INF,
    ROW_MULTIPLE,
    distance_logits,
    distance_logits_grads,
    over_distances,
)
from ._scratch import claim, reusing_buffers, scratch
from ._softmax import LOG2E, flushed_exp, flushed_softmax, rows_times


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
        return _RecomputedEuclideanSoftmax.apply(
            q, prepared.keys, prepared.key_offset, prepared.query_offset(q), scale, log_prior,
            v, mask)
    partial = prepared.block(q, 0, prepared.n_keys)
    return _SingleBlockSoftmax.apply(partial, prepared.query_offset(q), scale, log_prior, v, mask)


# From this many (query, key) pairs a training step's block of the "euclidean" kind is never
# stored whole (_RecomputedEuclideanSoftmax): the smaller steps of small tables keep the
# products of the whole block (their rounding, their results).
RECOMPUTED_MIN_PAIRS = 1 << 21


def recomputed_step(kind, n_pairs):
    """Whether a training step of ``n_pairs`` (query, key) pairs of a map of ``kind`` takes
    :class:`_RecomputedEuclideanSoftmax` (its row chunks on :func:`chunk_workers`)."""
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
    @torch.autograd.function.once_differentiable
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
            _chunk_distance_grads(dz, d[rows], ctx.scale, rows, (d_offset, d_scale, d_prior))
        if d is None:
            return g, None, None, None, d_v, None
        if d_scale is not None:
            d_scale = d_scale.reshape(scale.shape)
        return (g if need_partial else None), d_offset, d_scale, d_prior, d_v, None


def _chunk_distance_grads(dz, d, scale, rows, grads, prescaled=False):
    """The partial scores' gradient of a chunk of rows ``rows`` of a ``"euclidean"`` block
    (``dz``, the logits' gradient, overwritten; ``d`` the distances): the rows' offset
    gradients written into ``grads[0]``, the scale's and prior's parts added to ``grads[1]``
    and ``grads[2]`` (each ``None`` where not needed; :func:`distance_logits_grads`, whose
    ``prescaled`` this is)."""
    d_offset, d_scale, d_prior = grads
    g, offset_rows, scale_part, prior_part = distance_logits_grads(
        dz, d, scale, (True, d_offset is not None, d_scale is not None, d_prior is not None),
        prescaled)
    if d_scale is not None:
        d_scale += scale_part
    if d_prior is not None:
        d_prior += prior_part
    if d_offset is not None:
        d_offset[rows] = offset_rows
    return g


class _RecomputedEuclideanSoftmax(torch.autograd.Function):
    """``softmax(-scale * ||q - k|| + prior) @ v`` of centred queries ``q`` and keys ``k`` (with
    ``key_offset = -||k||^2`` and ``offset = ||q||^2``, the tensors the gradients flow to):
    :class:`_SingleBlockSoftmax` of the ``"euclidean"`` kind without the block in memory. Each
    cache-sized chunk of rows computes its squared distances itself, one product of ``[2q, 1,
    ||q||^2]`` and ``[-k, ||k||^2, 1]``, and the backward computes a chunk's distances and
    weights again from the products and the rows' kept shift and sum (flash attention's
    recomputation): a large step's passes over its block stay in the cache instead of going
    through memory, at the cost of one more product per chunk.

    Few passes over a chunk: without a prior the rows' largest logit is their nearest key's
    (``-scale`` times the least distance), so the logits less it are one pass from the
    distances; the weights are never divided by their row's sum (the rows' outputs and
    gradient factors are), the backward's factor ``scale / 2`` of the distances' chain rule is
    folded into those factors too, and the logits' gradient comes from one product of the
    factors with the values and a column of ones; its division by the distances is applied to
    the weights first, so the chunk's passes need two buffers (kept from step to step within a
    training loop: :func:`reused_buffers`).

    Within a training loop (:func:`reused_buffers`) the forward keeps the block's distances
    in a buffer reused from step to step, and its backward (if no other call has claimed
    that buffer since) computes the weights from them, without the product and the square
    root again: the same numbers, one (rows x keys) write and read instead of a product.

    The chunks are cut into :data:`CHUNK_GROUPS` runs, each computed on one thread, on the
    workers of :func:`chunk_workers` where the caller set them: the keys' gradient is the sum
    of the runs' sums in their order, whatever the number of workers."""

    @staticmethod
    def forward(ctx, q, keys, key_offset, offset, scale, prior, v, mask):
        ctx.scale, ctx.mask = float(scale), mask
        n, dim = q.shape
        # [2q, 1, ||q||^2] . [-k, ||k||^2, 1] = ||q - k||^2
        q_rows = q.new_empty((n, dim + 2))
        torch.mul(q.detach(), 2.0, out=q_rows[:, :dim])
        q_rows[:, dim] = 1.0
        q_rows[:, dim + 1] = offset.detach()
        k_rows = keys.new_empty((keys.shape[0], dim + 2))
        torch.neg(keys.detach(), out=k_rows[:, :dim])
        torch.neg(key_offset.detach(), out=k_rows[:, dim])
        k_rows[:, dim + 1] = 1.0
        # the logits in base 2 (LOG2E folded into the scale and the prior: flushed_exp's
        # base2)
        prior = None if prior is None else prior.detach() * LOG2E
        v_t = v.detach().T.contiguous()
        groups = _chunk_groups(n, keys.shape[0], q.device)
        buffers = [scratch(("recomputed", g, 0), (chunks[0].stop - chunks[0].start,
                                                  keys.shape[0]), q)
                   for g, chunks in enumerate(groups)]
        # within a training loop the distances are kept for the backward (a buffer reused
        # from step to step): it then skips their product and square root
        kept = (scratch(_KEPT_DISTANCES, (n, keys.shape[0]), q)
                if reusing_buffers() and any(ctx.needs_input_grad) else None)
        ctx.kept = None if kept is None else (kept, claim(_KEPT_DISTANCES))
        out = q.new_empty((n, v.shape[1]))
        shift, row_sum = q.new_empty((n, 1)), q.new_empty((n, 1))

        def run(group):  # each run writes its own rows
            for rows in groups[group]:
                e = buffers[group][:rows.stop - rows.start]
                d = e if kept is None else kept[rows]
                _RecomputedEuclideanSoftmax._exp(e, d, q_rows[rows], k_rows, ctx.scale, prior,
                                                 mask, rows, shift[rows], first=True)
                torch.sum(e, 1, keepdim=True, out=row_sum[rows])
                torch.nn.functional.linear(e, v_t, out=out[rows])

        map_chunk_groups(run, len(groups))
        out.div_(row_sum)
        ctx.save_for_backward(q_rows, k_rows, prior, v_t, out, shift, row_sum,
                              scale if isinstance(scale, torch.Tensor) else None)
        return out

    @staticmethod
    def _exp(e, d, q_rows, k_rows, scale, prior, mask, rows, shift, first=False,
             distances=False):
        """The unnormalised weights ``exp(logit - shift)`` of a chunk's rows into ``e`` and
        their distances into ``d`` (``e`` itself in the forward without kept distances), or
        from them where ``d`` holds them already (``distances``: those the forward kept). The
        rows' ``shift`` (their largest logit, in base 2 as the logits and ``prior`` are here)
        is set by the forward (``first``) and used by the backward."""
        scale2 = scale * LOG2E
        if distances:
            distances = d
        else:
            squared = torch.mm(q_rows, k_rows.T, out=d)
            if mask is not None:
                mask(squared, rows, math.inf)
            if prior is None and first:
                torch.amin(squared, 1, keepdim=True, out=shift)
                shift.clamp_(min=0).sqrt_().mul_(scale2)
            # a masked key's distance finite (no 0 * inf in the scale's gradient), its weight 0
            distances = squared.clamp_(min=0, max=torch.finfo(e.dtype).max).sqrt_()
        if prior is None:  # the nearest key's logit, -scale * its distance, is the largest
            z = torch.add(shift, distances, alpha=-scale2, out=e)
        else:
            z = torch.add(prior, distances, alpha=-scale2, out=e)
            if first:
                torch.amax(z, 1, keepdim=True, out=shift)
            z.sub_(shift)
        return flushed_exp(z, inplace=True, base2=True)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        q_rows, k_rows, prior, v_t, out, shift, row_sum, scale = ctx.saved_tensors
        need_q, need_keys, need_key_offset, need_offset, need_scale, need_prior, need_v, _ = (
            ctx.needs_input_grad)
        n, dim = q_rows.shape[0], q_rows.shape[1] - 2
        n_keys = k_rows.shape[0]
        # With e the unnormalised weights and s their row sums, p = e / s and the logits'
        # gradient is p * (d_out v^T - rowsum(d_out * out)); the partial scores' chain rule
        # then divides by the distances and multiplies by scale / 2. Both factors of a row
        # are applied to its (rows x values) terms, not to the (rows x keys) block, and the
        # row sum's term enters the product with the values as a column of ones.
        half_scale = 0.5 * ctx.scale
        d_out_s = d_out / row_sum
        row_terms = torch.cat([d_out_s * half_scale,
                               (d_out * out).sum(1, keepdim=True) / row_sum * -half_scale], 1)
        v_ones = torch.cat([v_t, v_t.new_ones((1, n_keys))])
        q2, minus_keys = q_rows[:, :dim], k_rows[:, :dim]
        # the scale's and the prior's gradients need the logits' gradient apart: a third buffer
        apart = need_scale or need_prior
        groups = _chunk_groups(n, n_keys, q_rows.device)
        # the forward's distances, unless another call has taken their buffer since
        kept = ctx.kept[0] if ctx.kept is not None and ctx.kept[1].release() else None
        buffers = [[scratch(("recomputed", g, i), (chunks[0].stop - chunks[0].start, n_keys),
                            q_rows) for i in range(3 if apart else 2)]
                   for g, chunks in enumerate(groups)]
        d_q = q_rows.new_empty((n, dim)) if need_q else None
        d_offset = q_rows.new_empty(n) if need_offset else None

        def run(group):
            """The run's rows' gradients written; its sums of the others returned."""
            sums = {"keys": scratch(("recomputed keys", group), (n_keys, dim), k_rows).zero_()
                    if need_keys else None,
                    "key_offset": k_rows.new_zeros(n_keys) if need_key_offset else None,
                    "scale": q_rows.new_zeros(()) if need_scale else None,
                    "prior": prior.new_zeros(prior.shape) if need_prior else None,
                    "v": v_t.new_zeros(v_t.shape[::-1]) if need_v else None}
            for rows in groups[group]:
                e, d, *rest = (b[:rows.stop - rows.start] for b in buffers[group])
                if kept is not None:
                    d = kept[rows]
                _RecomputedEuclideanSoftmax._exp(e, d, q_rows[rows], k_rows, ctx.scale, prior,
                                                 ctx.mask, rows, shift[rows],
                                                 distances=kept is not None)
                if need_v:
                    sums["v"].addmm_(e.T, d_out_s[rows])
                if apart:
                    # the logits' gradient times scale / 2, then the partial scores'
                    dz = torch.mm(row_terms[rows], v_ones, out=rest[0]).mul_(e)
                    g = _chunk_distance_grads(dz, d, ctx.scale, rows,
                                              (d_offset, sums["scale"], sums["prior"]),
                                              prescaled=True)
                else:
                    # e / d (0 where d = 0), then the partial scores' gradient into d's buffer
                    over_distances(e, d)
                    g = torch.mm(row_terms[rows], v_ones, out=d).mul_(e)
                    if need_offset:
                        torch.sum(g, 1, out=d_offset[rows]).neg_()
                # partial = 2 q . k + key_offset
                if need_q:
                    torch.mm(g, minus_keys, out=d_q[rows]).mul_(-2.0)
                if need_keys:
                    sums["keys"].addmm_(g.T, q2[rows])
                if need_key_offset:
                    sums["key_offset"] += g.sum(0)
            return sums

        runs = map_chunk_groups(run, len(groups))
        # the runs' sums added in their order, into a new tensor (a run's may be a scratch one)
        total = {name: None if runs[0][name] is None
                 else functools.reduce(torch.Tensor.add_, (r[name] for r in runs[1:]),
                                       runs[0][name].clone()) for name in runs[0]}
        d_scale = None if total["scale"] is None else (total["scale"] / half_scale).reshape(
            scale.shape)
        d_prior = None if total["prior"] is None else total["prior"] / half_scale
        return (d_q, total["keys"], total["key_offset"], d_offset, d_scale, d_prior,
                total["v"], None)


CHUNK_GROUPS = 4
_KEPT_DISTANCES = ("recomputed", "distances")
"""Runs of row chunks of :class:`_RecomputedEuclideanSoftmax`: enough for two workers to
share them out unevenly when one is slowed (a busy machine), few enough that their separate
sums of the keys' gradient cost little."""


def _chunk_groups(n_rows, n_keys, device):
    """The cache-sized row chunks of a (rows x keys) block in at most :data:`CHUNK_GROUPS`
    contiguous runs (lists of slices)."""
    chunks = cache_row_slices(n_rows, n_keys, device)
    n = min(CHUNK_GROUPS, len(chunks))
    bounds = [round(i * len(chunks) / n) for i in range(n + 1)]
    return [chunks[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


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
