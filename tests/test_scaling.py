"""Beyond one process: GridSearchCV on a Dask cluster, predictions streamed over chunks."""

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV

from skattention import AttentionKMeans, MetricAttentionClassifier, MetricAttentionRegressor


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        n_samples=150, n_features=6, n_informative=4, n_classes=3, random_state=0
    )
    return X, y


def _searches():
    # Fixed metrics: a learned one is bit-identical only at a given torch thread count, and the
    # Dask workers run one thread each (the nanny sets OMP_NUM_THREADS=1).
    return [
        GridSearchCV(
            MetricAttentionClassifier("euclidean", device="cpu"),
            {"temperature": [0.3, np.inf], "n_neighbors": [None, 5]},
            cv=2,
        ),
        GridSearchCV(
            MetricAttentionRegressor("euclidean", device="cpu"), {"temperature": [0.5, 2.0]}, cv=2
        ),
    ]


def test_grid_search_on_dask_cluster_matches_sequential(data):
    pytest.importorskip("dask")
    distributed = pytest.importorskip("distributed")
    import joblib

    X, y = data
    expected = [s.fit(X, y).cv_results_["mean_test_score"] for s in _searches()]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster):
        with joblib.parallel_backend("dask"):
            got = [
                s.set_params(n_jobs=-1).fit(X, y).cv_results_["mean_test_score"]
                for s in _searches()
            ]
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("method", ["predict", "predict_proba"])
def test_predict_over_dask_array_chunks(data, method):
    da = pytest.importorskip("dask.array")
    X, y = data
    clf = MetricAttentionClassifier("euclidean", temperature=0.5, device="cpu").fit(X, y)
    Xd = da.from_array(X, chunks=(40, X.shape[1]))  # one chunk along the features
    if method == "predict":
        out = Xd.map_blocks(clf.predict, dtype=clf.classes_.dtype, drop_axis=1)
    else:
        out = Xd.map_blocks(clf.predict_proba, dtype=np.float64,
                            chunks=(Xd.chunks[0], (len(clf.classes_),)))
    np.testing.assert_array_equal(out.compute(scheduler="threads"), getattr(clf, method)(X))


def test_transform_over_dask_array_chunks(data):
    da = pytest.importorskip("dask.array")
    X, _ = data
    km = AttentionKMeans(n_clusters=3, random_state=0, device="cpu").fit(X)
    Xd = da.from_array(X, chunks=(50, X.shape[1]))
    out = Xd.map_blocks(km.transform, dtype=np.float64, chunks=(Xd.chunks[0], (3,)))
    np.testing.assert_array_equal(out.compute(), km.transform(X))


def test_predict_over_iterator_of_batches(data, tmp_path):
    X, y = data
    clf = MetricAttentionClassifier("euclidean", temperature=0.5, n_neighbors=7, device="cpu").fit(
        X, y
    )
    path = tmp_path / "X.npy"
    np.save(path, X)
    X_disk = np.load(path, mmap_mode="r")  # stands for data too large for memory

    def batches(size=32):
        for start in range(0, X_disk.shape[0], size):
            yield np.asarray(X_disk[start : start + size])

    y_stream = np.concatenate([clf.predict(b) for b in batches()])
    np.testing.assert_array_equal(y_stream, clf.predict(X))
    # Other batch sizes change the matmul blocking: equal up to float32 rounding.
    proba = np.vstack([clf.predict_proba(b) for b in batches(17)])
    np.testing.assert_allclose(proba, clf.predict_proba(X), rtol=1e-5, atol=1e-6)
