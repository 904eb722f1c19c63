"""``AttentionMeanShift(kernel="flat")`` against scikit-learn's ``MeanShift``.

Written after scikit-learn 1.9's ``sklearn/cluster/tests/test_mean_shift.py`` (its blobs,
intensity ties, orphans, ``max_iter`` and zero bandwidth), plus integer data whose points lie
exactly on the bandwidth of each other, duplicated rows, float32 and small blocks. Equal means
the same labels, the same centres (to rounding), the same ``n_iter_`` and the same ``predict``.
"""

import numpy as np
import pytest
from sklearn.cluster import MeanShift, estimate_bandwidth, get_bin_seeds
from sklearn.datasets import make_blobs
from sklearn.metrics import v_measure_score

import skattention
from skattention.cluster import AttentionMeanShift


@pytest.fixture(scope="module")
def blobs():
    centers = np.array([[1, 1], [-1, -1], [1, -1]]) + 10
    X, _ = make_blobs(
        n_samples=300, n_features=2, centers=centers, cluster_std=0.4, shuffle=True, random_state=11
    )
    return X


def flat(**kwargs):
    return AttentionMeanShift(kernel="flat", device="cpu", **kwargs)


def assert_same(ours, ref, X, atol=1e-10):
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=0, atol=atol)
    assert ours.cluster_centers_.dtype == ref.cluster_centers_.dtype
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blobs(blobs, dtype):
    # test_mean_shift, with every seed (no binning)
    X = blobs[::3].astype(dtype)
    for cluster_all, n_labels, first_label in [(True, 3, 0), (False, 4, -1)]:
        labels = np.unique(flat(bandwidth=1.2, cluster_all=cluster_all).fit(X).labels_)
        assert len(labels) == n_labels and labels[0] == first_label
    ours = flat(bandwidth=1.2, cluster_all=False).fit(X)
    assert_same(
        ours,
        MeanShift(bandwidth=1.2, cluster_all=False).fit(X),
        X,
        atol=1e-10 if dtype == np.float64 else 1e-5,
    )


def test_estimated_bandwidth_and_binning(blobs):
    X = blobs[::2]
    ours = flat(bin_seeding=True).fit(X)
    assert ours.bandwidth_ == pytest.approx(estimate_bandwidth(X))
    assert_same(ours, MeanShift(bin_seeding=True).fit(X), X)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_binning_with_the_bandwidth_as_given(dtype):
    # get_bin_seeds' float32 grid times the bandwidth is float64 for a NumPy float (the
    # estimate) and float32 for a Python float: on this grid the two seed sets end differently
    X = np.random.RandomState(0).randint(0, 5, size=(80, 2)).astype(dtype)
    assert_same(flat(bin_seeding=True).fit(X), MeanShift(bin_seeding=True).fit(X), X)
    h = np.float64(estimate_bandwidth(X))
    for kw in [dict(bin_seeding=True), dict(seeds=get_bin_seeds(X, h))]:  # float64 seeds
        assert_same(flat(bandwidth=h, **kw).fit(X), MeanShift(bandwidth=h, **kw).fit(X), X)


def test_fit_predict_is_predict(blobs):
    # test_meanshift_predict
    ms = flat(bandwidth=1.2)
    np.testing.assert_array_equal(ms.fit_predict(blobs[::3]), ms.predict(blobs[::3]))


def test_all_orphans_raise(blobs):
    # test_meanshift_all_orphans
    with pytest.raises(ValueError, match="No point was within bandwidth=0.1"):
        flat(bandwidth=0.1, seeds=[[-9, -9], [-10, -10]]).fit(blobs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_intensity_tie_order(dtype):
    # test_cluster_intensity_tie: equal intensities, the larger coordinates first
    X = np.array([[1, 1], [2, 1], [1, 0], [4, 7], [3, 5], [3, 6]], dtype=dtype)
    np.testing.assert_array_equal(flat(bandwidth=2).fit(X).labels_, [1, 1, 1, 0, 0, 0])
    X = np.array([[4, 7], [3, 5], [3, 6], [1, 1], [2, 1], [1, 0]], dtype=dtype)
    np.testing.assert_array_equal(flat(bandwidth=2).fit(X).labels_, [0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("max_iter", [1, 2])
def test_max_iter_and_n_iter(blobs, max_iter):
    # test_max_iter: a seed computes at most max_iter + 1 means, n_iter_ <= max_iter
    X = blobs[::4]
    ours = flat(bandwidth=1.0, max_iter=max_iter).fit(X)
    ref = MeanShift(bandwidth=1.0, max_iter=max_iter).fit(X)
    assert ours.n_iter_ <= max_iter
    assert_same(ours, ref, X)


def test_zero_estimated_bandwidth():
    # test_mean_shift_zero_bandwidth: most points coincide, the estimate is 0; binning (with a
    # zero bin size) changes nothing
    X = np.array([1, 1, 1, 2, 2, 2, 3, 3], dtype=float).reshape(-1, 1)
    ours = flat().fit(X)
    assert ours.bandwidth_ == 0
    assert v_measure_score(ours.labels_, [0, 0, 0, 1, 1, 1, 2, 2]) == pytest.approx(1)
    assert_same(ours, MeanShift().fit(X), X)
    for other in [
        flat(bin_seeding=True).fit(X),
        flat().fit(X.astype(np.float32)),
        AttentionMeanShift(device="cpu").fit(X),
    ]:  # the Gaussian kernel's zero-width limit
        np.testing.assert_array_equal(other.cluster_centers_, ours.cluster_centers_)
        np.testing.assert_array_equal(other.labels_, ours.labels_)
        assert other.n_iter_ == ours.n_iter_


def test_constant_data_converges():
    # test_convergence_of_1d_constant_data
    ms = flat().fit(np.ones((10, 1)))
    assert ms.n_iter_ == 0  # MeanShift's: the first mean is the seed itself


def test_issue_point_exactly_on_the_bandwidth():
    X = np.array([[7, 5], [0, 3], [3, 3]], dtype=float)
    ours = flat(bandwidth=3).fit(X)
    np.testing.assert_array_equal(ours.cluster_centers_, [[1.5, 3], [7, 5]])
    assert_same(ours, MeanShift(bandwidth=3).fit(X), X)


def test_without_cluster_all_a_point_at_exactly_the_bandwidth_keeps_its_label():
    # MeanShift compares the distance with the bandwidth: fl(sqrt(3))**2 is below 3
    X = np.array([[0.0, 0, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1], [-1, -1, -1]])
    kwargs = dict(bandwidth=float(np.sqrt(3.0)), cluster_all=False, seeds=[[0.0, 0, 0]])
    ours, ref = flat(**kwargs).fit(X), MeanShift(**kwargs).fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    assert (ours.labels_ == 0).all()


def test_predict_is_the_nearest_centre_even_without_cluster_all(blobs):
    X = blobs[::3]
    ours = flat(bandwidth=0.8, cluster_all=False).fit(X)
    ref = MeanShift(bandwidth=0.8, cluster_all=False).fit(X)
    assert (ours.labels_ == -1).any()
    assert_same(ours, ref, X)
    assert (ours.predict(X) >= 0).all()


def tied_data(kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "integer_grid":
        return rng.integers(0, 12, size=(80, 2)).astype(float), 3.0
    if kind == "duplicated_rows":
        base = rng.normal(size=(25, 2)) * 3
        return base[np.repeat(np.arange(25), rng.integers(1, 5, 25))], 1.5
    return np.hstack(
        [np.eye(4)[rng.integers(0, 4, 60)], np.eye(3)[rng.integers(0, 3, 60)]]
    ), np.sqrt(2)


@pytest.mark.parametrize("kind", ["integer_grid", "duplicated_rows", "one_hot"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tied_data(kind, dtype):
    X, bandwidth = tied_data(kind, 0)
    X = X.astype(dtype)
    assert_same(
        flat(bandwidth=bandwidth).fit(X),
        MeanShift(bandwidth=bandwidth).fit(X),
        X,
        atol=1e-10 if dtype == np.float64 else 1e-5,
    )


def test_small_blocks_change_nothing():
    X, bandwidth = tied_data("integer_grid", 0)
    ref = flat(bandwidth=bandwidth).fit(X)
    with skattention.config_context(working_memory=0.02):  # blocks of 15 seeds
        small = flat(bandwidth=bandwidth).fit(X)
        np.testing.assert_array_equal(small.predict(X), ref.predict(X))
    np.testing.assert_array_equal(small.labels_, ref.labels_)
    np.testing.assert_array_equal(small.cluster_centers_, ref.cluster_centers_)
    assert small.n_iter_ == ref.n_iter_
