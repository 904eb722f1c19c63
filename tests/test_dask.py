"""Estimators fitted on Dask collections: keys sharded over the workers, merged exactly.

Cheap equality tests run on Dask's synchronous scheduler; a few run on a real LocalCluster of two
worker processes (the keys live in the workers' memory, the client holds none of them).
"""

import pickle
from contextlib import nullcontext

import numpy as np
import pytest

from skattention import AttentionKMeans, MetricAttentionClassifier, MetricAttentionRegressor

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")

CHUNKS = (70, 31, 150, 49)  # uneven partitions: 300 rows


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.integers(0, 4, size=(300, 3)).astype(np.float64)
    X[200:260] = X[:60]  # duplicated rows in other partitions: ties across shards
    y = rng.integers(0, 3, 300)
    Q = rng.integers(0, 4, size=(40, 3)).astype(np.float64) + rng.normal(0, 0.3, (40, 3))
    weight = rng.choice([0.5, 1.0, 3.0], size=300)
    return X, y, Q, weight


@pytest.fixture
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def dask_rows(A, chunks=CHUNKS):
    return da.from_array(A, chunks=(chunks, *A.shape[1:]))


SETTINGS = [
    dict(temperature=0.7),
    dict(temperature=np.inf),
    dict(temperature=0.0),
    dict(temperature=1.0, n_neighbors=7),
    dict(temperature=np.inf, n_neighbors=5),
    dict(temperature=0.5, radius=1.2, outlier_label="most_frequent"),
    dict(temperature=1.0, n_neighbors=4, radius=1.5, outlier_label=-1),
    dict(temperature="auto", class_weight="balanced"),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("settings", SETTINGS)
def test_sharded_classifier_equals_in_memory(synchronous, data, settings, dtype):
    X, y, Q, weight = data
    X, Q = X.astype(dtype), Q.astype(dtype)
    clf = MetricAttentionClassifier("euclidean", **settings)
    expected = clf.fit(X, y, sample_weight=weight)
    exp_proba, exp_labels = expected.predict_proba(Q), expected.predict(Q)
    sharded = MetricAttentionClassifier("euclidean", **settings).fit(
        dask_rows(X), dask_rows(y), sample_weight=dask_rows(weight)
    )
    assert dask.is_dask_collection(sharded._keys.points)
    assert sharded.temperature_ == expected.temperature_
    assert sharded.outlier_label_ == expected.outlier_label_
    np.testing.assert_array_equal(sharded.predict(Q), exp_labels)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(sharded.predict_proba(Q), exp_proba, rtol=rtol, atol=rtol)
    # dask queries give a lazy dask result, the same numbers
    lazy = sharded.predict_proba(dask_rows(Q, (25, 15)))
    assert isinstance(lazy, da.Array) and lazy.shape == exp_proba.shape
    np.testing.assert_allclose(lazy.compute(), exp_proba, rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(sharded.predict(dask_rows(Q, (25, 15))).compute(), exp_labels)


def test_sharded_most_frequent_counts_sample_weight(synchronous, data):
    X, y, _, _ = data
    clf = MetricAttentionClassifier("euclidean", radius=0.1, temperature=np.inf,
                                    outlier_label="most_frequent")
    assert clf.fit(dask_rows(X), dask_rows(y)).outlier_label_ == 1  # the most rows
    weight = np.where(y == 2, 5.0, 1.0)  # class 2 has the fewest rows, the most weight
    assert clf.fit(dask_rows(X), dask_rows(y), sample_weight=dask_rows(weight)).outlier_label_ == 2
    assert clf.fit(X, y, sample_weight=weight).outlier_label_ == 2


@pytest.mark.parametrize("settings", [dict(temperature=0.3), dict(temperature=1.0, n_neighbors=6),
                                      dict(temperature=0.3, radius=0.9)])
def test_sharded_regressor_equals_in_memory(synchronous, data, settings, monkeypatch):
    from skattention.neighbors import _dask

    monkeypatch.setattr(_dask, "_QUERY_ROWS", 16)  # several query blocks
    X, _, Q, weight = data
    y = np.c_[X[:, 0] - X[:, 1], X[:, 2] ** 2]
    expected = MetricAttentionRegressor("euclidean", **settings).fit(X, y, sample_weight=weight)
    sharded = MetricAttentionRegressor("euclidean", **settings).fit(
        dask_rows(X), dask_rows(y), sample_weight=weight
    )
    Q = np.vstack([Q, [[50.0, 50.0, 50.0]]])  # no neighbour within a radius: NaN, a warning
    radius = "radius" in settings
    with pytest.warns(UserWarning, match="no neighbors") if radius else nullcontext():
        exp = expected.predict(Q)
    with pytest.warns(UserWarning, match="no neighbors") if radius else nullcontext():
        got = sharded.predict(Q)
    np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    lazy = sharded.predict(dask_rows(Q, (41,)))
    assert isinstance(lazy, da.Array) and lazy.shape == exp.shape


def test_sharded_kneighbors(synchronous, data):
    X, y, Q, weight = data
    weight = weight.copy()
    weight[::7] = 0  # zero-weight training points are no one's neighbours
    settings = dict(temperature=1.0, n_neighbors=4)
    expected = MetricAttentionClassifier("euclidean", **settings).fit(X, y, sample_weight=weight)
    sharded = MetricAttentionClassifier("euclidean", **settings).fit(
        dask_rows(X), y, sample_weight=weight)
    for k in (4, 9):
        dist, idx = sharded.kneighbors(Q, k)
        exp_dist, exp_idx = expected.kneighbors(Q, k)
        np.testing.assert_array_equal(idx, exp_idx)
        np.testing.assert_array_equal(dist, exp_dist)
    np.testing.assert_array_equal(sharded.kneighbors(Q, 3, return_distance=False),
                                  expected.kneighbors(Q, 3, return_distance=False))
    # float32 distances: from the coordinates in memory, the selection's over sharded keys
    # (whose points stay on the cluster)
    learned = MetricAttentionClassifier("mlp", max_iter=2, hidden_size=8, random_state=0).fit(
        dask_rows(X.astype(np.float32)), y)
    dist, idx = learned.kneighbors(Q, 3)
    assert dist.shape == idx.shape == (len(Q), 3) and np.all(np.diff(dist, axis=1) >= 0)


def test_dataframe_with_categories(synchronous):
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"a": rng.normal(size=200), "b": rng.normal(size=200),
                          "colour": rng.choice(["red", "green", "blue"], 200)})
    y = pd.Series((frame.a > 0).astype(int) + (frame.colour == "red"), name="y")
    clf = MetricAttentionClassifier("euclidean", temperature=0.5, n_neighbors=5)
    expected = clf.fit(frame, y).predict_proba(frame.iloc[:30])
    sharded = MetricAttentionClassifier("euclidean", temperature=0.5, n_neighbors=5).fit(
        dd.from_pandas(frame, npartitions=3), dd.from_pandas(y, npartitions=3)
    )
    assert list(sharded.feature_names_in_) == ["a", "b", "colour"]
    np.testing.assert_array_equal(sharded.predict_proba(frame.iloc[:30]), expected)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=5
def test_learned_metric_trains_on_the_sample(synchronous, data):
    X, y, Q, _ = data
    settings = dict(metric="linear", max_iter=5, random_state=0, early_stopping=False)
    expected = MetricAttentionClassifier(**settings).fit(X, y)
    sharded = MetricAttentionClassifier(**settings).fit(dask_rows(X), y)
    # 300 rows: the sample is every row, so the map is the in-memory one
    assert sharded.temperature_ == pytest.approx(expected.temperature_)
    np.testing.assert_allclose(sharded.predict_proba(Q), expected.predict_proba(Q), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("settings", [
    dict(metric="euclidean", n_neighbors=5, temperature=np.inf, trend="linear"),
    dict(metric="linear", max_iter=2, random_state=0, early_stopping=False),  # trend "auto"
])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=2
def test_regressor_trend_on_sharded_keys(synchronous, data, settings):
    # 300 rows: the sample is every row, so the trend (and map) are the in-memory ones, and
    # the workers hold the residuals
    X, y, Q, _ = data
    target = X @ [1.0, -2.0, 0.5] + y
    expected = MetricAttentionRegressor(**settings).fit(X, target)
    sharded = MetricAttentionRegressor(**settings).fit(dask_rows(X), target)
    assert expected.trend_ is not None
    np.testing.assert_allclose(sharded.trend_.coef_, expected.trend_.coef_, rtol=1e-12)
    np.testing.assert_allclose(sharded.predict(Q), expected.predict(Q), rtol=1e-5, atol=1e-6)
    # Dask queries too: lazily, on the workers (found in review: the trend was left out there)
    lazy = sharded.predict(dask_rows(Q, 20)).compute()
    np.testing.assert_allclose(lazy, expected.predict(Q), rtol=1e-5, atol=1e-6)


def test_pickle_computes_the_sharded_state(synchronous, data):
    X, y, Q, _ = data
    sharded = MetricAttentionClassifier("euclidean", temperature=0.7).fit(dask_rows(X), y)
    loaded = pickle.loads(pickle.dumps(sharded))
    assert isinstance(loaded._keys.points, np.ndarray)
    np.testing.assert_array_equal(loaded._keys.points, X)
    np.testing.assert_allclose(loaded.predict_proba(Q), sharded.predict_proba(Q), rtol=1e-12)
    assert dask.is_dask_collection(sharded._keys.points)  # the original stays sharded


def test_sharded_errors(synchronous, data):
    X, y, Q, weight = data
    with pytest.raises(ValueError, match="rows but y has"):
        MetricAttentionClassifier("euclidean", temperature=1.0).fit(dask_rows(X), y[:-1])
    with pytest.raises(ValueError, match="n_neighbors=400"):
        MetricAttentionClassifier("euclidean", n_neighbors=400).fit(dask_rows(X), y)
    with pytest.raises(ValueError, match="at least one non-zero"):
        MetricAttentionClassifier("euclidean", temperature=1.0).fit(
            dask_rows(X), y, sample_weight=np.zeros(300))
    bad = X.copy()
    bad[250, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        MetricAttentionClassifier("euclidean", temperature=1.0).fit(dask_rows(bad), y)
    clf = MetricAttentionClassifier("euclidean", temperature=1.0).fit(dask_rows(X), y)
    with pytest.raises(NotImplementedError, match="sharded over a Dask cluster"):
        clf.attention_weights(Q)
    with pytest.raises(ValueError, match="one label per row"):
        MetricAttentionClassifier("euclidean", temperature=1.0).fit(dask_rows(X), np.c_[y, y])
    with pytest.raises(NotImplementedError, match="sharded over a Dask cluster"):
        clf.kneighbors()  # the training points as queries: all keys in one process
    for method in (clf.radius_neighbors, clf.radius_neighbors_graph):  # (an AttributeError)
        with pytest.raises(NotImplementedError, match="sharded over a Dask cluster"):
            method(Q, 1.0)
    with pytest.raises(ValueError, match="numeric temperature"):
        AttentionKMeans(3).fit(dask_rows(X))


def test_kmeans_temperature_too_small_for_the_data_is_refused_as_in_memory(synchronous):
    # the Dask fit kept its initial centroids silently where the in-memory fit refuses
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 1.0, size=(100, 3)) for c in (0, 4, 8)]) * 1e150
    for data in (X, dask_rows(X)):
        with pytest.raises(ValueError, match="too small for X's scale"):
            AttentionKMeans(3, temperature=1e-10, random_state=0).fit(data)
    km = AttentionKMeans(3, temperature=1e290, random_state=0).fit(dask_rows(X))
    assert np.isfinite(km.cluster_centers_).all()


@pytest.mark.parametrize("temperature", [0.0, 1.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kmeans_equals_in_memory(synchronous, temperature, dtype):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 1.0, size=(100, 3)) for c in (0, 4, 8)]).astype(dtype)
    rng.shuffle(X)
    weight = rng.choice([0.5, 1.0, 2.0], size=300).astype(dtype)
    # Lloyd: a duplicated centre, an empty cluster to relocate (soft k-means would keep the
    # two centres together, an unstable fixed point that amplifies rounding)
    init = np.vstack([X[:4], X[:1]]) if temperature == 0 else X[:5]
    settings = dict(n_clusters=5, temperature=temperature, init=init, tol=1e-6)
    expected = AttentionKMeans(**settings).fit(X, sample_weight=weight)
    sharded = AttentionKMeans(**settings).fit(dask_rows(X), sample_weight=dask_rows(weight))
    assert dask.is_dask_collection(sharded.labels_)
    np.testing.assert_array_equal(sharded.labels_.compute(), expected.labels_)
    assert sharded.n_iter_ == expected.n_iter_
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(sharded.cluster_centers_, expected.cluster_centers_, rtol=rtol,
                               atol=rtol)
    assert sharded.inertia_ == pytest.approx(expected.inertia_, rel=rtol)
    assert sharded.cluster_centers_.dtype == expected.cluster_centers_.dtype



def test_kmeans_with_an_empty_partition(synchronous):
    # a partition emptied by a filter (unknown chunk sizes) holds no points, as in memory
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(c, 1.0, size=(60, 2)) for c in (0, 6)])
    keep = np.ones(120, dtype=bool)
    keep[40:80] = False
    Xd = dask_rows(X, (40, 40, 40))
    Xd = Xd[dask_rows(keep, (40, 40, 40))]
    weight = rng.choice([0.5, 2.0], size=120)
    wd = dask_rows(weight, (40, 40, 40))[dask_rows(keep, (40, 40, 40))]
    for temperature in (0.0, 1.0):
        settings = dict(n_clusters=2, temperature=temperature, init=X[[0, 100]])
        expected = AttentionKMeans(**settings).fit(X[keep], sample_weight=weight[keep])
        sharded = AttentionKMeans(**settings).fit(Xd, sample_weight=wd)
        np.testing.assert_array_equal(sharded.labels_.compute(), expected.labels_)
        np.testing.assert_allclose(sharded.cluster_centers_, expected.cluster_centers_,
                                   rtol=1e-10)


def test_kmeans_labels_dtype_as_in_memory(synchronous):
    # int32 as KMeans' and the in-memory fit's; the lazy predict's declared dtype is the
    # computed one
    X = np.random.default_rng(6).normal(size=(90, 2))
    km = AttentionKMeans(2, temperature=0, init=X[:2]).fit(dask_rows(X, (40, 50)))
    assert km.labels_.dtype == km.labels_.compute().dtype == np.int32
    lazy = km.predict(dask_rows(X, (40, 50)))
    assert lazy.dtype == lazy.compute().dtype == km.predict(X).dtype


def test_kmeans_dataframe_feature_names(synchronous):
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({"a": rng.normal(size=80), "b": rng.normal(size=80)})
    km = AttentionKMeans(2, temperature=0, init=frame.to_numpy()[:2])
    km.fit(dd.from_pandas(frame, npartitions=2))
    assert list(km.feature_names_in_) == ["a", "b"]
    with pytest.raises(ValueError, match="feature names"):
        km.predict(frame[["b", "a"]])

# ---------------------------------------------------------------------- a real cluster


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def test_keys_stay_on_the_workers(client):
    from distributed import futures_of

    rng = np.random.default_rng(2)
    X = rng.normal(size=(4000, 8))
    y = rng.integers(0, 4, 4000)
    Q = rng.normal(size=(50, 8))
    Xd = da.from_array(X, chunks=(1000, 8))
    clf = MetricAttentionClassifier("euclidean", temperature=0.5, n_neighbors=9)
    sharded = clf.fit(Xd, da.from_array(y, chunks=1000))
    # persisted: the keys are futures held by both workers, not arrays on the client
    futures = futures_of(sharded._keys.points)
    assert len(futures) == 4
    holders = client.who_has(futures)
    assert len({w for ws in holders.values() for w in ws}) == 2
    held = sum(v.nbytes for v in vars(sharded).values() if isinstance(v, np.ndarray))
    assert held < X.nbytes / 20
    expected = MetricAttentionClassifier("euclidean", temperature=0.5, n_neighbors=9).fit(X, y)
    np.testing.assert_array_equal(sharded.predict_proba(Q), expected.predict_proba(Q))
    lazy = sharded.predict(da.from_array(Q, chunks=20))
    np.testing.assert_array_equal(lazy.compute(), expected.predict(Q))


def test_lazy_predictions_outlive_the_model(client):
    # the lazy result holds the persisted key partitions: computing it after the model is
    # gone (``fit(...).predict(Q)`` in one expression) must not lose them on the scheduler
    import gc

    rng = np.random.default_rng(4)
    X = rng.normal(size=(600, 3))
    Q = rng.normal(size=(40, 3))
    expected = MetricAttentionRegressor("euclidean", temperature=0.5).fit(X, X[:, 0]).predict(Q)
    lazy = MetricAttentionRegressor("euclidean", temperature=0.5).fit(
        da.from_array(X, chunks=(150, 3)), X[:, 0]).predict(da.from_array(Q, chunks=20))
    gc.collect()
    np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-12, atol=1e-12)

def test_dense_attention_and_kmeans_on_the_cluster(client):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 4))
    Q = rng.normal(size=(30, 4))
    Xd = da.from_array(X, chunks=(700, 4))
    reg = MetricAttentionRegressor("euclidean", temperature=0.4)
    expected = reg.fit(X, X[:, 0]).predict(Q)
    sharded = MetricAttentionRegressor("euclidean", temperature=0.4).fit(
        Xd, da.from_array(X[:, 0], chunks=700))
    np.testing.assert_allclose(sharded.predict(Q), expected, rtol=1e-12, atol=1e-12)
    init = X[:6]
    km = AttentionKMeans(6, temperature=0, init=init).fit(X)
    km_sharded = AttentionKMeans(6, temperature=0, init=init).fit(Xd)
    np.testing.assert_array_equal(km_sharded.labels_.compute(), km.labels_)
    np.testing.assert_allclose(km_sharded.cluster_centers_, km.cluster_centers_, rtol=1e-10)


def test_dask_queries_on_an_in_memory_model(synchronous, data):
    X, y, Q, _ = data
    clf = MetricAttentionClassifier("euclidean", temperature=0.7).fit(X, y)
    lazy = clf.predict_proba(dask_rows(Q, (15, 25)))
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), clf.predict_proba(Q), rtol=1e-12, atol=1e-12)
    reg = MetricAttentionRegressor("euclidean", temperature=0.7).fit(X, X[:, 0])
    np.testing.assert_allclose(reg.predict(dask_rows(Q, (15, 25))).compute(), reg.predict(Q),
                               rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kmeans_queries_of_a_dask_collection_are_lazy(synchronous, dtype):
    # predict, transform and predict_proba computed eagerly into NumPy (the classifier's
    # predictions were lazy)
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 1.0, size=(60, 3)) for c in (0, 5)]).astype(dtype)
    km = AttentionKMeans(2, random_state=0).fit(X)
    Xd = dask_rows(X, (50, 70))
    for method in ("predict", "transform", "predict_proba"):
        lazy = getattr(km, method)(Xd)
        expected = getattr(km, method)(X)
        assert isinstance(lazy, da.Array) and lazy.shape == expected.shape
        assert lazy.dtype == expected.dtype
        computed = lazy.compute()
        assert computed.dtype == expected.dtype
        np.testing.assert_array_equal(computed, expected)


@pytest.mark.parametrize("temperature", [0.0, 1.5])
@pytest.mark.parametrize(("dtype", "weight"), [(np.float64, 1e300), (np.float32, 1e37)])
def test_kmeans_huge_sample_weights_fit_as_their_ratios(synchronous, temperature, dtype,
                                                        weight):
    """Weights summing beyond 2**32 are scaled as in memory (k-means++ failed inside NumPy
    on an infinite sum): the in-memory fit's centres, labels and inertia."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 1.0, size=(100, 3)) for c in (0, 4, 8)]).astype(dtype)
    w = (rng.integers(1, 4, size=300) * (dtype(weight) / 4)).astype(dtype)
    settings = dict(n_clusters=3, temperature=temperature, random_state=0, tol=1e-6)
    expected = AttentionKMeans(**settings).fit(X, sample_weight=w)
    sharded = AttentionKMeans(**settings).fit(dask_rows(X), sample_weight=dask_rows(w))
    np.testing.assert_array_equal(sharded.labels_.compute(), expected.labels_)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(sharded.cluster_centers_, expected.cluster_centers_, rtol=rtol,
                               atol=rtol)
    assert np.isfinite(sharded.inertia_) or not np.isfinite(expected.inertia_)
    assert sharded.inertia_ == pytest.approx(expected.inertia_, rel=rtol)
