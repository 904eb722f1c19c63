"""The k-NN selection over key cells (``_cells.py``): exactly the neighbours of the plain loop,
on clustered keys with ties and duplicated rows, in float32 and float64, whatever the budget and
the threads; the cells built once per prepared keys and skipped where they cannot pay."""

import numpy as np
import pytest
import torch

from skattention import MetricAttentionClassifier, kneighbors
from skattention._engine import _cells, _knn, prepare_keys


@pytest.fixture
def small_cells(monkeypatch):
    """Cells of 16 keys for calls of any size (the defaults need 8,192 keys and 2,048
    queries) and without the key tree (which serves the low dimensions first); the list holds
    one entry per cells built."""
    monkeypatch.setattr(_knn, "tree_for", lambda *args: None)
    monkeypatch.setattr(_cells, "CELL_KEYS", 16)
    monkeypatch.setattr(_cells, "MIN_QUERIES", 1)
    monkeypatch.setattr(_cells, "MIN_PAIRS", 0)
    monkeypatch.setattr(_cells, "MIN_BLOCKS", 4)
    built, selected = [], []
    key_cells_class, select = _cells.KeyCells, _knn._select_in_cells

    class Counted(key_cells_class):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    def counted_select(*args, **kwargs):
        out = select(*args, **kwargs)
        selected.append(out[2])  # the fraction of the keys computed
        return out

    monkeypatch.setattr(_cells, "KeyCells", Counted)
    monkeypatch.setattr(_knn, "_select_in_cells", counted_select)
    return built, selected


def clustered(rng, n, d, dtype, integer):
    """Points around 6 far-apart centres; ``integer``: integer offsets (distance ties), and a
    block of duplicated rows either way."""
    centres = np.round(rng.normal(scale=10, size=(6, d)))
    offsets = rng.integers(-2, 3, size=(n, d)) if integer else rng.normal(size=(n, d))
    X = centres[rng.integers(0, 6, n)] + offsets
    X[n // 2 : n // 2 + 40] = X[:40]
    return X.astype(dtype)


def plain(monkeypatch):
    monkeypatch.setattr(_knn, "key_cells", lambda *args: None)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("k", [1, 7, 15])
def test_cells_select_the_same_neighbours(small_cells, monkeypatch, dtype, integer, k):
    built, selected = small_cells
    rng = np.random.default_rng(0)
    keys = clustered(rng, 3000, 5, dtype, integer)
    queries = np.concatenate([clustered(rng, 500, 5, dtype, integer), keys[:100]])
    prepared = prepare_keys(keys, metric="sqeuclidean", dtype=dtype)
    dist, idx = kneighbors(queries, prepared, k, dtype=dtype)
    assert built == [1] and selected and min(selected) < 0.6  # the cells served, skipping
    with monkeypatch.context() as patch:
        plain(patch)
        ref_dist, ref_idx = kneighbors(queries, prepare_keys(keys, dtype=dtype), k, dtype=dtype)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(dist, ref_dist)
    kneighbors(queries, prepared, k, dtype=dtype)
    assert built == [1]  # remembered on the prepared keys


@pytest.mark.parametrize("working_memory", [0.05, 1.0])
@pytest.mark.parametrize("threads", [1, 2])
def test_cells_whatever_the_budget_and_threads(small_cells, monkeypatch, working_memory,
                                               threads):
    rng = np.random.default_rng(1)
    keys = clustered(rng, 4000, 3, "float32", True)
    queries = clustered(rng, 700, 3, "float32", True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kneighbors(queries, prepare_keys(keys, metric="euclidean"), 5,
                         metric="euclidean", working_memory=working_memory)
        with monkeypatch.context() as patch:
            plain(patch)
            ref = kneighbors(queries, keys, 5, metric="euclidean")
    finally:
        torch.set_num_threads(before)
    assert small_cells[1]
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


def test_cells_fall_back_to_the_plain_loop(small_cells, monkeypatch):
    # after a query block that computed more than _CELLS_PAY_BELOW of the keys, the other
    # blocks take the plain loop: the same neighbours (one worker: with several, each may
    # start a block over the cells before the first one finishes)
    monkeypatch.setattr(_knn, "_CELLS_PAY_BELOW", -1.0)
    rng = np.random.default_rng(2)
    keys = clustered(rng, 3000, 4, "float64", False)
    queries = clustered(rng, 3000, 4, "float64", False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = kneighbors(queries, prepare_keys(keys, dtype="float64"), 4, dtype="float64",
                         working_memory=0.2)
    finally:
        torch.set_num_threads(before)
    assert len(small_cells[1]) == 1  # one block over the cells, the others plain
    ref = kneighbors(queries, keys, 4, dtype="float64")
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


def test_cells_are_not_used_where_they_cannot_pay(small_cells):
    # a Gaussian cloud: every key block may hold a query's neighbours
    built, selected = small_cells
    rng = np.random.default_rng(3)
    keys, queries = rng.normal(size=(3000, 16)), rng.normal(size=(400, 16))
    got = kneighbors(queries, prepare_keys(keys), 5)
    assert built == [1] and not selected
    np.testing.assert_array_equal(got[1], kneighbors(queries, keys, 5)[1])


def test_cells_need_prepared_keys(small_cells):
    rng = np.random.default_rng(4)
    keys = clustered(rng, 3000, 4, "float32", False)
    kneighbors(keys[:300], keys, 5)
    assert small_cells == ([], [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_lower_bounds_are_bounds(small_cells, dtype):
    rng = np.random.default_rng(5)
    keys = torch.as_tensor(clustered(rng, 2000, 6, "float64", True), dtype=dtype)
    cells = _cells.KeyCells(prepare_keys(keys, dtype=dtype), 1.0)
    queries = torch.as_tensor(np.concatenate([clustered(rng, 200, 6, "float64", False),
                                              keys[:50].double().numpy()]), dtype=dtype)
    lower = cells.lower_bounds(queries)
    exact = ((queries[:, None, :].double() - cells.keys.raw[None].double()) ** 2).sum(-1)
    nearest = torch.stack([exact[:, a:b].amin(1) for a, b in
                           zip(cells.bounds[:-1], cells.bounds[1:], strict=True)], 1)
    assert bool((lower <= nearest).all())
    assert float((lower > 0).double().mean()) > 0.5  # and they rule far blocks out
    assert torch.equal(torch.sort(cells.perm).values, torch.arange(keys.shape[0]))


def test_the_estimators_predict_the_same_over_cells(small_cells, monkeypatch):
    rng = np.random.default_rng(6)
    X = clustered(rng, 3000, 4, "float32", True)
    y = rng.integers(0, 3, 3000)
    Xq = clustered(rng, 600, 4, "float32", True)
    model = MetricAttentionClassifier("euclidean", n_neighbors=9, temperature=np.inf).fit(X, y)
    proba, neighbours = model.predict_proba(Xq), model.kneighbors(Xq)
    assert small_cells[0] == [1] and small_cells[1]
    with monkeypatch.context() as patch:
        plain(patch)
        np.testing.assert_array_equal(model.predict_proba(Xq), proba)
        ref = model.kneighbors(Xq)
    np.testing.assert_array_equal(neighbours[1], ref[1])
    np.testing.assert_array_equal(neighbours[0], ref[0])


def test_a_budget_too_small_for_the_bounds_takes_the_plain_loop(small_cells, monkeypatch):
    # the blocks' lower bounds take 40 bytes per row and block: with 1,250 blocks a row needs
    # 50 KB, more than the budget; the plain loop fits it (found in review: MemoryError)
    rng = np.random.default_rng(7)
    keys = clustered(rng, 20000, 3, "float32", True)
    queries = clustered(rng, 300, 3, "float32", True)
    got = kneighbors(queries, prepare_keys(keys), 5, working_memory=0.03)
    assert small_cells[0] == [1] and not small_cells[1]
    np.testing.assert_array_equal(got[1], kneighbors(queries, keys, 5)[1])


def test_the_number_of_cells_is_capped(small_cells, monkeypatch):
    # the cells' chain holds a square matrix of their distances: at most _MAX_CELLS cells, a
    # cell of more keys cut into more blocks
    monkeypatch.setattr(_cells, "_MAX_CELLS", 8)
    rng = np.random.default_rng(8)
    keys = clustered(rng, 3000, 4, "float64", False)
    cells = _cells.KeyCells(prepare_keys(keys, dtype="float64"), 1.0)
    assert cells.cell_centres.shape[0] == 8 and cells.n_blocks >= 3000 // 16
    assert max(np.diff(cells.bounds)) <= 16
    queries = clustered(rng, 400, 4, "float64", False)
    got = kneighbors(queries, prepare_keys(keys, dtype="float64"), 6, dtype="float64")
    np.testing.assert_array_equal(got[1], kneighbors(queries, keys, 6, dtype="float64")[1])
