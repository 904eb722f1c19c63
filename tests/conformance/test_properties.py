"""Property tests: the exact configurations on small integer grids (ties everywhere), duplicated
rows, and any batching of the queries (hypothesis, a bounded number of examples).

The properties issue 14 found failing carry its counterexample as an explicit example, so they
are checked on every run whatever the search draws.
"""

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.cluster import KMeans, MeanShift
from sklearn.neighbors import (
    KNeighborsClassifier,
    RadiusNeighborsRegressor,
)

from skattention import MetricAttentionClassifier, MetricAttentionRegressor
from skattention.cluster import AttentionKMeans, AttentionMeanShift

from ._cases import KNeighborsClassifierByIndex, KNeighborsRegressorByIndex

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def grid_points(min_rows, max_rows=24, side=5):
    return arrays(
        np.float64,
        st.tuples(st.integers(min_rows, max_rows), st.just(2)),
        elements=st.integers(0, side).map(float),
    )


@st.composite
def labelled_grid(draw, min_rows=4):
    X = draw(grid_points(min_rows))
    # at least two classes: the classifiers reject a single one
    labels = arrays(np.int64, len(X), elements=st.integers(0, 2))
    y = draw(labels.filter(lambda y: len(np.unique(y)) > 1))
    queries = draw(grid_points(1, 8, side=6))
    return X, y, queries


# The counterexamples, as (X, y, queries)
FOUR_EQUIDISTANT = (
    np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1]]),
    np.array([0, 1, 2, 0]),
    np.zeros((1, 2)),
)
TIE_AT_ZERO = (
    np.array([[-1.0, 0], [1, 0], [-5, 0], [5, 0]]),
    np.array([2, 1, 0, 0]),
    np.zeros((1, 2)),
)


@PROPERTY
@given(case=labelled_grid())
@example(case=FOUR_EQUIDISTANT)
def test_knn_classifier_on_integer_grids(case):
    X, y, Xq = case
    k = min(3, len(X))
    ours = MetricAttentionClassifier("euclidean", n_neighbors=k, temperature=np.inf).fit(X, y)
    ref = KNeighborsClassifierByIndex(n_neighbors=k).fit(X, y)
    np.testing.assert_array_equal(ours.predict_proba(Xq), ref.predict_proba(Xq))


@PROPERTY
@given(case=labelled_grid())
@example(case=TIE_AT_ZERO)
def test_zero_temperature_on_integer_grids(case):
    X, y, Xq = case
    ours = MetricAttentionClassifier("euclidean", temperature=0).fit(X, y)
    np.testing.assert_array_equal(
        ours.predict(Xq), KNeighborsClassifier(n_neighbors=1).fit(X, y).predict(Xq)
    )


@PROPERTY
@given(case=labelled_grid())
@example(case=(np.array([[4.0, 6], [1, 9], [3, 14]]), np.array([0, 1, 2]), np.array([[3.0, 19]])))
def test_radius_regressor_on_integer_grids(case):
    X, y, Xq = case
    ref = RadiusNeighborsRegressor(radius=5.0).fit(X, y.astype(float))
    has = ~np.isnan(ref.predict(Xq))
    ours = MetricAttentionRegressor("euclidean", radius=5.0, temperature=np.inf).fit(
        X, y.astype(float)
    )
    np.testing.assert_allclose(ours.predict(Xq[has]), ref.predict(Xq[has]), rtol=1e-12)


@PROPERTY
@given(X=grid_points(3, 12), copies=st.integers(2, 4))
@example(X=np.array([[0.0, 0], [0, 1], [1, 1], [3, 3], [3, 5], [4, 3], [5, 3]]), copies=4)
def test_knn_regressor_with_duplicated_rows(X, copies):
    # Each row repeated with different targets: which copies are among the k nearest matters.
    Xd = np.repeat(X, copies, axis=0)
    y = np.arange(len(Xd), dtype=float)
    k = copies - 1
    ours = MetricAttentionRegressor("euclidean", n_neighbors=k, temperature=np.inf).fit(Xd, y)
    np.testing.assert_allclose(
        ours.predict(X), KNeighborsRegressorByIndex(n_neighbors=k).fit(Xd, y).predict(X), rtol=1e-12
    )


@PROPERTY
@given(case=labelled_grid(min_rows=6), data=st.data())
@example(
    case=(
        np.array([[0.0, 0], [2, 0], [0, 2], [2, 2], [1, 3], [3, 1]] * 40),
        np.arange(240) % 3,
        np.array([[1.0, 1], [1, 1]] * 600),
    ),
    data=None,
)
def test_knn_predictions_do_not_depend_on_batching(case, data):
    X, y, Xq = case
    ours = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(X, y)
    whole = ours.predict_proba(Xq)
    for i in range(0, len(Xq), max(1, len(Xq) // 8)):
        np.testing.assert_array_equal(ours.predict_proba(Xq[i : i + 1]), whole[i : i + 1])


@settings(PROPERTY, max_examples=15)
@given(X=grid_points(2), data=st.data())
def test_nadaraya_watson_on_integer_grids_with_duplicates(X, data):
    X = np.r_[X, X[: len(X) // 2]]  # some rows twice
    y = data.draw(arrays(np.float64, len(X), elements=st.floats(-3, 3)))
    Xq = data.draw(grid_points(1, 6, side=6))
    ours = MetricAttentionRegressor("euclidean", temperature=2.0).fit(X, y)
    d2 = ((Xq[:, None] - X[None]) ** 2).sum(2)
    w = np.exp(-(d2 - d2.min(1, keepdims=True)) / 2.0)
    np.testing.assert_allclose(ours.predict(Xq), w @ y / w.sum(1), rtol=1e-10, atol=1e-12)
    # and any batching gives the same numbers
    np.testing.assert_allclose(
        np.concatenate([ours.predict(q[None]) for q in Xq]),
        ours.predict(Xq),
        rtol=1e-12,
        atol=1e-14,
    )


@settings(PROPERTY, max_examples=8)
@given(X=grid_points(3, 12, side=6), bandwidth=st.sampled_from([1.0, 2.0, 5**0.5, 3.0]))
def test_flat_mean_shift_on_integer_grids(X, bandwidth):
    ours = AttentionMeanShift(kernel="flat", bandwidth=bandwidth, device="cpu").fit(X)
    ref = MeanShift(bandwidth=bandwidth).fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=0, atol=1e-12)
    assert ours.n_iter_ == ref.n_iter_


@PROPERTY
@given(X=grid_points(3, 12, side=8), n_clusters=st.integers(2, 4))
@example(X=np.array([[1.0, 0], [0, 1], [0, 0], [0, 0], [0, 0], [0, 1]]), n_clusters=2)
def test_lloyd_on_integer_grids(X, n_clusters):
    # X and its mirror image: the mean is exactly 0, so centring and distances are exact and
    # points as far from two centres go to the first (in the example: [0, 0] from [1, 0], [0, 1]).
    init = X[:n_clusters]
    if len(np.unique(init, axis=0)) < n_clusters:
        init = init + np.arange(n_clusters)[:, None] * 0.5  # distinct starting centres
    X = np.r_[X, -X]
    ours = AttentionKMeans(n_clusters, temperature=0, init=init, n_init=1, device="cpu").fit(X)
    ref = KMeans(n_clusters, init=init, n_init=1, algorithm="lloyd").fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=0, atol=1e-10)
