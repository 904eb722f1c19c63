"""The learned maps' planning of rows mapped at once (``_maps.py``)."""

import numpy as np
import torch

import skattention
from skattention._engine import build_map


def _tabular_map_and_rows(n_rows=5003, n_numeric=6):
    torch.manual_seed(0)
    metric_map = build_map("tabular", n_components=16, n_numeric=n_numeric,
                           cardinalities=(5, 40)).eval()
    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(size=(n_rows, n_numeric)), rng.integers(0, 5, n_rows),
              rng.integers(0, 40, n_rows)]
    return metric_map, torch.as_tensor(X, dtype=torch.float32)


def test_rows_mapped_at_once_follow_the_working_memory():
    metric_map, X = _tabular_map_and_rows()
    with skattention.config_context(working_memory=1):
        small = metric_map.budget_rows(X.shape[0], X.element_size())
    with skattention.config_context(working_memory=64):
        large = metric_map.budget_rows(X.shape[0], X.element_size())
    per_row = X.element_size() * (metric_map.n_features + metric_map.activation_width())
    assert 1 <= small <= 2**20 // per_row < large
    assert metric_map.budget_rows(X.shape[0], X.element_size(), max_rows=7) == 7


def test_chunked_keys_are_the_keys_of_all_rows_at_once():
    # a fit maps its training rows in blocks of the working memory (at once, a table's rows x
    # periodic features held gigabytes); a short last block is padded, rounded as the others
    metric_map, X = _tabular_map_and_rows()
    with torch.no_grad():
        whole = metric_map.key(X)
        with skattention.config_context(working_memory=0.1):
            assert metric_map.budget_rows(X.shape[0], X.element_size()) < X.shape[0] // 10
            chunked = metric_map.chunked_keys(X)
        last_short = metric_map.chunked_keys(X, max_rows=X.shape[0] - 1)  # a last block of 1
    assert chunked.shape == whole.shape == last_short.shape
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(last_short, whole, rtol=0, atol=1e-6)
    assert metric_map.chunked_keys(X[:0]).shape == (0, 16)
