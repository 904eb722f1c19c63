"""Products of weights with values (``_softmax.product_values``, ``rows_times``): a row's
result does not depend on the rows multiplied with it, on whatever CPU this runs (the values'
padding: ``value_columns``)."""

import pytest
import torch

from skattention._engine._softmax import product_values, rows_times, value_columns

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_values", [1, 2, 3, 4, 7, 10, 11, 12, 13])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_times_the_values_does_not_depend_on_its_batch(dtype, n_values, threads):
    if dtype == torch.float32 and value_columns(dtype, CPU) == 1 and n_values > 2:
        pytest.skip("float32 values are padded only where measured (AMD processors); "
                    "elsewhere a few columns are kept as they are")
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_are_padded_to_whole_kernel_vectors(dtype):
    v = product_values(torch.ones(10, 3, dtype=dtype))
    multiple = value_columns(dtype, CPU)
    assert multiple in ((1, 16) if dtype == torch.float32 else (8, 12))
    assert v.shape == (10, 4 + (-4 % multiple))
    assert torch.equal(v[:, 3], torch.ones(10, dtype=dtype))  # the weights' sums
    assert not v[:, 4:].any()
