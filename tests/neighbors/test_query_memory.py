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


@pytest.mark.parametrize("queries", [None, "X"])
@pytest.mark.parametrize("sort_results", [False, True])
def test_radius_taking_every_key_holds_its_result_once(queries, sort_results):
    X = np.random.default_rng(1).standard_normal((800, 4))
    clf = MetricAttentionClassifier("euclidean", radius=1.0, temperature=1.0)
    clf.fit(X, np.arange(800) % 3)
    Q = None if queries is None else X[:500]
    ref = clf.radius_neighbors(Q, radius=1e3, sort_results=sort_results)
    with skattention.config_context(working_memory=0.25):
        (dist, ind), peak = _numpy_peak(
            lambda: clf.radius_neighbors(Q, radius=1e3, sort_results=sort_results))
    assert len(ind) == len(ref[1]) and all(i.size == 800 - (Q is None) for i in ind)
    for got, want in [(dist, ref[0]), (ind, ref[1])]:
        np.testing.assert_array_equal(np.concatenate(list(got)), np.concatenate(list(want)))
    result = sum(a.nbytes for a in dist) + sum(a.nbytes for a in ind)
    # the result plus about the budget: neither chunks widened to every key beyond the budget
    # nor flat copies of the result
    assert peak < result + 4 * 2**20
