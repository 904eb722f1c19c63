"""The ``"euclidean"`` kind's logits from partial scores (torch only): ``-scale * d + prior``
with ``d = sqrt(max(||q||^2 - partial, 0))``, their gradients written out, and the distances'
square root whose gradient at 0 is 0 (``PreparedKeys`` computes the partial scores)."""

import torch

from ._first_order import first_order_backward


def distances_from_partial(partial, offset, out=None):
    """``sqrt(max(offset - partial, 0))``: Euclidean distances from a block of partial scores
    and the per-query offsets (into ``out``, which may be ``partial``)."""
    return torch.sub(offset[:, None], partial, out=out).clamp_(min=0).sqrt_()


def distance_logits(partial, offset, scale, prior=None, d_out=None, z_out=None):
    """``(d, z)``: the distances :func:`distances_from_partial` (into ``d_out``) and the logits
    ``z = -scale * d + prior`` of the ``"euclidean"`` kind (into ``z_out``; both may be
    ``partial``), ``scale`` a float."""
    d = distances_from_partial(partial, offset, out=d_out)
    z = torch.mul(d, -scale, out=z_out)
    return d, (z if prior is None else z.add_(prior))


def over_distances(t, d, out=None):
    """``t / d`` in place or into ``out``, 0 where ``d = 0`` (one pass; ``where``: three)."""
    return torch.div(t, d, out=t if out is None else out).nan_to_num_(0.0, 0.0, 0.0)


def distance_logits_grads(dz, d, scale, needs, prescaled=False):
    """Gradients of the logits of :func:`distance_logits` w.r.t. ``(partial, offset, scale,
    prior)`` given theirs, ``dz`` (overwritten by the partial scores' gradient, ``scale / (2 d)
    * dz``, 0 where ``d = 0``: :func:`over_distances`), and ``needs`` (four bools; ``None`` where
    not needed). ``prescaled``: ``dz`` is already times ``scale / 2`` (a caller that folds the
    factor into its rows' terms), and so are the scale's and the prior's parts returned."""
    need_partial, need_offset, need_scale, need_prior = needs
    d_scale = -torch.dot(dz.reshape(-1), d.reshape(-1)) if need_scale else None
    d_prior = dz.sum(0) if need_prior else None
    g = d_offset = None
    if need_partial or need_offset:
        g = over_distances(dz, d)
        if not prescaled:
            g.mul_(0.5 * scale)
        d_offset = -g.sum(1) if need_offset else None
    return (g if need_partial else None), d_offset, d_scale, d_prior


class EuclideanLogits(torch.autograd.Function):
    """The logits of :func:`distance_logits` with a hand-written backward
    (:func:`distance_logits_grads`): a training step spends most of its time in the elementwise
    passes over its score block, and autograd's chain (sub, mask, sqrt, where, neg, mul, add
    and their backwards) takes about three times as many passes; the gradient at distance 0 is
    0, as in :func:`sqrt_zero_grad`."""

    @staticmethod
    def forward(ctx, partial, offset, scale, prior):
        ctx.scale = float(scale)
        d, z = distance_logits(partial, offset, ctx.scale, prior)
        ctx.save_for_backward(d, scale if isinstance(scale, torch.Tensor) else None)
        return z

    @staticmethod
    @first_order_backward
    def backward(ctx, dz):
        d, scale = ctx.saved_tensors
        needs = ctx.needs_input_grad
        d_partial, d_offset, d_scale, d_prior = distance_logits_grads(
            dz.clone() if needs[0] or needs[1] else dz, d, ctx.scale, needs)
        if d_scale is not None:
            d_scale = d_scale.reshape(scale.shape)
        return d_partial, d_offset, d_scale, d_prior


def sqrt_zero_grad(f):
    """``sqrt(max(f, 0))`` whose gradient at 0 is 0, not infinite: duplicated rows (common in
    business data) sit at distance 0 from each other, and one infinite gradient would make
    every parameter NaN. ``f = inf`` (a masked entry) gives ``inf`` with gradient 0."""
    positive = f > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, f, 1.0)), 0.0)
