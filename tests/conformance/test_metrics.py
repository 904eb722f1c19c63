"""The fixed metrics beyond the Euclidean one (``"manhattan"``, ``"minkowski"`` with ``p``,
``"cosine"``) against scikit-learn's neighbour estimators with the same ``metric`` and ``p``,
on the data with ties of ``_cases.py``, in float32 and float64, whatever the batching.

As for the Euclidean configurations, k-NN references choose among keys tied at the k-th
distance by index (``_cases._ByIndex``); radius estimators have no such choice and are
scikit-learn's own.
"""

import warnings

import numpy as np
import pytest
from sklearn.neighbors import (
    KNeighborsClassifier,
    KNeighborsRegressor,
    NearestNeighbors,
    RadiusNeighborsClassifier,
    RadiusNeighborsRegressor,
)

import skattention
from skattention import MetricAttentionClassifier, MetricAttentionRegressor, kneighbors

from ._cases import DATA, INF, _ByIndex, make_data, outputs

# (metric, p) -> radius: many distances on the integer grid and one-hot rows equal it, except
# for cosine (scikit-learn's cosine distances come from products of rows divided by their
# rounded norms: rows exactly at cos = 1/2 fall either side of 0.5 by a rounding; see
# test_cosine_boundary_and_rows_in_proportion)
METRICS = {("manhattan", 2): 2.0, ("minkowski", 3): 2.0, ("minkowski", 1.5): 2.0,
           ("cosine", 2): 0.45}


def exact_distances(X_fit, X, metric, p, reduced=False):
    """Float64 distances of every query to every training row, computed as the engine's exact
    values are (and as scikit-learn's trees compute them); ``reduced``: Minkowski's before
    the root (``sum |x_j - y_j|^p``, what scikit-learn ranks neighbours by)."""
    A = np.asarray(X, np.float64)[:, None, :]
    B = np.asarray(X_fit, np.float64)[None]
    if metric == "cosine":
        # one quotient before one root: rows at equal angles tie exactly (integer data)
        dot = (A * B).sum(-1)
        norms_sq = (A * A).sum(-1) * (B * B).sum(-1)
        cos = np.copysign(np.sqrt(dot * dot / np.where(norms_sq > 0, norms_sq, 1.0)), dot)
        return np.clip(1.0 - cos, 0.0, 2.0)
    diff = np.abs(A - B)
    if metric == "manhattan":
        return diff.sum(-1)
    reduced_distances = np.power(diff, p).sum(-1)
    return reduced_distances if reduced else np.power(reduced_distances, 1.0 / p)


class _ByMetricIndex(_ByIndex):
    """``_cases._ByIndex`` in the estimator's ``metric`` and ``p`` (Minkowski's distance ranked
    before its root, as scikit-learn ranks them: two sums apart by a rounding may have equal
    roots)."""

    def _nearest(self, X, n_neighbors):
        f = exact_distances(self._fit_X, X, self.metric, self.p, reduced=True)
        idx = np.argsort(f, axis=1, kind="stable")[:, :n_neighbors]
        return np.take_along_axis(exact_distances(self._fit_X, X, self.metric, self.p), idx,
                                  1), idx


class KNNClassifierByIndex(_ByMetricIndex, KNeighborsClassifier):
    pass


class KNNRegressorByIndex(_ByMetricIndex, KNeighborsRegressor):
    pass


def configs(metric, p, radius):
    """name -> (ours, scikit-learn's, classifier?)"""
    same = dict(metric=metric, p=p)
    out = {}
    for weights in ("uniform", "distance"):
        out[f"knn_{weights}_classifier"] = (
            MetricAttentionClassifier(n_neighbors=3, temperature=INF, weights=weights, **same),
            KNNClassifierByIndex(n_neighbors=3, weights=weights, **same), True)
        out[f"knn_{weights}_regressor"] = (
            MetricAttentionRegressor(n_neighbors=3, temperature=INF, weights=weights, **same),
            KNNRegressorByIndex(n_neighbors=3, weights=weights, **same), False)
        out[f"radius_{weights}_classifier"] = (
            MetricAttentionClassifier(radius=radius, temperature=INF, weights=weights, **same),
            RadiusNeighborsClassifier(radius=radius, weights=weights, **same), True)
        out[f"radius_{weights}_regressor"] = (
            MetricAttentionRegressor(radius=radius, temperature=INF, weights=weights, **same),
            RadiusNeighborsRegressor(radius=radius, weights=weights, **same), False)
    out["1nn_classifier"] = (MetricAttentionClassifier(temperature=0, **same),
                             KNNClassifierByIndex(n_neighbors=1, **same), True)
    return out


CASES = [
    pytest.param(metric, p, name, data, dtype, id=f"{metric}{p}-{name}-{data}-{dtype.__name__}")
    for (metric, p), radius in METRICS.items()
    for name in configs(metric, p, radius)
    for data in DATA
    for dtype in (np.float64, np.float32)
    # scikit-learn's cosine distance of rows in proportion (duplicates, integer rows) is a
    # rounding away from skattention's exact 0: inverse-distance weights differ there
    if not (metric == "cosine" and "distance" in name and data != "continuous")
]


@pytest.mark.parametrize("metric, p, name, data, dtype", CASES)
def test_fixed_metrics_match_scikit_learn(metric, p, name, data, dtype):
    radius = METRICS[metric, p]
    ours, ref, classifier = configs(metric, p, radius)[name]
    X, y_class, y_reg, Xq = make_data(data, dtype)
    y = y_class if classifier else y_reg
    if name.startswith("radius"):
        Xq = Xq[(exact_distances(X, Xq, metric, p) <= radius).any(1)]
    ours.fit(X, y)
    ref.fit(X, y)
    got, want = outputs(ours, Xq, classifier), outputs(ref, Xq, classifier)
    if metric == "cosine" and dtype == np.float32 and "distance" in name:
        # scikit-learn computes cosine distances of float32 data in float32 (brute force
        # only), skattention in float64 (its exact values): weights agree to float32 precision
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        return
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if classifier:
        np.testing.assert_array_equal(ours.predict(Xq), ref.predict(Xq))


@pytest.mark.parametrize("metric, p", list(METRICS))
@pytest.mark.parametrize("data", ["continuous", "integer_grid", "duplicated_rows"])
def test_kneighbors_and_radius_neighbors_in_any_batch(metric, p, data):
    # the neighbours and distances of kneighbors / radius_neighbors, equal to the reference,
    # in blocks of a few queries and keys
    X, y, _, Xq = make_data(data)
    radius = METRICS[metric, p]
    model = MetricAttentionClassifier(metric, p=p, n_neighbors=4, temperature=INF).fit(X, y)
    want_dist, want_idx = KNNClassifierByIndex(n_neighbors=4, metric=metric, p=p).fit(
        X, y).kneighbors(Xq)
    sk_rad = NearestNeighbors(radius=radius, metric=metric, p=p).fit(X)
    for budget in (None, 0.01):
        with skattention.config_context(working_memory=budget):
            dist, idx = model.kneighbors(Xq)
            rad_dist, rad_idx = model.radius_neighbors(Xq, radius)
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_allclose(dist, want_dist, rtol=1e-12, atol=1e-12)
        want_rad = sk_rad.radius_neighbors(Xq, return_distance=False)
        for got_d, got_i, want_i in zip(rad_dist, rad_idx, want_rad, strict=True):
            assert sorted(got_i) == sorted(want_i)
            assert (got_d <= radius).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_minkowski_with_p_1_and_2_is_manhattan_and_euclidean(dtype):
    X, y, _, Xq = make_data("integer_grid", dtype)
    for p, other in [(1, "manhattan"), (2, "euclidean")]:
        a = MetricAttentionRegressor("minkowski", p=p, temperature=0.7).fit(X, y.astype(float))
        b = MetricAttentionRegressor(other, temperature=0.7).fit(X, y.astype(float))
        np.testing.assert_array_equal(a.predict(Xq), b.predict(Xq))


@pytest.mark.parametrize("metric, p", list(METRICS))
def test_dense_attention_is_the_kernel_of_the_metric(metric, p):
    # Nadaraya-Watson with the kernel exp(-f / T): f the distance (Manhattan, cosine) or its
    # p-th power (Minkowski)
    X, _, y, Xq = make_data("continuous")
    T = 0.8
    model = MetricAttentionRegressor(metric, p=p, temperature=T).fit(X, y)
    d = exact_distances(X, Xq, metric, p)
    f = d**p if metric == "minkowski" else d
    w = np.exp(-(f - f.min(1, keepdims=True)) / T)
    np.testing.assert_allclose(model.predict(Xq), w @ y / w.sum(1), rtol=1e-10)


def test_cosine_boundary_and_rows_in_proportion():
    # one-hot rows sharing one of two ones are at cosine distance exactly 0.5: inside the
    # radius 0.5 (scikit-learn's rounded products put some outside); rows in proportion are at
    # distance exactly 0 and tie by index
    X = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [2.0, 2.0, 0.0], [1.0, 0.0, 1.0]])
    model = MetricAttentionRegressor("cosine", radius=0.5, temperature=INF).fit(X, [1, 2, 3, 4])
    dist, idx = model.radius_neighbors(X[:1], sort_results=True)
    np.testing.assert_array_equal(idx[0], [0, 2, 1, 3])
    np.testing.assert_array_equal(dist[0], [0.0, 0.0, 0.5, 0.5])


def test_cosine_zero_rows_and_scaled_copies():
    # a zero row is at distance 1 from every row (scikit-learn's normalize leaves it zero);
    # a row and its scaled copies are at distance 0
    X = np.array([[1.0, 2.0], [2.0, 4.0], [0.0, 0.0], [3.0, -1.0]])
    dist, idx = kneighbors(np.array([[0.5, 1.0], [0.0, 0.0]]), X, 4, metric="cosine",
                           dtype="float64")
    np.testing.assert_array_equal(idx[0, :2], [0, 1])
    np.testing.assert_array_equal(dist[0, :2], [0.0, 0.0])
    np.testing.assert_array_equal(dist[1], [1.0, 1.0, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sk = NearestNeighbors(metric="cosine").fit(X).kneighbors([[0.5, 1.0]], 2)[0]
    np.testing.assert_allclose(dist[0, :2], sk[0], atol=1e-15)


@pytest.mark.parametrize("p", [0.5, np.inf])
def test_minkowski_p_out_of_range(p):
    X, y, _, _ = make_data("continuous")
    with pytest.raises(ValueError, match="p"):
        MetricAttentionClassifier("minkowski", p=p, n_neighbors=3, temperature=INF).fit(X, y)
