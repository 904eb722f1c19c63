"""``AttentionKMeans(temperature=0)`` against ``KMeans(algorithm="lloyd")``.

Written after scikit-learn 1.9's ``sklearn/cluster/tests/test_k_means.py`` (its hand-computed
toy results, empty-cluster relocation, one-iteration check, weights and integer input), plus
tied assignments on integer grids, duplicated rows and one-hot data, small blocks, and CSR
input.
"""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs
from sklearn.metrics import pairwise_distances_argmin

import skattention
from skattention.cluster import AttentionKMeans

from ._cases import make_data


def lloyd(n_clusters, **kwargs):
    return AttentionKMeans(n_clusters, temperature=0, device="cpu", **kwargs)


def assert_same_fit(ours, ref, atol=1e-10):
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=0, atol=atol)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-6)
    assert ours.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hand_computed_toy_result(dtype):
    # test_kmeans_results
    X = np.array([[0, 0], [0.5, 0], [0.5, 1], [1, 1]], dtype=dtype)
    init = np.array([[0, 0], [1, 1]], dtype=dtype)
    km = lloyd(2, init=init, n_init=1).fit(X, sample_weight=[3, 1, 1, 3])
    np.testing.assert_array_equal(km.labels_, [0, 0, 1, 1])
    np.testing.assert_allclose(km.inertia_, 0.375)
    np.testing.assert_allclose(km.cluster_centers_, np.array([[0.125, 0], [0.875, 1]], dtype=dtype))
    assert km.n_iter_ == 2
    assert km.cluster_centers_.dtype == dtype


def test_empty_cluster_is_relocated():
    # test_kmeans_relocated_clusters: the far centre gets no point at the first iteration
    X = np.array([[0, 0], [0.5, 0], [0.5, 1], [1, 1]])
    km = lloyd(2, init=np.array([[0.5, 0.5], [3, 3]]), n_init=1).fit(X)
    ref = KMeans(2, init=np.array([[0.5, 0.5], [3, 3]]), n_init=1, algorithm="lloyd").fit(X)
    assert km.n_iter_ == 3
    np.testing.assert_allclose(km.inertia_, 0.25)
    assert_same_fit(km, ref)


def test_empty_cluster_relocated_with_weights():
    # test_kmeans_empty_cluster_relocated
    km = lloyd(2, init=np.array([[-1.0], [10.0]]), n_init=1).fit(
        [[-1.0], [1.0]], sample_weight=[1.9, 0.1]
    )
    assert len(set(km.labels_)) == 2
    np.testing.assert_allclose(km.cluster_centers_, [[-1], [1]])


def test_one_iteration_is_one_e_m_e_step():
    # test_k_means_1_iteration
    X = np.random.RandomState(0).uniform(size=(100, 5))
    init = X[:5]
    labels = pairwise_distances_argmin(X, init)
    centers = np.array([X[labels == j].mean(0) for j in range(5)])
    km = lloyd(5, init=init, n_init=1, max_iter=1).fit(X)
    np.testing.assert_array_equal(km.labels_, pairwise_distances_argmin(X, centers))
    np.testing.assert_allclose(km.cluster_centers_, centers)


@pytest.mark.parametrize("seed", [0, 1])
def test_same_random_state_same_result(seed):
    # test_kmeans_elkan_results' data, against lloyd: same k-means++ draws, same run
    X, _ = make_blobs(random_state=seed)
    X[X < 0] = 0
    assert_same_fit(
        lloyd(5, random_state=seed).fit(X), KMeans(5, random_state=seed, algorithm="lloyd").fit(X)
    )


def test_weights_are_repetition():
    # test_weighted_vs_repeated
    centers = np.array([[0.0, 5, 0, 0, 0], [1, 1, 4, 0, 0], [1, 0, 0, 5, 1]])
    X, _ = make_blobs(100, centers=centers, random_state=42)
    w = np.random.RandomState(0).randint(1, 5, size=100)
    weighted = lloyd(3, init=centers, n_init=1).fit(X, sample_weight=w)
    repeated = lloyd(3, init=centers, n_init=1).fit(np.repeat(X, w, axis=0))
    np.testing.assert_array_equal(repeated.labels_, np.repeat(weighted.labels_, w))
    np.testing.assert_allclose(weighted.inertia_, repeated.inertia_)
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_)


def test_integer_input_gives_float64_centres():
    # test_integer_input
    X = np.array([[0, 0], [10, 10], [12, 9], [-1, 1], [2, 0], [8, 10]])
    for init in ["k-means++", X[:2]]:
        km = lloyd(2, init=init, random_state=0).fit(X.astype(np.int32))
        assert km.cluster_centers_.dtype == np.float64
        assert len(set(km.labels_[[0, 3, 4]])) == len(set(km.labels_[[1, 2, 5]])) == 1
        assert km.labels_[0] != km.labels_[1]


@pytest.mark.parametrize("max_iter", [2, 100])
def test_predict_agrees_with_labels(max_iter):
    # test_kmeans_predict
    X, _ = make_blobs(n_samples=200, n_features=10, centers=10, random_state=0)
    km = lloyd(10, init="random", n_init=3, max_iter=max_iter, random_state=0).fit(X)
    np.testing.assert_array_equal(km.predict(X), km.labels_)
    np.testing.assert_array_equal(km.predict(km.cluster_centers_), np.arange(10))
    ref = KMeans(
        10, init="random", n_init=3, max_iter=max_iter, random_state=0, algorithm="lloyd"
    ).fit(X)
    assert_same_fit(km, ref)


def dyadic(data, dtype):
    """The tied data sets cut to 32 rows: integer (or 0/1) columns whose means are exact
    binary fractions, so that the centring both estimators do is exact and so are the distances
    (on other data scikit-learn's own Lloyd breaks exact ties by the rounding of its centred
    distances, e.g. 3 of the 22 tied one-hot rows of 60 at the first step)."""
    X = make_data(data, dtype)[0][:32]
    return np.unique(X, axis=0)[:4], X


@pytest.mark.parametrize("data", ["integer_grid", "duplicated_rows", "one_hot"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("working_memory", [None, 0.005])
def test_tied_data_matches_lloyd(data, dtype, working_memory):
    # Points equidistant from two centres go to the lower index in both.
    init, X = dyadic(data, dtype)
    if data == "duplicated_rows":  # continuous values: no exact ties, no exact centring needed
        X = make_data(data, dtype)[0]
    ref = KMeans(4, init=init, n_init=1, algorithm="lloyd").fit(X)
    budget = working_memory or skattention.get_config()["working_memory"]
    with skattention.config_context(working_memory=budget):
        ours = lloyd(4, init=init, n_init=1).fit(X)
        np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    assert_same_fit(ours, ref, atol=1e-10 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_sparse_input_matches_lloyd_on_sparse_input(dtype, init):
    # KMeans on a CSR matrix does not centre it and draws k-means++ from it as it is; so does
    # AttentionKMeans (then it centres each densified block): the same draws, the same run.
    import scipy.sparse as sp

    X, _ = make_blobs(n_samples=300, n_features=8, centers=5, random_state=0)
    X[np.random.RandomState(0).rand(*X.shape) < 0.5] = 0
    X = sp.csr_matrix(X.astype(dtype))
    n_init = 3 if init == "random" else 1
    ours = lloyd(5, init=init, n_init=n_init, random_state=0).fit(X)
    ref = KMeans(5, init=init, n_init=n_init, random_state=0, algorithm="lloyd").fit(X)
    assert_same_fit(ours, ref, atol=1e-10 if dtype == np.float64 else 1e-5)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours.transform(X), ref.transform(X), rtol=1e-5)


def test_runs_of_one_partition_keep_the_first_as_kmeans():
    # KMeans replaces its best run only by a lower-inertia run of another partition: two runs
    # stopped (tol) on one partition, numbered otherwise, kept the later one here
    rng = np.random.default_rng(127)
    n, d, k = int(rng.integers(20, 200)), int(rng.integers(1, 4)), int(rng.integers(2, 6))
    centres = rng.normal(size=(k, d)) * 3
    X = (centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))).astype(
        rng.choice([np.float32, np.float64]))
    kwargs = dict(init="k-means++", n_init=5, random_state=127, tol=1e-2)
    assert_same_fit(lloyd(k, **kwargs).fit(X), KMeans(k, algorithm="lloyd", **kwargs).fit(X))


@pytest.mark.parametrize("case", ["more clusters than points", "zero weights"])
def test_a_cluster_still_empty_goes_where_kmeans_puts_it(case):
    # after the relocation, at the heaviest cluster as KMeans' in-place division leaves it:
    # its weighted sum for an empty cluster before it, its centre after it
    if case == "more clusters than points":
        X, w = np.array([[0.0], [0.0], [0.0], [3.0], [3.0], [6.0]]), None
        kwargs = dict(init=np.array([[10.0], [0.0], [3.0], [6.0], [11.0]]), max_iter=1)
    else:
        X = np.array([[-6.55e-4], [2.32e-3], [8.87e-4], [-1.35e-3], [5.8e-4]])
        w = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
        kwargs = dict(init=np.array([[-0.0163], [-0.0124], [-0.0133]]))
    n_clusters = kwargs["init"].shape[0]
    ours = lloyd(n_clusters, n_init=1, **kwargs).fit(X, sample_weight=w)
    ref = KMeans(n_clusters, algorithm="lloyd", n_init=1, **kwargs).fit(X, sample_weight=w)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_array_equal(ours.cluster_centers_, ref.cluster_centers_)


def test_float32_inertia_from_the_differences():
    # the expanded ||x||^2 - 2 x.c + ||c||^2 lost float32 inertias' fourth digit
    rng = np.random.default_rng(3)
    X = (rng.normal(size=(300, 3)) + 100).astype(np.float32)
    ours = lloyd(4, random_state=0, n_init=1).fit(X)
    ref = KMeans(4, algorithm="lloyd", random_state=0, n_init=1).fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-6)
    assert -ours.score(X) == pytest.approx(ref.inertia_, rel=1e-6)
