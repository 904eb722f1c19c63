"""The engine's hand-written backward passes are first order: a second derivative through them
is refused with a clear error, never silently 0."""

import functools

import torch


def first_order_backward(backward):
    """``torch.autograd.function.once_differentiable`` that also refuses a backward asked to
    build a graph (``create_graph=True``, which autograd runs with grad mode on): the
    hand-written gradients carry none, so a second derivative through them would be 0 wherever
    the incoming gradient needs none (``once_differentiable`` objects only where it does)."""
    once = torch.autograd.function.once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "skattention's attention, periodic embeddings and category vectors have "
                "first-order gradients only: a second derivative through them "
                "(create_graph=True) is not supported.")
        return once(ctx, *grads)

    return wrapper
