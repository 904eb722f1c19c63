"""kneighbors and radius_neighbors near the memory limits: results as large as the memory
hold no extra copies of themselves, and results that cannot fit fail before the search."""

import tracemalloc

import numpy as np
import pytest

import skattention
from skattention import MetricAttentionClassifier


@pytest.fixture(scope="module")
def fitted():
    X = np.random.default_rng(0).standard_normal((1500, 4)).astype(np.float32)
    clf = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=1.0)
    return clf.fit(X, np.arange(1500) % 3), X


def _numpy_peak(f):
    tracemalloc.start()
    try:
        result = f()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("queries", [None, "X"])
def test_kneighbors_of_many_neighbours_holds_its_result_once(fitted, queries):
    clf, X = fitted
    Q = None if queries is None else X[:1000]
    ref = clf.kneighbors(Q, n_neighbors=1000)
    with skattention.config_context(working_memory=0.5):
        (dist, ind), peak = _numpy_peak(lambda: clf.kneighbors(Q, n_neighbors=1000))
    np.testing.assert_array_equal(ind, ref[1])
    np.testing.assert_array_equal(dist, ref[0])
    assert dist.dtype == np.float64 and ind.dtype == np.int64
    # the result (distances and indices) plus about the budget, not copies of the result
    assert peak < dist.nbytes + ind.nbytes + 4 * 2**20


def test_kneighbors_result_beyond_memory_fails_before_the_search(fitted, monkeypatch):
    clf, X = fitted
    calls = []
    monkeypatch.setattr(type(clf._keys), "select", lambda *a, **k: calls.append(1))
    # 2**55 query rows (a view of one): a result of 2**60 bytes, more than any address space
    Q = np.broadcast_to(X[:1], (2**55, X.shape[1]))
    with pytest.raises(MemoryError):
        clf.kneighbors(Q, n_neighbors=5)
    assert not calls
