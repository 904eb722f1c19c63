"""The summed vectors of a row's category codes (torch only): ``sum_j E[c_j]``, the tabular
map's categorical part, with a backward that does not expand its gradient to a (rows x
columns x components) array as ``embedding(codes).sum(1)``'s does."""

import torch

from ._device import accumulation_dtype
from ._first_order import first_order_backward


def summed_code_vectors(weight, codes):
    """``weight[codes].sum(1)``: the sum over each row's codes ``codes`` (rows x columns, long;
    each column's codes its own rows of ``weight``) of their rows of ``weight``.

    The forward is ``torch.nn.functional.embedding`` then ``sum(1)``; on the CPU its backward
    is one ``index_add_`` of the output's gradient per column, without embedding's expanded
    copy of the gradient and its sort (most of the codes' part of a tabular training step):
    in float32 and float64 the same numbers as embedding's where no code is in two columns
    (the map's offsets: a code's gradient is then the sum of its rows' in row order, as
    embedding's backward adds them); half-precision gradients are summed in float32
    (embedding's are not: they drift with the rows summed). On other devices, embedding's own
    backward (``index_add_`` there adds in no fixed order)."""
    if (codes.device.type != "cpu" or codes.shape[1] == 0 or not weight.requires_grad
            or not torch.is_grad_enabled()):
        return torch.nn.functional.embedding(codes, weight).sum(1)
    return _SummedCodeVectors.apply(weight, codes)


class _SummedCodeVectors(torch.autograd.Function):
    """:func:`summed_code_vectors` on the CPU."""

    @staticmethod
    def forward(ctx, weight, codes):
        ctx.save_for_backward(codes)
        ctx.n_codes = weight.shape[0]
        return torch.nn.functional.embedding(codes, weight).sum(1)

    @staticmethod
    @first_order_backward
    def backward(ctx, d_out):
        (codes,) = ctx.saved_tensors
        d_weight = None
        if ctx.needs_input_grad[0]:
            summed = accumulation_dtype(d_out.dtype)
            d_weight = d_out.new_zeros((ctx.n_codes, d_out.shape[1]), dtype=summed)
            d_rows = d_out.to(summed)
            for column in codes.T:
                d_weight.index_add_(0, column, d_rows)
            d_weight = d_weight.to(d_out.dtype)
        return d_weight, None
