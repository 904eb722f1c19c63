"""AttentionKMeans: exactness against Lloyd's k-means, annealing, weights, interfaces, errors."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.cluster import KMeans, kmeans_plusplus
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

import skattention
from skattention.cluster import AttentionKMeans


@pytest.fixture(scope="module")
def blobs():
    return make_blobs(n_samples=600, centers=5, cluster_std=1.5, random_state=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_zero_is_lloyd(blobs, seed):
    X, _ = blobs
    init, _ = kmeans_plusplus(X, 6, random_state=seed)
    ours = AttentionKMeans(6, temperature=0, init=init, n_init=1, device="cpu").fit(X)
    ref = KMeans(6, init=init, n_init=1, algorithm="lloyd").fit(X)
    assert adjusted_rand_score(ours.labels_, ref.labels_) == 1.0
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-6)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    assert ours.n_iter_ == ref.n_iter_


def test_temperature_zero_same_seed_as_kmeans(blobs):
    X, _ = blobs
    for seed in range(3):
        ours = AttentionKMeans(5, temperature=0, random_state=seed, device="cpu").fit(X)
        ref = KMeans(5, random_state=seed, algorithm="lloyd").fit(X)
        np.testing.assert_array_equal(ours.labels_, ref.labels_)
        np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-6)


def test_lloyd_relocates_empty_clusters_like_kmeans():
    X = np.array([[0.0, 0], [0.1, 0], [0, 0.1], [5, 5], [5.1, 5], [9, 9]])
    init = np.array([[0.0, 0], [100, 100], [5, 5]])  # the second centre gets no point
    ours = AttentionKMeans(3, temperature=0, init=init, device="cpu").fit(X)
    ref = KMeans(3, init=init, n_init=1).fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-12)


def test_float32_stays_float32(blobs):
    X = blobs[0].astype(np.float32)
    km = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    assert km.cluster_centers_.dtype == np.float32
    assert km.transform(X).shape == (X.shape[0], 3)


def test_annealing_finds_the_blobs_whatever_the_seed():
    # 8 blobs where k-means++ with one init often merges two of them
    X, y = make_blobs(n_samples=4000, n_features=10, centers=8, cluster_std=2.0, random_state=0)
    aris, inertias = [], []
    for seed in range(4):
        km = AttentionKMeans(8, random_state=seed, device="cpu").fit(X)
        aris.append(adjusted_rand_score(y, km.labels_))
        inertias.append(km.inertia_)
        ref = KMeans(8, random_state=seed, algorithm="lloyd").fit(X)
        assert km.inertia_ <= ref.inertia_ * (1 + 1e-9)
    assert min(aris) > 0.99
    assert np.ptp(inertias) <= 1e-6 * inertias[0]


def test_annealing_ends_at_a_lloyd_fixed_point(blobs):
    X, _ = blobs
    km = AttentionKMeans(5, tol=0, random_state=0, device="cpu").fit(X)
    again = AttentionKMeans(5, temperature=0, tol=0, init=km.cluster_centers_, device="cpu").fit(X)
    np.testing.assert_array_equal(again.labels_, km.labels_)
    np.testing.assert_allclose(again.cluster_centers_, km.cluster_centers_, atol=1e-10)
    assert km.inertia_ == pytest.approx(-km.score(X))


def test_fixed_temperature_is_soft_kmeans(blobs):
    X, _ = blobs
    km = AttentionKMeans(5, temperature=4.0, tol=1e-12, random_state=0, device="cpu").fit(X)
    # fixed point: centres are the responsibility-weighted means at that temperature
    R = km.soft_assignments(X)
    np.testing.assert_allclose(R.sum(1), 1.0)
    centres = (R.T @ X) / R.sum(0)[:, None]
    np.testing.assert_allclose(centres, km.cluster_centers_, atol=1e-4)
    assert km.temperature_ == 4.0
    np.testing.assert_array_equal(km.predict(X), R.argmax(1))


def test_interfaces(blobs):
    X, _ = blobs
    km = AttentionKMeans(4, random_state=0, device="cpu").fit(X)
    D = km.transform(X)
    expected = np.sqrt(((X[:, None, :] - km.cluster_centers_[None]) ** 2).sum(2))
    np.testing.assert_allclose(D, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(km.predict(X), D.argmin(1))
    np.testing.assert_array_equal(km.labels_, km.predict(X))
    assert km.score(X) == pytest.approx(-(D.min(1) ** 2).sum())
    assert km.inertia_ == pytest.approx(-km.score(X))
    proba = km.predict_proba(X)
    assert proba.shape == (X.shape[0], 4)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    np.testing.assert_array_equal(proba.argmax(1), km.labels_)
    np.testing.assert_array_equal(km.soft_assignments(X, temperature=0), np.eye(4)[km.labels_])
    np.testing.assert_array_equal(clone(km).fit_predict(X), km.labels_)
    assert list(km.get_feature_names_out()) == [f"attentionkmeans{i}" for i in range(4)]
    loaded = pickle.loads(pickle.dumps(km))
    np.testing.assert_array_equal(loaded.predict(X), km.predict(X))
    assert isinstance(loaded.cluster_centers_, np.ndarray)


@pytest.mark.parametrize("temperature", [0, "auto"])
def test_sample_weight_equals_repetition(blobs, temperature):
    X, _ = blobs
    X = X[:200]
    rng = np.random.RandomState(0)
    w = rng.randint(0, 4, size=X.shape[0])
    init = X[w > 0][:5]
    weighted = AttentionKMeans(5, temperature=temperature, init=init, random_state=0, device="cpu")
    weighted.fit(X, sample_weight=w)
    repeated = AttentionKMeans(5, temperature=temperature, init=init, random_state=0, device="cpu")
    repeated.fit(np.repeat(X, w, axis=0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, atol=1e-8)
    assert weighted.inertia_ == pytest.approx(repeated.inertia_)


def test_memory_is_bounded_by_working_memory():
    # a tiny budget forces many blocks; the result must not change
    X, _ = make_blobs(n_samples=3000, centers=3, random_state=1)
    ref = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    with skattention.config_context(working_memory=0.05):
        small = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    np.testing.assert_array_equal(small.labels_, ref.labels_)
    np.testing.assert_allclose(small.cluster_centers_, ref.cluster_centers_, atol=1e-8)


def test_errors(blobs):
    X, _ = blobs
    with pytest.raises(ValueError, match="n_samples=3 should be >= n_clusters=4"):
        AttentionKMeans(4).fit(X[:3])
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        AttentionKMeans(2).fit(Xn)
    with pytest.raises(ValueError, match="0 sample"):
        AttentionKMeans(2).fit(np.empty((0, 2)))
    with pytest.raises(ValueError, match="shape of the initial centers"):
        AttentionKMeans(3, init=X[:2]).fit(X)
    with pytest.raises(ValueError, match="non-zero"):
        AttentionKMeans(2).fit(X, sample_weight=np.zeros(X.shape[0]))
    with pytest.raises(ValueError, match="temperature"):
        AttentionKMeans(2, temperature=-1.0).fit(X)
    with pytest.raises(ValueError, match="metric"):
        AttentionKMeans(2, metric="cosine").fit(X)
    km = AttentionKMeans(2, random_state=0, device="cpu").fit(X)
    with pytest.raises(ValueError, match="features"):
        km.predict(X[:, :1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_gpu_is_a_clear_error(blobs):
    with pytest.raises(ValueError, match="CUDA is not available"):
        AttentionKMeans(2, device="cuda").fit(blobs[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_matches_cpu(blobs):
    X, _ = blobs
    init, _ = kmeans_plusplus(X, 5, random_state=0)
    cpu = AttentionKMeans(5, temperature=0, init=init, device="cpu").fit(X)
    gpu = AttentionKMeans(5, temperature=0, init=init, device="cuda").fit(X)
    np.testing.assert_array_equal(cpu.labels_, gpu.labels_)
    assert isinstance(gpu.cluster_centers_, np.ndarray)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_labels_of_points_near_a_boundary_do_not_depend_on_the_batch(dtype):
    # Points a hair from the bisector of two centres: their labels turn on the last bits of
    # the distances, which the product rounded otherwise for one or two rows than for a block
    # of them (20 of 3,000 float32 single-row predictions differed from the batch's).
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(600, 6)) * 3 + 50).astype(dtype)
    km = AttentionKMeans(8, random_state=0).fit(X)
    C = km.cluster_centers_.astype(np.float64)
    normal, middle = C[1] - C[0], (C[0] + C[1]) / 2
    P = C[0] + rng.uniform(0.45, 0.55, size=(1500, 1)) * normal
    P += rng.normal(size=P.shape) * 1e-3
    P -= ((P - middle) @ normal / (normal @ normal))[:, None] * normal
    P = (P + rng.normal(size=(1500, 1)) * 1e-6 * normal).astype(dtype)
    whole = km.predict(P)
    assert 0 < np.mean(whole == whole[0]) < 1  # both sides of the boundary
    singles = np.array([km.predict(P[i : i + 1])[0] for i in range(len(P))])
    np.testing.assert_array_equal(singles, whole)
    pairs = np.concatenate([km.predict(P[i : i + 2]) for i in range(0, len(P), 2)])
    np.testing.assert_array_equal(pairs, whole)
