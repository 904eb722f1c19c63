"""The large training step's softmax (torch only): :class:`RecomputedEuclideanSoftmax`, the
``"euclidean"`` kind's attention of a step of many (query, key) pairs with its backward
written out, over cache-sized row chunks of a (rows x keys) block never stored whole, the
chunks on the step's workers (:func:`single_block_attention` takes it from
``RECOMPUTED_MIN_PAIRS`` pairs)."""

import functools
import math

import torch

from ._budget import cache_row_slices
from ._distance_logits import distance_logits_grads, over_distances
from ._first_order import first_order_backward
from ._parallel import map_chunk_groups
from ._scratch import claim, reusing_buffers, scratch
from ._softmax import LOG2E, flushed_exp


class RecomputedEuclideanSoftmax(torch.autograd.Function):
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

    Within a training loop (:func:`reused_buffers`) the forward keeps, in a (rows x keys)
    buffer reused from step to step, the weights over the distances where the backward needs
    no scale, prior or values gradient (a training step's: it then starts from them), else
    the distances (it then skips their product and square root); a backward whose buffer
    another call has claimed since computes them again. The same numbers either way.

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
        # ... or, where the backward needs no weights apart, the weights over the distances
        need_scale, need_prior, need_v = ctx.needs_input_grad[4:7]
        over = kept is not None and not (need_scale or need_prior or need_v)
        ctx.kept = None if kept is None else (kept, claim(_KEPT_DISTANCES), over)
        out = q.new_empty((n, v.shape[1]))
        shift, row_sum = q.new_empty((n, 1)), q.new_empty((n, 1))

        def run(group):  # each run writes its own rows
            for rows in groups[group]:
                e = buffers[group][:rows.stop - rows.start]
                d = e if kept is None else kept[rows]
                RecomputedEuclideanSoftmax._exp(e, d, q_rows[rows], k_rows, ctx.scale, prior,
                                                 mask, rows, shift[rows], first=True)
                torch.sum(e, 1, keepdim=True, out=row_sum[rows])
                torch.nn.functional.linear(e, v_t, out=out[rows])
                if over:
                    over_distances(e, d, out=d)

        map_chunk_groups(run, len(groups))
        out.div_(row_sum)
        ctx.save_for_backward(q_rows, k_rows, prior, v_t, out, shift, row_sum,
                              scale if isinstance(scale, torch.Tensor) else None)
        return out

    @staticmethod
    def _exp(e, d, q_rows, k_rows, scale, prior, mask, rows, shift, first=False,
             from_kept=False):
        """The unnormalised weights ``exp(logit - shift)`` of a chunk's rows into ``e`` and
        their distances into ``d`` (``e`` itself in the forward without kept distances), or
        from the distances ``d`` holds (``from_kept``: those the forward kept). The rows'
        ``shift`` (their largest logit, in base 2 as the logits and ``prior`` are here) is set
        by the forward (``first``) and used by the backward."""
        scale2 = scale * LOG2E
        if from_kept:
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
    @first_order_backward
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
        kept, over = ((ctx.kept[0], ctx.kept[2]) if ctx.kept is not None and ctx.kept[1].release()
                      else (None, False))
        # a chunk's buffers: the partial scores' gradient (over the kept e / d: the only one),
        # the weights, and the logits' gradient where needed apart
        n_buffers = 1 if over else 3 if apart else 2
        buffers = [[scratch(("recomputed", g, i), (chunks[0].stop - chunks[0].start, n_keys),
                            q_rows) for i in range(n_buffers)]
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
                views = [b[:rows.stop - rows.start] for b in buffers[group]]
                if over:  # the forward's e / d: the partial scores' gradient at once
                    g = torch.mm(row_terms[rows], v_ones, out=views[0]).mul_(kept[rows])
                    _row_sums_negated(g, d_offset, rows)
                    _add_products(g, minus_keys, q2, rows, d_q, sums)
                    continue
                e, d, *rest = views
                if kept is not None:
                    d = kept[rows]
                RecomputedEuclideanSoftmax._exp(e, d, q_rows[rows], k_rows, ctx.scale, prior,
                                                 ctx.mask, rows, shift[rows],
                                                 from_kept=kept is not None)
                if need_v:
                    sums["v"].addmm_(e.T, d_out_s[rows])
                if apart:
                    # the logits' gradient times scale / 2, then the partial scores'
                    dz = torch.mm(row_terms[rows], v_ones, out=rest[0]).mul_(e)
                    g = chunk_distance_grads(dz, d, ctx.scale, rows,
                                             (d_offset, sums["scale"], sums["prior"]),
                                             prescaled=True)
                else:
                    # e / d (0 where d = 0), then the partial scores' gradient into d's buffer
                    over_distances(e, d)
                    g = torch.mm(row_terms[rows], v_ones, out=d).mul_(e)
                    _row_sums_negated(g, d_offset, rows)
                _add_products(g, minus_keys, q2, rows, d_q, sums)
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
"""Runs of row chunks of :class:`RecomputedEuclideanSoftmax`: enough for two workers to
share them out unevenly when one is slowed (a busy machine), few enough that their separate
sums of the keys' gradient cost little."""

# the scratch key of the (rows x keys) buffer a forward keeps for its backward
_KEPT_DISTANCES = ("recomputed", "distances")


def _chunk_groups(n_rows, n_keys, device):
    """The cache-sized row chunks of a (rows x keys) block in at most :data:`CHUNK_GROUPS`
    contiguous runs (lists of slices)."""
    chunks = cache_row_slices(n_rows, n_keys, device)
    n = min(CHUNK_GROUPS, len(chunks))
    bounds = [round(i * len(chunks) / n) for i in range(n + 1)]
    return [chunks[a:b] for a, b in zip(bounds[:-1], bounds[1:])]



def _row_sums_negated(g, d_offset, rows):
    """The offsets' gradient of a chunk's rows ``rows`` (``-`` the row sums of the partial
    scores' gradient ``g``) into ``d_offset`` (``None``: not needed)."""
    if d_offset is not None:
        torch.sum(g, 1, out=d_offset[rows]).neg_()


def _add_products(g, minus_keys, q2, rows, d_q, sums):
    """The gradients through ``partial = 2 q . k + key_offset`` of a chunk's rows ``rows``
    from the partial scores' gradient ``g``: the queries' into ``d_q`` (``None``: not
    needed), the keys' and the key offsets' added to ``sums`` (their ``None``: not needed)."""
    if d_q is not None:
        torch.mm(g, minus_keys, out=d_q[rows]).mul_(-2.0)
    if sums["keys"] is not None:
        sums["keys"].addmm_(g.T, q2[rows])
    if sums["key_offset"] is not None:
        sums["key_offset"] += g.sum(0)


def chunk_distance_grads(dz, d, scale, rows, grads, prescaled=False):
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

