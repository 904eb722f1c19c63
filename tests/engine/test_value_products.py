"""Products of weights with values (``_softmax.product_values``, ``rows_times``): a row's
result does not depend on the rows multiplied with it, in float32 and float64, on whatever
CPU this runs (its float64 padding: ``float64_value_columns``)."""

import pytest
import torch

from skattention._engine._softmax import float64_value_columns, product_values, rows_times


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_values", [1, 2, 3, 7, 10, 11, 12, 13])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_times_the_values_does_not_depend_on_its_batch(dtype, n_values, threads):
    g = torch.Generator().manual_seed(n_values)
    p = torch.rand(1000, 1024, generator=g, dtype=dtype)
    v = product_values(torch.rand(1024, n_values, generator=g, dtype=dtype))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = rows_times(p, v)
        for start, n in [(0, 1), (3, 2), (17, 5), (100, 8), (1, 13), (500, 100), (2, 333)]:
            assert torch.equal(rows_times(p[start:start + n], v), whole[start:start + n])
    finally:
        torch.set_num_threads(before)


def test_float64_values_are_padded_to_whole_kernel_vectors():
    v = product_values(torch.ones(10, 3, dtype=torch.float64))
    multiple = float64_value_columns(v.device)
    assert multiple in (8, 12) and v.shape == (10, multiple)
    assert torch.equal(v[:, 3], torch.ones(10, dtype=torch.float64))  # the weights' sums
    assert not v[:, 4:].any()
    assert product_values(torch.ones(10, 3)).shape == (10, 4)  # float32: no padding
