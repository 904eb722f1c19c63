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


class _FirstOrder(torch.autograd.Function):
    """The identity, whose backward refuses a second derivative (:func:`first_order`)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    @first_order_backward
    def backward(ctx, grad):
        return grad


def first_order(x):
    """``x``, differentiable once: a second derivative through it is the clear error of
    :func:`first_order_backward` (torch's fused SDPA kernels on the CPU have no second
    derivative, and their own error names an internal operator)."""
    return _FirstOrder.apply(x) if x.requires_grad else x
