"""AttentionMeanShift: the flat kernel is scikit-learn's MeanShift; Gaussian, blurring variants."""

import pickle

import numpy as np
import pytest
from sklearn.cluster import MeanShift, estimate_bandwidth
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from skattention._engine import _measured_threads, cpu_threads
from skattention.cluster import AttentionMeanShift


@pytest.fixture(scope="module")
def blobs():
    centers = [[0, 0], [6, 0], [0, 6], [6, 6]]
    return make_blobs(n_samples=400, centers=centers, cluster_std=0.6, random_state=0)


def _match(a, b):
    """Max distance from each centre of ``a`` to the nearest centre of ``b``."""
    return np.sqrt(((a[:, None] - b[None]) ** 2).sum(2)).min(1).max()


def test_flat_kernel_is_sklearn_mean_shift(blobs):
    X = blobs[0][::2]
    for kw in [dict(bandwidth=1.5, bin_seeding=True), dict(bandwidth=1.0, cluster_all=False)]:
        ours = AttentionMeanShift(kernel="flat", device="cpu", **kw).fit(X)
        ref = MeanShift(**kw).fit(X)
        np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-10)
        np.testing.assert_array_equal(ours.labels_, ref.labels_)


def test_gaussian_kernel_agrees_with_sklearn_on_blobs(blobs):
    X, y = blobs
    h = 1.5
    ours = AttentionMeanShift(bandwidth=h, device="cpu").fit(X)
    ref = MeanShift(bandwidth=h).fit(X)
    assert len(ours.cluster_centers_) == len(ref.cluster_centers_) == 4
    assert _match(ours.cluster_centers_, ref.cluster_centers_) < 0.3
    assert adjusted_rand_score(ours.labels_, ref.labels_) == 1.0
    assert adjusted_rand_score(ours.labels_, y) > 0.95


def test_modes_are_fixed_points_of_attention(blobs):
    X, _ = blobs
    h = 1.0
    ms = AttentionMeanShift(bandwidth=h, tol=1e-6, device="cpu").fit(X)
    for c in ms.cluster_centers_:
        w = np.exp(-((X - c) ** 2).sum(1) / (2 * h * h))
        np.testing.assert_allclose(w @ X / w.sum(), c, atol=1e-4)


def test_blurring_collapses_points_into_the_blobs(blobs):
    X, y = blobs
    ms = AttentionMeanShift(bandwidth=1.0, blurring=True, device="cpu").fit(X)
    assert len(ms.cluster_centers_) == 4
    assert adjusted_rand_score(ms.labels_, y) > 0.95
    assert adjusted_rand_score(ms.predict(X), y) > 0.95


def test_auto_bandwidth(blobs):
    X, y = blobs
    r = estimate_bandwidth(X, random_state=0)
    flat = AttentionMeanShift(kernel="flat", device="cpu").fit(X)
    assert flat.bandwidth_ == pytest.approx(r)
    gauss = AttentionMeanShift(device="cpu").fit(X)
    assert gauss.bandwidth_ == pytest.approx(r / 2.0)  # r / sqrt(n_features + 2)
    assert len(gauss.cluster_centers_) == 4


def test_predict_pickle_and_errors(blobs):
    X, _ = blobs
    ms = AttentionMeanShift(bandwidth=1.5, device="cpu").fit(X)
    loaded = pickle.loads(pickle.dumps(ms))
    np.testing.assert_array_equal(loaded.predict(X), ms.predict(X))
    with pytest.raises(ValueError, match="No point was within bandwidth"):
        AttentionMeanShift(bandwidth=0.1, kernel="flat", seeds=[[100.0, 100.0]]).fit(X)
    with pytest.raises(ValueError, match="NaN"):
        AttentionMeanShift().fit(np.array([[0.0, np.nan], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="bandwidth"):
        AttentionMeanShift(bandwidth=-1.0).fit(X)
    for kernel in ["gaussian", "flat"]:  # no grid cell that full: no seed
        with pytest.raises(ValueError, match="min_bin_freq=1000"):
            AttentionMeanShift(kernel=kernel, bin_seeding=True, min_bin_freq=1000).fit(X)


@pytest.mark.parametrize("kw", [dict(), dict(blurring=True), dict(kernel="flat", bandwidth=1.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_fit_does_not_depend_on_the_measured_thread_counts(blobs, monkeypatch, kw, dtype):
    # the steps' thread count follows their measured times (a busy machine: fewer threads);
    # here every step tries the other count and takes it: 2, 1, 2, ... threads
    X = blobs[0].astype(dtype)
    with cpu_threads(1):
        ref = AttentionMeanShift(device="cpu", **kw).fit(X)
    monkeypatch.setattr(_measured_threads, "_PROBE_INTERVAL", 1)
    monkeypatch.setattr(_measured_threads, "_SWITCH_SHARE", np.inf)
    counts = []
    original = _measured_threads.cpu_threads

    def counting(n):
        counts.append(n)
        return original(n)

    monkeypatch.setattr(_measured_threads, "cpu_threads", counting)
    with cpu_threads(2):
        ms = AttentionMeanShift(device="cpu", **kw).fit(X)
    assert 1 in counts
    np.testing.assert_array_equal(ms.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(ms.labels_, ref.labels_)
    assert ms.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("blurring", [False, True])
def test_float32_points_far_from_the_origin_converge_as_in_float64(blurring):
    # at an offset of 1e5 a float32 mode could not move by less than its spacing (0.008, above
    # tol * h): the seeds never stopped (n_iter_ = max_iter) and the clusters were wrong
    X = make_blobs(200, centers=3, random_state=0)[0] + 1e5
    f32 = AttentionMeanShift(blurring=blurring).fit(X.astype(np.float32))
    f64 = AttentionMeanShift(blurring=blurring).fit(X)
    assert f32.n_iter_ < f32.max_iter
    np.testing.assert_array_equal(f32.labels_, f64.labels_)
    assert f32.cluster_centers_.dtype == np.float32
    np.testing.assert_allclose(f32.cluster_centers_, f64.cluster_centers_, atol=0.05)
    if not blurring:
        np.testing.assert_array_equal(f32.predict(X.astype(np.float32)), f32.labels_)


@pytest.mark.parametrize(("dtype", "bandwidth"), [(np.float32, 1e-30), (np.float64, 1e-160)])
def test_overflowing_gaussian_kernel_advises_what_mean_shift_has(dtype, bandwidth):
    # the engine's advice named dtype=torch.float64 (an estimator's dtype='float64'), an
    # option AttentionMeanShift does not have (it computes in X's precision)
    X = np.random.default_rng(0).normal(size=(50, 2)).astype(dtype)
    with pytest.raises(ValueError, match="increase the bandwidth") as info:
        AttentionMeanShift(bandwidth=bandwidth).fit(X)
    assert "dtype=" not in str(info.value)
    assert ("pass X as float64" in str(info.value)) == (dtype == np.float32)


def test_float32_coordinates_overflowing_once_squared_advise_float64_input():
    X = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32) * np.float32(1e20)
    with pytest.raises(ValueError, match=r"rescale the data or pass X as float64 \(the fit "):
        AttentionMeanShift().fit(X)


@pytest.mark.parametrize("blurring", [False, True])
def test_flat_kernel_whose_estimated_bandwidth_overflows_says_so(blurring):
    # the engine's error named a radius the user never gave
    X = np.random.default_rng(0).normal(size=(50, 2)) * 1e160
    with pytest.raises(ValueError, match="estimated bandwidth is infinite.*rescale the data"):
        AttentionMeanShift(kernel="flat", blurring=blurring).fit(X)


@pytest.mark.parametrize(
    "kw", [dict(), dict(kernel="flat"), dict(blurring=True), dict(bin_seeding=True)]
)
def test_copies_of_one_point_are_one_cluster(kw):
    # the estimated bandwidth is 0: the rounded mean of the copies lay off them, within reach
    # of no point ("No point was within bandwidth=0"; blurring: two centres an ulp apart)
    X = np.tile([[1.764052345967664, 0.4001572083672233, 0.9787379841057392]], (20, 1))
    assert not np.array_equal(X.sum(0) / 20, X[0])  # the rounding the fit must not take
    ms = AttentionMeanShift(**kw).fit(X)
    assert ms.bandwidth_ == 0
    np.testing.assert_array_equal(ms.cluster_centers_, X[:1])
    np.testing.assert_array_equal(ms.labels_, np.zeros(20))
    np.testing.assert_array_equal(ms.predict(X[:2]), [0, 0])
