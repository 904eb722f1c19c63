"""The k-NN selection over the key tree (``_tree.py``): exactly the neighbours of the plain
loop and of scikit-learn's brute force, on clustered and uniform keys, duplicated rows and
integer grids (massive ties), in float32 and float64, whatever the batching and the budget;
the tree built once per prepared keys, used where it applies and nowhere else."""

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

from skattention import kneighbors
from skattention._engine import _knn, _tree, _tree_calls, exact_f_of_pairs, prepare_keys


@pytest.fixture
def small_tree(monkeypatch):
    """The tree for calls of any size and dimension, with leaves of 4 keys (the defaults need
    4,096 keys, and 256 queries for keys not prepared); the lists hold one entry per tree built
    and per block of queries it served."""
    monkeypatch.setattr(_tree, "MIN_KEYS", 1)
    monkeypatch.setattr(_tree, "MIN_QUERIES", 1)
    monkeypatch.setattr(_tree, "MAX_DIM", 8)
    monkeypatch.setattr(_tree, "PAYS_UP_TO", 1.0)
    monkeypatch.setattr(_tree, "LEAF_KEYS", 4)
    built, served = [], []
    tree_class, nearest = _tree.KeyTree, _tree.KeyTree.nearest

    class Counted(tree_class):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

        def nearest(self, *args, **kwargs):
            served.append(1)
            return nearest(self, *args, **kwargs)

    monkeypatch.setattr(_tree, "KeyTree", Counted)
    return built, served


def plain(monkeypatch):
    monkeypatch.setattr(_knn, "tree_for", lambda *args: None)
    monkeypatch.setattr(_knn, "key_cells", lambda *args: None)


def points(rng, n, d, kind):
    """Clustered, uniform or integer-grid points (the last: massive distance ties), with a
    block of duplicated rows."""
    if kind == "clustered":
        centres = rng.normal(scale=10, size=(6, d))
        X = centres[rng.integers(0, 6, n)] + rng.normal(size=(n, d))
    elif kind == "uniform":
        X = rng.uniform(-3, 3, size=(n, d))
    else:
        X = rng.integers(-4, 5, size=(n, d)).astype(float)
    X[n // 2 : n // 2 + 30] = X[:30]
    return X


def reference(queries, keys, k, dtype, monkeypatch):
    with monkeypatch.context() as patch:
        plain(patch)
        return kneighbors(queries, prepare_keys(keys, dtype=dtype), k, dtype=dtype)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("kind", ["clustered", "uniform", "grid"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tree_selects_the_same_neighbours(small_tree, monkeypatch, d, kind, dtype):
    built, served = small_tree
    rng = np.random.default_rng(d)
    keys = points(rng, 1500, d, kind).astype(dtype)
    queries = np.concatenate([points(rng, 300, d, kind), keys[:50]]).astype(dtype)
    k = 7
    dist, idx = kneighbors(queries, prepare_keys(keys, dtype=dtype), k, dtype=dtype)
    assert built == [1] and served  # the tree served the call
    ref_dist, ref_idx = reference(queries, keys, k, dtype, monkeypatch)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(dist, ref_dist)
    if dtype == "float64":
        # scikit-learn's brute force: the same distances to its rounding (its expansion
        # |q|^2 - 2 q.k + |k|^2 leaves about 1e-7 at coincident points, as much as its BLAS
        # rounds), and the same neighbours in rows without near ties (its products round
        # duplicated keys apart)
        sk_dist, sk_idx = NearestNeighbors(algorithm="brute").fit(keys).kneighbors(queries, k)
        np.testing.assert_allclose(np.sqrt(dist), sk_dist, rtol=1e-9, atol=1e-6)
        full = NearestNeighbors(algorithm="brute").fit(keys).kneighbors(queries, k + 1)[0]
        clear = (np.diff(full, axis=1) > 1e-9).all(1)
        np.testing.assert_array_equal(idx[clear], sk_idx[clear])


@pytest.mark.parametrize("k", [1, 40, 300])
def test_tree_with_k_beyond_the_leaves(small_tree, monkeypatch, k):
    # k larger than a leaf, than a group's node, and every key (k = n)
    rng = np.random.default_rng(10)
    n = 300 if k == 300 else 1200
    keys = points(rng, n, 2, "grid")
    queries = points(rng, 200, 2, "grid")
    got = kneighbors(queries, prepare_keys(keys, dtype="float64"), k, dtype="float64")
    assert small_tree[1]
    ref = reference(queries, keys, k, "float64", monkeypatch)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("working_memory", [0.02, 1.0])
def test_tree_whatever_the_batching_and_budget(small_tree, monkeypatch, working_memory):
    rng = np.random.default_rng(11)
    keys = points(rng, 2000, 3, "clustered").astype("float32")
    queries = points(rng, 600, 3, "clustered").astype("float32")
    prepared = prepare_keys(keys, metric="euclidean")
    whole = kneighbors(queries, prepared, 5, metric="euclidean",
                       working_memory=working_memory)
    # a query's neighbours do not depend on the other queries of its call
    order = rng.permutation(600)
    parts = [kneighbors(queries[order[s : s + 97]], prepared, 5, metric="euclidean")
             for s in range(0, 600, 97)]
    part_idx = np.concatenate([p[1] for p in parts])
    part_dist = np.concatenate([p[0] for p in parts])
    np.testing.assert_array_equal(part_idx, whole[1][order])
    np.testing.assert_array_equal(part_dist, whole[0][order])
    with monkeypatch.context() as patch:
        plain(patch)
        ref = kneighbors(queries, keys, 5, metric="euclidean")
    np.testing.assert_array_equal(whole[1], ref[1])
    np.testing.assert_array_equal(whole[0], ref[0])
    assert small_tree[0] == [1]


def test_tree_is_used_only_where_it_applies(small_tree, monkeypatch):
    built, served = small_tree
    rng = np.random.default_rng(12)
    keys = points(rng, 1000, 3, "clustered")
    queries = points(rng, 100, 3, "clustered")
    kneighbors(queries, keys, 5)  # keys not prepared: a tree for the call
    assert built == [1] and len(served) == 1
    built.clear()
    served.clear()
    prepared = prepare_keys(keys)
    radii = (np.ones(100), np.ones(1000))
    kneighbors(queries, prepared, 5, radius=radii)  # per-point radii: the plain loop
    kneighbors(queries, prepared, 5, log_prior=np.where(np.arange(1000) % 7, 0.0, -np.inf))
    assert built == [] and served == []
    monkeypatch.setattr(_tree, "MAX_DIM", 2)  # beyond the tree's dimensions
    kneighbors(queries, prepared, 5)
    assert built == []
    monkeypatch.setattr(_tree, "MAX_DIM", 3)
    monkeypatch.setattr(_tree, "PAYS_UP_TO", 0.0)  # not expected to pay
    kneighbors(queries, prepared, 5)
    assert built == [] and served == []


@pytest.mark.parametrize("kind", ["clustered", "grid"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("exclude_self", [False, True])
@pytest.mark.parametrize("radius", [None, 1.0, 2.0])
def test_tree_with_a_radius_and_self_exclusion(small_tree, monkeypatch, kind, dtype,
                                               exclude_self, radius):
    # the query's own key left out (duplicated rows: its twins stay), keys at exactly the
    # radius kept (integer grid), padding where fewer keys are within it
    rng = np.random.default_rng(15)
    keys = points(rng, 1500, 3, kind).astype(dtype)
    near = keys[rng.integers(0, 1500, 400)] + rng.integers(-1, 2, size=(400, 3))
    queries = keys[::3] if exclude_self else near.astype(dtype)
    own = np.arange(0, 1500, 3) if exclude_self else False
    prepared = prepare_keys(keys, dtype=dtype)
    k = 9
    got = kneighbors(queries, prepared, k, radius=radius, exclude_self=own, dtype=dtype)
    assert small_tree[1]
    with monkeypatch.context() as patch:
        plain(patch)
        ref = kneighbors(queries, keys, k, radius=radius, exclude_self=own, dtype=dtype)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])
    if radius is not None:
        assert (got[1] >= 0).any()
        assert (got[1] == -1).any() or kind == "grid"
        np.testing.assert_array_equal(np.isfinite(got[0]), got[1] >= 0)
    if exclude_self:
        assert not (got[1] == own[:, None]).any()


def test_tree_attention_and_pickled_prepared_keys(small_tree, monkeypatch):
    # k-NN attention takes the same selection
    from skattention import attention

    rng = np.random.default_rng(13)
    keys = points(rng, 1200, 2, "uniform")
    values = rng.normal(size=(1200, 3))
    queries = points(rng, 150, 2, "uniform")
    got = attention(queries, prepare_keys(keys), values, n_neighbors=6, temperature=0.5)
    assert small_tree[1]
    with monkeypatch.context() as patch:
        plain(patch)
        ref = attention(queries, keys, values, n_neighbors=6, temperature=0.5)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("d", [1, 2, 3])
def test_squares_in_order_are_torch_sums(d):
    # exact_f_of_pairs adds the squares in order up to three dimensions (what the tree
    # repeats); torch's sum over so short a last dimension gives the same values
    rng = np.random.default_rng(16)
    for shape in [(1, 1), (7, 1), (1, 9), (33, 17)]:
        q = torch.as_tensor(rng.normal(size=(shape[0], 1, d)) * 10.0 ** rng.integers(-3, 4))
        k = torch.as_tensor(rng.normal(size=(shape[0], shape[1], d)))
        diff = q - k
        assert torch.equal(exact_f_of_pairs("sqeuclidean", 2.0, q, k), (diff * diff).sum(-1))


def test_tree_blocks_whatever_the_workers(small_tree, monkeypatch):
    # several blocks per worker, one worker or two: the same neighbours
    rng = np.random.default_rng(17)
    keys = points(rng, 2000, 3, "clustered")
    queries = points(rng, 900, 3, "clustered")
    prepared = prepare_keys(keys, dtype="float64")
    monkeypatch.setattr(_tree_calls, "_MIN_BLOCK", 1)
    outs = []
    for threads, blocks in [(1, 1), (2, 1), (2, 5)]:
        monkeypatch.setattr(_tree_calls, "_BLOCKS_PER_WORKER", blocks)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            outs.append(kneighbors(queries, prepared, 6, dtype="float64", radius=1.5))
        finally:
            torch.set_num_threads(previous)
    for dist, idx in outs[1:]:
        np.testing.assert_array_equal(idx, outs[0][1])
        np.testing.assert_array_equal(dist, outs[0][0])


@pytest.mark.parametrize("working_memory", [0.05, 1.0])
def test_tree_settles_ties_across_the_boundary(small_tree, monkeypatch, working_memory):
    # keys that repeat nine points: every query's k-th nearest ties with hundreds of keys,
    # which the ball queries settle in index order (a query or a few per chunk of the budget)
    rng = np.random.default_rng(18)
    keys = rng.integers(0, 3, size=(3000, 2)).astype(float)
    queries = rng.integers(0, 3, size=(200, 2)) + 0.5 * rng.integers(0, 2, size=(200, 2))
    settled = []
    within = _tree.KeyTree._within
    monkeypatch.setattr(_tree.KeyTree, "_within",
                        lambda self, *args: settled.append(1) or within(self, *args))
    got = kneighbors(queries, prepare_keys(keys), 10, working_memory=working_memory)
    assert settled
    ref = reference(queries, keys, 10, "float64", monkeypatch)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[0], ref[0])


def test_prepared_keys_serve_single_rows_from_their_tree(monkeypatch):
    # default thresholds: prepared keys (at least 4,096) take their tree for a call of one
    # row; the same keys unprepared build none for so few queries
    built = []
    tree_class = _tree.KeyTree

    class Counted(tree_class):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_tree, "KeyTree", Counted)
    rng = np.random.default_rng(19)
    keys = points(rng, 5000, 3, "grid")
    prepared = prepare_keys(keys, dtype="float64")
    rows = [kneighbors(keys[i : i + 1] + 0.5, prepared, 8, dtype="float64") for i in range(5)]
    assert built == [1]
    kneighbors(keys[:3], keys, 8, dtype="float64")
    assert built == [1]
    ref = reference(keys[:5] + 0.5, keys, 8, "float64", monkeypatch)
    np.testing.assert_array_equal(np.concatenate([r[1] for r in rows]), ref[1])
    np.testing.assert_array_equal(np.concatenate([r[0] for r in rows]), ref[0])


def test_tree_at_subnormal_squared_distances(small_tree):
    # coordinates of about 1e-160: squared distances near or below the subnormal range, whose
    # rounding is not relative; the selection is still the (f, index) order of the exact f
    rng = np.random.default_rng(20)
    keys = rng.integers(0, 5, size=(2000, 3)) * 1e-160
    queries = keys[:100] + rng.integers(0, 2, size=(100, 3)) * 3e-161
    dist, idx = kneighbors(queries, prepare_keys(keys, dtype="float64"), 6, dtype="float64")
    assert small_tree[1]
    diff = queries[:, None, :] - keys[None, :, :]
    f = (diff[..., 0] ** 2 + diff[..., 1] ** 2) + diff[..., 2] ** 2
    order = np.lexsort((np.broadcast_to(np.arange(2000), f.shape), f), axis=1)[:, :6]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(dist, np.take_along_axis(f, order, 1))
