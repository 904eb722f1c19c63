"""The tabular map's summed category vectors (``_code_vectors.py``): embedding's numbers."""

import pytest
import torch

from skattention._engine._code_vectors import summed_code_vectors


def _codes(n_rows, cardinalities, seed=0):
    generator = torch.Generator().manual_seed(seed)
    offset, columns = 0, []
    for cardinality in cardinalities:
        columns.append(torch.randint(cardinality, (n_rows,), generator=generator) + offset)
        offset += cardinality
    return torch.stack(columns, 1), offset


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cardinalities", [(3,), (5, 40, 2), (1, 7, 7, 300, 2, 9)])
def test_the_sum_and_its_gradient_are_embeddings_bits(dtype, cardinalities):
    # many rows per code (duplicates), codes never drawn, a column of one level
    codes, n_codes = _codes(20_003 if len(cardinalities) > 3 else 2_003, cardinalities)
    weight = torch.randn(n_codes + 4, 24, dtype=dtype, requires_grad=True)
    d_out = torch.randn(codes.shape[0], 24, dtype=dtype)
    expected = torch.nn.functional.embedding(codes, weight).sum(1)
    (expected_grad,) = torch.autograd.grad(expected, weight, d_out)
    out = summed_code_vectors(weight, codes)
    (grad,) = torch.autograd.grad(out, weight, d_out)
    assert torch.equal(out, expected)
    assert torch.equal(grad, expected_grad)
    assert not grad[n_codes:].any()  # the codes no row holds


def test_no_grad_and_a_column_slice_of_a_wider_matrix():
    codes, n_codes = _codes(50, (4, 6))
    x = torch.cat([torch.randn(50, 3, dtype=torch.float64), codes.double()], 1)
    weight = torch.randn(n_codes, 5, dtype=torch.float64)
    with torch.no_grad():
        out = summed_code_vectors(weight, x[:, 3:].long())
    assert torch.equal(out, weight[codes].sum(1))


def test_gradcheck_and_no_second_derivative():
    codes, n_codes = _codes(30, (3, 4))
    weight = torch.randn(n_codes, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: summed_code_vectors(w, codes), (weight,))
    out = summed_code_vectors(weight, codes)
    (grad,) = torch.autograd.grad(out.square().sum(), weight, create_graph=False)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        torch.autograd.grad(summed_code_vectors(weight, codes).square().sum(), weight,
                            create_graph=True)
    assert grad.shape == weight.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gradients_are_summed_in_float32(dtype):
    torch.manual_seed(0)
    codes, n_codes = _codes(3_000, (5, 4))
    weight = torch.randn(n_codes, 8, dtype=dtype, requires_grad=True)
    d_out = torch.randn(codes.shape[0], 8, dtype=dtype)
    (grad,) = torch.autograd.grad(summed_code_vectors(weight, codes), weight, d_out)
    exact = torch.zeros(n_codes, 8, dtype=torch.float64)
    for column in codes.T:
        exact.index_add_(0, column, d_out.double())
    assert grad.dtype == dtype
    # the float32 sum rounded once to the dtype
    torch.testing.assert_close(grad, exact.to(dtype), rtol=0, atol=0)
