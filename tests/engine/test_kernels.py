"""Statistics of the distances between points (``_kernels.py``)."""

import numpy as np
import pytest
import torch
from sklearn.cluster import estimate_bandwidth

from skattention._engine import mean_kth_distance


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mean_kth_distance_is_estimate_bandwidth(dtype, threads):
    # with 3 threads each row's k-th nearest is found by one of 3 workers
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5)).astype(dtype)
    X = np.vstack([X, X[:40], np.round(X[:50])])  # duplicates and ties
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for quantile in (0.01, 0.3, 0.9):
            k = max(1, int(X.shape[0] * quantile))
            expected = estimate_bandwidth(X.astype(np.float64), quantile=quantile)
            assert mean_kth_distance(X, k, device="cpu") == pytest.approx(expected, rel=1e-12)
    finally:
        torch.set_num_threads(previous)


def test_mean_kth_distance_small_budget_and_coincident_points():
    X = np.repeat(np.random.default_rng(1).normal(size=(4, 3)), [6, 5, 4, 3], axis=0)
    # the third nearest of every point is one of its own copies: exactly 0
    assert mean_kth_distance(X, 3, device="cpu", working_memory=0.001) == 0.0
    assert mean_kth_distance(X, 18, device="cpu") == pytest.approx(
        estimate_bandwidth(X, quantile=1.0), rel=1e-12)
    with pytest.raises(ValueError, match="k=19 must be in"):
        mean_kth_distance(X, 19, device="cpu")
