"""Classical estimators are exact special cases of metric attention (docs/theory.md, "Attention
solves a convex problem")."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_classification, make_regression
from sklearn.neighbors import (
    KNeighborsClassifier,
    KNeighborsRegressor,
    NearestNeighbors,
    RadiusNeighborsClassifier,
    RadiusNeighborsRegressor,
)

from skattention import MetricAttentionClassifier, MetricAttentionRegressor


@pytest.fixture(scope="module")
def classification():
    # Continuous features: no distance ties.
    X, y = make_classification(
        n_samples=600, n_features=6, n_informative=4, n_classes=3, random_state=0
    )
    return X[:450], y[:450], X[450:]


@pytest.fixture(scope="module")
def regression():
    X, y = make_regression(n_samples=500, n_features=5, n_targets=2, noise=5.0, random_state=0)
    return X[:400], y[:400], X[400:]


@pytest.mark.parametrize("k", [1, 4, 5, 15])
@pytest.mark.parametrize("dtype", [None, "float32"])
def test_knn_classifier(classification, k, dtype):
    X, y, Xq = classification
    knn = KNeighborsClassifier(n_neighbors=k).fit(X, y)
    att = MetricAttentionClassifier(
        "euclidean", n_neighbors=k, temperature=np.inf, dtype=dtype
    ).fit(X, y)
    np.testing.assert_allclose(att.predict_proba(Xq), knn.predict_proba(Xq), atol=1e-6)
    # Vote ties are broken by class order in both; compare where the vote is not tied.
    proba = knn.predict_proba(Xq)
    top2 = np.sort(proba, axis=1)[:, -2:]
    untied = top2[:, 1] > top2[:, 0]
    np.testing.assert_array_equal(att.predict(Xq)[untied], knn.predict(Xq)[untied])
    if k % 2 == 1 or k == 1:
        assert untied.mean() > 0.8


def test_zero_temperature_is_1nn(classification):
    X, y, Xq = classification
    nn1 = KNeighborsClassifier(n_neighbors=1).fit(X, y)
    for n_neighbors in [None, 7]:
        att = MetricAttentionClassifier("euclidean", temperature=0, n_neighbors=n_neighbors).fit(
            X, y
        )
        np.testing.assert_array_equal(att.predict(Xq), nn1.predict(Xq))
        np.testing.assert_array_equal(att.predict_proba(Xq), nn1.predict_proba(Xq))


def test_radius_classifier(classification):
    X, y, Xq = classification
    radius = 2.5
    dist, _ = NearestNeighbors().fit(X).kneighbors(Xq, 1)
    has_neighbor = dist[:, 0] < radius
    assert has_neighbor.mean() > 0.9
    rnc = RadiusNeighborsClassifier(radius=radius).fit(X, y)
    att = MetricAttentionClassifier("euclidean", radius=radius, temperature=np.inf).fit(X, y)
    Xr = Xq[has_neighbor]
    np.testing.assert_allclose(att.predict_proba(Xr), rnc.predict_proba(Xr), atol=1e-12)
    np.testing.assert_array_equal(att.predict(Xr), rnc.predict(Xr))
    with pytest.raises(ValueError, match="within radius=2.5"):
        att.predict(Xq[~has_neighbor])


@pytest.mark.parametrize("k", [1, 3, 10])
def test_knn_regressor(regression, k):
    X, y, Xq = regression
    knn = KNeighborsRegressor(n_neighbors=k).fit(X, y)
    att = MetricAttentionRegressor("euclidean", n_neighbors=k, temperature=np.inf).fit(X, y)
    np.testing.assert_allclose(att.predict(Xq), knn.predict(Xq), rtol=1e-12, atol=1e-9)
    att1 = MetricAttentionRegressor("euclidean", n_neighbors=k, temperature=np.inf).fit(X, y[:, 0])
    np.testing.assert_allclose(att1.predict(Xq), knn.predict(Xq)[:, 0], rtol=1e-12, atol=1e-9)
    assert att1.predict(Xq).shape == (len(Xq),)


def test_radius_regressor(regression):
    X, y, Xq = regression
    radius = 150.0
    ref = RadiusNeighborsRegressor(radius=radius).fit(X, y)
    att = MetricAttentionRegressor("euclidean", radius=radius, temperature=np.inf).fit(X, y)
    np.testing.assert_allclose(att.predict(Xq), ref.predict(Xq), rtol=1e-10)


@pytest.mark.parametrize("h", [0.5, 2.0, 10.0])
def test_nadaraya_watson(regression, h):
    X, y, Xq = regression
    # Independent computation of Gaussian kernel regression with bandwidth h.
    d2 = ((Xq[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    logk = -d2 / (2 * h**2)
    kern = np.exp(logk - logk.max(1, keepdims=True))
    expected = kern @ y / kern.sum(1, keepdims=True)
    att = MetricAttentionRegressor("euclidean", temperature=2 * h**2).fit(X, y)
    np.testing.assert_allclose(att.predict(Xq), expected, rtol=1e-9, atol=1e-9)
    # float32 compute agrees to float32 precision
    att32 = MetricAttentionRegressor("euclidean", temperature=2 * h**2, dtype="float32").fit(X, y)
    np.testing.assert_allclose(att32.predict(Xq), expected, rtol=1e-3, atol=1e-3 * np.abs(y).max())


def test_attention_weights_are_kneighbors(classification):
    X, y, Xq = classification
    nn = NearestNeighbors(n_neighbors=5).fit(X)
    att = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf).fit(X, y)
    w, idx = att.attention_weights(Xq)
    np.testing.assert_array_equal(idx, nn.kneighbors(Xq, return_distance=False))
    np.testing.assert_allclose(w, 0.2)
    # X=None: training points, each excluded from its own row, like kneighbors()
    w, idx = att.attention_weights()
    np.testing.assert_array_equal(idx, nn.kneighbors(return_distance=False))


def test_sample_weight_is_a_log_prior_equal_to_repetition(classification):
    X, y, Xq = classification
    rng = np.random.default_rng(0)
    sw = rng.integers(0, 4, size=len(X))
    repeated = np.repeat(np.arange(len(X)), sw)
    for cls, target in [(MetricAttentionClassifier, y), (MetricAttentionRegressor, X[:, 0] + y)]:
        a = cls("euclidean").fit(X, target, sample_weight=sw)
        b = cls("euclidean").fit(X[repeated], target[repeated])
        assert a.temperature_ == pytest.approx(b.temperature_)
        method = "predict_proba" if hasattr(a, "predict_proba") else "predict"
        np.testing.assert_allclose(
            getattr(a, method)(Xq), getattr(b, method)(Xq), rtol=1e-9, atol=1e-12
        )


def test_class_weight_balanced_is_the_inverse_frequency_prior():
    X, y = load_iris(return_X_y=True)
    keep = np.r_[0:50, 50:70, 100:110]  # unbalanced: 50 / 20 / 10
    X, y = X[keep], y[keep]
    T = 0.5
    bal = MetricAttentionClassifier("euclidean", temperature=T, class_weight="balanced").fit(X, y)
    counts = np.bincount(y)
    sw = (len(y) / (3 * counts))[y]
    manual = MetricAttentionClassifier("euclidean", temperature=T).fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(bal.predict_proba(X), manual.predict_proba(X))
    # dividing the prior by the class counts raises the minority class's probability
    plain = MetricAttentionClassifier("euclidean", temperature=T).fit(X, y)
    assert bal.predict_proba(X)[:, 2].mean() > plain.predict_proba(X)[:, 2].mean()


def test_attention_weights_dense_default_and_explicit(classification):
    X, y, Xq = classification
    att = MetricAttentionClassifier("euclidean", temperature=1.0).fit(X, y)
    w, idx = att.attention_weights(Xq[:5])
    assert w.shape == idx.shape == (5, 10)
    assert np.all(np.diff(w, axis=1) <= 0)  # largest first
    w_all, idx_all = att.attention_weights(Xq[:5], n_weights=len(X))
    np.testing.assert_allclose(w_all.sum(1), 1.0)
    # the weights reproduce predict_proba
    proba = np.zeros((5, 3))
    for c in range(3):
        proba[:, c] = (w_all * (y[idx_all] == c)).sum(1)
    np.testing.assert_allclose(proba, att.predict_proba(Xq[:5]), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_classes", [2, 3, 7])
def test_uniform_votes_are_scikit_learns_probabilities_to_the_bit(dtype, n_classes):
    # each class's count over their total, one division as scikit-learn's: a second division
    # by the rounded row sum moved them by an ulp (1/6 + 1/6 + 1/6 is not 1/2)
    # (continuous points: no tie at the k-th distance, which scikit-learn's brute force breaks
    # otherwise than by index)
    rng = np.random.default_rng(n_classes)
    X = rng.normal(size=(90, 2)).astype(dtype)
    y = rng.integers(0, n_classes, size=90)
    Xq = rng.normal(size=(40, 2)).astype(dtype)
    for k in (6, 7, 90):
        att = MetricAttentionClassifier("euclidean", n_neighbors=k, temperature=np.inf)
        knn = KNeighborsClassifier(n_neighbors=k, algorithm="brute")
        np.testing.assert_array_equal(att.fit(X, y).predict_proba(Xq),
                                      knn.fit(X, y).predict_proba(Xq))
    att = MetricAttentionClassifier("euclidean", radius=1.5, temperature=np.inf)
    rnc = RadiusNeighborsClassifier(radius=1.5, algorithm="brute")
    np.testing.assert_array_equal(att.fit(X, y).predict_proba(Xq),
                                  rnc.fit(X, y).predict_proba(Xq))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_weighted_uniform_votes_still_sum_to_one(dtype):
    # weighted votes are sums the compute dtype rounds: normalised by their sum
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3)).astype(dtype)
    y = rng.integers(0, 3, 200)
    for att, weight in [
        (MetricAttentionClassifier("euclidean", n_neighbors=7, temperature=np.inf,
                                   class_weight="balanced"), None),
        (MetricAttentionClassifier("euclidean", n_neighbors=7, temperature=np.inf),
         rng.uniform(0.5, 2.0, 200)),
    ]:
        proba = att.fit(X, y, sample_weight=weight).predict_proba(X)
        np.testing.assert_allclose(proba.sum(1), 1.0, rtol=0, atol=4e-16)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_integer_weights_vote_as_repeated_points_at_exact_ties(dtype):
    # exp(log 3) is 3.0000000000000004: at a tie of votes the weighted point's last bit won
    # where the repeated points tie and the first class wins (a quarter of these draws)
    rng = np.random.default_rng(0)
    for _ in range(40):
        X = rng.integers(0, 4, size=(12, 2)).astype(dtype)
        y = rng.integers(0, 2, size=12)
        w = rng.integers(1, 4, size=12)
        Xq = rng.integers(0, 4, size=(20, 2)).astype(dtype) + dtype(0.5)
        for att in [
            MetricAttentionClassifier("euclidean", n_neighbors=4, temperature=np.inf),
            MetricAttentionClassifier("euclidean", radius=1.6, temperature=np.inf,
                                      outlier_label="most_frequent"),
        ]:
            weighted = att.fit(X, y, sample_weight=w)
            proba, labels = weighted.predict_proba(Xq), weighted.predict(Xq)
            repeated = att.fit(np.repeat(X, w, 0), np.repeat(y, w))
            np.testing.assert_array_equal(proba, repeated.predict_proba(Xq))
            np.testing.assert_array_equal(labels, repeated.predict(Xq))
        att = MetricAttentionRegressor("euclidean", n_neighbors=4, temperature=np.inf)
        pred = att.fit(X, 1.1 * y, sample_weight=w).predict(Xq)
        np.testing.assert_array_equal(pred, att.fit(np.repeat(X, w, 0),
                                                    1.1 * np.repeat(y, w)).predict(Xq))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_integer_weights_give_the_repeated_points_probabilities_to_the_bit(dtype):
    # counted votes are each class's count over their total in one division: a second by
    # their rounded sum made 0.6 0.6000000000000001
    X = np.arange(11.0).reshape(-1, 1).astype(dtype)
    y = np.array([0, 1, 0, 0, 2, 2, 2, 2, 2, 2, 2])
    w = np.array([2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1])
    Xq = np.array([[0.0], [3.5], [7.25]], dtype=dtype)
    for kwargs, reference in [(dict(n_neighbors=10), KNeighborsClassifier(10)),
                              (dict(radius=4.0), RadiusNeighborsClassifier(radius=4.0))]:
        att = MetricAttentionClassifier("euclidean", temperature=np.inf, **kwargs)
        np.testing.assert_array_equal(
            att.fit(X, y, sample_weight=w).predict_proba(Xq),
            reference.fit(np.repeat(X, w, 0), np.repeat(y, w)).predict_proba(Xq))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("heavy", [1e3, 3e7, 1e16, 1e300])
def test_a_heavy_weight_leaves_the_lighter_keys_their_units(dtype, heavy):
    # the last key of the k units contributes the remainder: the weight before a key summed
    # less the key's own lost the light keys' units beside a heavy one
    X = np.arange(6.0)[:, None].astype(dtype)
    w = np.array([1.0, heavy, 1.0, 1.0, 1.0, 1.0])
    Xq = np.array([[2.0]], dtype=dtype)  # key 2 (one unit), then key 1 (the other three)
    reg = MetricAttentionRegressor("euclidean", n_neighbors=4, temperature=np.inf)
    assert reg.fit(X, np.arange(6.0), sample_weight=w).predict(Xq)[0] == (2 + 3 * 1) / 4
    clf = MetricAttentionClassifier("euclidean", n_neighbors=4, temperature=np.inf)
    proba = clf.fit(X, [0, 1, 0, 0, 0, 0], sample_weight=w).predict_proba(Xq)
    np.testing.assert_allclose(proba, [[0.25, 0.75]], rtol=1e-15)


@pytest.mark.parametrize("k", [3, 8, 10, 40])
def test_uniform_regressor_means_are_scikit_learns_to_the_bit(k):
    # scikit-learn averages with np.mean, a pairwise sum from 8 neighbours: the engine's
    # products summed in another order (1 ulp on most rows from k = 8)
    rng = np.random.RandomState(1)
    X, Xq = rng.randn(300, 3), rng.randn(60, 3)
    for y in [rng.randn(300), rng.randn(300, 2)]:
        att = MetricAttentionRegressor("euclidean", n_neighbors=k, temperature=np.inf)
        np.testing.assert_array_equal(att.fit(X, y).predict(Xq),
                                      KNeighborsRegressor(k).fit(X, y).predict(Xq))


@pytest.mark.parametrize("d", [3, 8, 15])
def test_distance_weights_and_distances_are_the_trees_to_the_bit(d):
    # scikit-learn's trees (its default search up to 15 features) sum a squared distance term
    # by term; NumPy's einsum summed 3 terms otherwise and tied points that the trees tell
    # apart (coordinates permuted: the same distance mathematically, not in floating point)
    rng = np.random.RandomState(0)
    X, Xq = rng.rand(400, d), rng.rand(80, d)
    # the two points nearest the origin at the same distance but for the order of its terms
    X[:2] = 0.0
    X[0, :3], X[1, :3] = [0.1, 0.1, 0.3], [0.3, 0.1, 0.1]
    Xq[0] = 0.0
    y = rng.randint(0, 3, 400)
    y[:2] = [1, 0]
    for k in (2, 5):
        att = MetricAttentionClassifier("euclidean", n_neighbors=k, temperature=np.inf,
                                        weights="distance").fit(X, y)
        ref = KNeighborsClassifier(k, weights="distance").fit(X, y)
        np.testing.assert_array_equal(att.predict_proba(Xq), ref.predict_proba(Xq))
        for ours, theirs in zip(att.kneighbors(Xq), ref.kneighbors(Xq), strict=True):
            np.testing.assert_array_equal(ours, theirs)
        reg = MetricAttentionRegressor("euclidean", n_neighbors=k, temperature=np.inf,
                                       weights="distance").fit(X, 1.3 * y)
        np.testing.assert_array_equal(
            reg.predict(Xq), KNeighborsRegressor(k, weights="distance").fit(X, 1.3 * y).predict(Xq))


def test_weighted_selections_stay_the_engines_multiplicities():
    # the uniform regressor's np.mean path is for unit weights only: equal weights of 2 count
    # as two copies each (as the classifier counts them), zero weights leave fewer keys (the
    # selection's padding was averaged in), tiny weights are ratios (they underflowed unshifted)
    rng = np.random.default_rng(0)
    X, y, Xq = rng.normal(size=(30, 2)), rng.normal(size=30), rng.normal(size=(4, 2))
    reg = MetricAttentionRegressor("euclidean", n_neighbors=5, temperature=np.inf)
    np.testing.assert_allclose(reg.fit(X, y, sample_weight=np.full(30, 2.0)).predict(Xq),
                               reg.fit(np.repeat(X, 2, 0), np.repeat(y, 2)).predict(Xq),
                               rtol=1e-12)
    w = np.zeros(30)
    w[:3] = 1.0
    np.testing.assert_allclose(reg.fit(X, y, sample_weight=w).predict(Xq), y[:3].mean(),
                               rtol=1e-12)
    dist = MetricAttentionRegressor("euclidean", n_neighbors=5, temperature=np.inf,
                                    weights="distance").fit(X, y, sample_weight=w)
    inverse = 1.0 / np.linalg.norm(Xq[:, None] - X[None, :3], axis=2)
    np.testing.assert_allclose(dist.predict(Xq), inverse @ y[:3] / inverse.sum(1), rtol=1e-12)
    att = MetricAttentionClassifier("euclidean", radius=1.5, temperature=np.inf,
                                    outlier_label="most_frequent")
    X32 = X.astype(np.float32)
    tiny = att.fit(X32, y > 0, sample_weight=np.full(30, 1e-50)).predict_proba(Xq)
    np.testing.assert_allclose(tiny, att.fit(X32, y > 0).predict_proba(Xq), atol=1e-6)


@pytest.mark.parametrize("radius", [0.0, np.inf])
def test_a_radius_of_zero_or_infinity_is_scikit_learns(radius):
    # 0: the training points equal to the query; inf: every training point
    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(40, 2)).astype(float)
    y, target = rng.integers(0, 3, 40), rng.normal(size=40)
    Xq = rng.integers(0, 4, size=(15, 2)).astype(float)
    att = MetricAttentionClassifier("euclidean", radius=radius, temperature=np.inf,
                                    outlier_label="most_frequent").fit(X, y)
    reference = RadiusNeighborsClassifier(radius=radius, outlier_label="most_frequent")
    np.testing.assert_array_equal(att.predict_proba(Xq), reference.fit(X, y).predict_proba(Xq))
    graph = NearestNeighbors().fit(X).radius_neighbors_graph(Xq, radius, mode="distance")
    assert abs(att.radius_neighbors_graph(Xq, radius, mode="distance") - graph).max() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no neighbour at radius 0: NaN, with a warning)
        ours = MetricAttentionRegressor("euclidean", radius=radius,
                                        temperature=np.inf).fit(X, target).predict(Xq)
        theirs = RadiusNeighborsRegressor(radius=radius).fit(X, target).predict(Xq)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
