"""Interfaces of the metric-attention estimators: labels, pandas, pickling, search, pipelines."""

import pickle
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import load_digits, load_iris
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import (
    check_fit2d_1sample,
    check_sample_weight_equivalence_on_dense_data,
)

from skattention import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
)
from tests.conftest import cheap

ESTIMATORS = [
    partial(MetricAttentionClassifier, "euclidean"),
    partial(MetricAttentionRegressor, "euclidean"),
    partial(MetricAttentionClassifier, "mlp", max_iter=3, random_state=0),
    partial(MetricAttentionRegressor, "mlp", max_iter=3, random_state=0),
]
ESTIMATOR_IDS = ["classifier-euclidean", "regressor-euclidean", "classifier-mlp", "regressor-mlp"]


@pytest.fixture(scope="module")
def iris():
    return load_iris(return_X_y=True)


def test_string_labels_and_classes(iris):
    X, y = iris
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    clf = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf).fit(X, names)
    assert list(clf.classes_) == ["setosa", "versicolor", "virginica"]
    pred = clf.predict(X)
    assert pred.dtype.kind == "U" and set(pred) <= set(clf.classes_)
    assert clf.score(X, names) > 0.9
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(1), 1.0)


def test_pandas_feature_names(iris):
    pd = pytest.importorskip("pandas")
    X, y = iris
    df = pd.DataFrame(X, columns=["sl", "sw", "pl", "pw"])
    clf = MetricAttentionClassifier("euclidean").fit(df, y)
    np.testing.assert_array_equal(clf.feature_names_in_, ["sl", "sw", "pl", "pw"])
    assert clf.n_features_in_ == 4
    with pytest.warns(UserWarning, match="feature names"):
        clf.predict(X)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=ESTIMATOR_IDS)
def test_pickle_and_clone_roundtrip(iris, cls):
    X, y = iris
    est = cls(n_neighbors=7).fit(X, y)
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    cloned = clone(est)
    assert cloned.get_params() == est.get_params()
    assert not hasattr(cloned, "temperature_")


def test_pickle_loads_in_a_fresh_process(tmp_path, iris):
    X, y = iris
    est = MetricAttentionClassifier("euclidean").fit(X, y)
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(est))
    np.save(tmp_path / "X.npy", X)
    code = (
        "import pickle, numpy as np; "
        f"m = pickle.loads(open({str(path)!r}, 'rb').read()); "
        f"print(m.predict(np.load({str(tmp_path / 'X.npy')!r}))[:5].tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(est.predict(X)[:5].tolist())


def test_fitted_model_holds_no_tensors(iris):
    # What is pickled is NumPy only, so a model fitted with device="cuda" loads on a CPU machine.
    X, y = iris
    est = MetricAttentionClassifier("euclidean").fit(X, y)
    assert not any(isinstance(v, torch.Tensor) for v in vars(est).values())


def test_grid_search_next_to_knn():
    X, y = load_digits(return_X_y=True)
    X, y = X[:600], y[:600]
    pipe = Pipeline(
        [("scale", StandardScaler()), ("model", MetricAttentionClassifier("euclidean"))]
    )
    grid = GridSearchCV(
        pipe,
        [
            {"model": [MetricAttentionClassifier("euclidean")], "model__n_neighbors": [None, 10],
             "model__temperature": ["auto", np.inf]},
            {"model": [KNeighborsClassifier()], "model__n_neighbors": [1, 5]},
        ],
        cv=3,
    )
    grid.fit(X, y)
    results = {
        (type(p["model"]).__name__, p["model__n_neighbors"], p.get("model__temperature")): s
        for p, s in zip(grid.cv_results_["params"], grid.cv_results_["mean_test_score"])
    }
    assert len(results) == 6 and all(np.isfinite(list(results.values())))
    assert grid.best_score_ > 0.85
    # the k-NN configuration of attention scores exactly like KNeighborsClassifier(5)
    att_knn = cross_val_score(
        Pipeline(
            [
                ("scale", StandardScaler()),
                (
                    "model",
                    MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf),
                ),
            ]
        ),
        X,
        y,
        cv=3,
    )
    assert att_knn.mean() == pytest.approx(results[("KNeighborsClassifier", 5, None)])


def test_dtype_follows_the_data_unless_set(iris):
    X, y = iris
    X32 = X.astype(np.float32)
    est = MetricAttentionRegressor("euclidean", temperature=1.0).fit(X32, y)
    assert est._compute_dtype() == torch.float32
    est64 = MetricAttentionRegressor("euclidean", temperature=1.0).fit(X, y)
    assert est64._compute_dtype() == torch.float64
    np.testing.assert_allclose(est.predict(X), est64.predict(X), rtol=1e-4)
    assert (
        MetricAttentionRegressor("euclidean", dtype="float32").fit(X, y)._compute_dtype()
        == torch.float32
    )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("metric", ["euclidean", "mlp"])
@pytest.mark.parametrize(
    "dtype, expected",
    [(np.float32, torch.float32), (np.dtype("float32"), torch.float32),
     (np.float64, torch.float64), (np.dtype("float64"), torch.float64),
     (torch.float64, torch.float64), (torch.float32, torch.float32)],
    ids=["np.float32", "np.dtype-float32", "np.float64", "np.dtype-float64", "torch.float64",
         "torch.float32"],
)
def test_dtype_takes_numpy_and_torch_dtypes(iris, metric, dtype, expected):
    # What a NumPy or torch user passes names the same precision as the string, and is kept as
    # passed (get_params, clone, pickle).
    X, y = iris
    est = MetricAttentionClassifier(metric, dtype=dtype, max_iter=2, random_state=0).fit(X, y)
    assert est._compute_dtype() == expected
    assert est.get_params()["dtype"] is dtype and clone(est).get_params()["dtype"] == dtype
    loaded = pickle.loads(pickle.dumps(est))
    assert loaded.dtype == dtype
    np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
    named = MetricAttentionClassifier(metric, dtype=str(expected).removeprefix("torch."),
                                      max_iter=2, random_state=0).fit(X, y)
    np.testing.assert_array_equal(est.predict_proba(X), named.predict_proba(X))


@pytest.mark.parametrize("dtype", [np.int64, np.float16, torch.float16, torch.int64, "float8",
                                   "f8"])
def test_dtype_other_than_float32_or_float64_is_rejected(iris, dtype):
    X, y = iris
    with pytest.raises(ValueError, match="'dtype' parameter .* NumPy or torch dtype"):
        MetricAttentionRegressor("euclidean", dtype=dtype).fit(X, y)


def test_grid_search_over_numpy_and_torch_dtypes(iris):
    X, y = iris
    grid = GridSearchCV(MetricAttentionRegressor("euclidean", temperature=1.0),
                        {"dtype": [np.float32, torch.float64]}, cv=3).fit(X, y)
    assert [p["dtype"] for p in grid.cv_results_["params"]] == [np.float32, torch.float64]
    assert grid.best_estimator_.dtype in (np.float32, torch.float64)


def test_auto_temperature_is_chosen_by_leave_one_out(iris):
    X, y = iris
    clf = MetricAttentionClassifier("euclidean").fit(X, y)
    assert 0 < clf.temperature_ < np.inf
    # it is the grid value with the best leave-one-out log-loss: check against two neighbours
    def loo_logloss(T):
        from skattention import attention

        proba = attention(X, X, np.eye(3)[y], temperature=T, exclude_self=True, dtype="float64")
        return -np.mean(np.log(np.clip(proba[np.arange(len(y)), y], 1e-12, None)))
    best = loo_logloss(clf.temperature_)
    assert best <= loo_logloss(clf.temperature_ * 2) and best <= loo_logloss(clf.temperature_ / 2)



@pytest.mark.parametrize("metric, p, power", [("manhattan", 2, 1), ("minkowski", 3, 3),
                                              ("cosine", 2, 0), ("euclidean", 2, 2)])
def test_auto_temperature_is_in_units_of_the_metric(iris, metric, p, power):
    # X times 3 multiplies f by 3**power (cosine: unchanged), so the temperature searched
    # around the nearest-neighbour f must follow; it was searched around squared Euclidean
    # distances (x9) whatever the metric (cosine on digits: log-loss 2.07 against 0.14)
    X = StandardScaler().fit_transform(iris[0])
    y = iris[1]
    one = MetricAttentionClassifier(metric, p=p).fit(X, y)
    three = MetricAttentionClassifier(metric, p=p).fit(3 * X, y)
    assert three.temperature_ == pytest.approx(3.0**power * one.temperature_, rel=1e-9)
    np.testing.assert_allclose(three.predict_proba(3 * X), one.predict_proba(X), atol=1e-9)


@pytest.mark.parametrize("cls", [MetricAttentionClassifier, MetricAttentionRegressor])
@pytest.mark.parametrize("metric, n_neighbors", [("euclidean", 2), ("euclidean", 3),
                                                 ("manhattan", 4), ("cosine", 5)])
def test_auto_temperature_with_a_selection_takes_integer_weights_as_repeats(
        cls, metric, n_neighbors):
    # the leave-one-out of a point of weight w keeps w - 1 units of it in the k-NN prior's
    # count, as repeating it would; a bias applied after the units were counted chose another
    # temperature than the repeated rows (0.0128 against 0.0256)
    check_sample_weight_equivalence_on_dense_data(
        cls.__name__, cls(metric, n_neighbors=n_neighbors))

# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("cls", ESTIMATORS, ids=ESTIMATOR_IDS)
def test_bad_input_errors(cls, iris):
    X, y = iris
    est = cls()
    with pytest.raises(NotFittedError):
        est.predict(X)
    with pytest.raises(ValueError, match="infinity|inf"):
        cls().fit(np.where(X > 7, np.inf, X), y)
    with pytest.raises(ValueError, match="Expected 2D array"):
        cls().fit(X[:, 0], y)
    with pytest.raises(ValueError, match="0 sample"):
        cls().fit(X[:0], y[:0])
    est.fit(X, y)
    with pytest.raises(ValueError, match="3 features, but .* is expecting 4 features"):
        est.predict(X[:, :3])
    # missing values are input, not errors (docs/tabular.md): at the median, with an indicator
    assert np.isfinite(est.predict_proba(np.where(X > 7, np.nan, X))
                       if hasattr(est, "predict_proba") else
                       est.predict(np.where(X > 7, np.nan, X))).all()
    with pytest.raises(ValueError, match="Expected 2D array"):
        est.predict(X[0])
    with pytest.raises(ValueError, match="temperature"):
        cls(temperature=-1.0).fit(X, y)
    with pytest.raises(ValueError, match="temperature"):
        cls(temperature=float("nan")).fit(X, y)
    with pytest.raises(
        ValueError, match="n_neighbors=500 is larger than the number of training samples"
    ):
        cls(n_neighbors=500).fit(X, y)
    with pytest.raises(ValueError, match="n_neighbors"):
        cls(n_neighbors=0).fit(X, y)
    with pytest.raises(ValueError, match="at least one non-zero"):
        cls().fit(X, y, sample_weight=np.zeros(len(y)))
    with pytest.raises(ValueError, match="(?i)negative"):
        cls().fit(X, y, sample_weight=-np.ones(len(y)))


@pytest.mark.parametrize("name", ["MetricAttentionClassifier", "MetricAttentionRegressor"])
@pytest.mark.parametrize("metric", ["tabular", "euclidean"])
def test_too_few_samples_for_n_neighbors_names_n_samples(name, metric):
    # scikit-learn's check_fit2d_1sample accepts a ValueError that names the sample count in
    # its words ("n_samples=1"); the fit-time n_neighbors check ran before the one-class check
    check_fit2d_1sample(name, cheap(name, metric=metric, n_neighbors=3))


@pytest.mark.parametrize("metric", ["euclidean", "tabular", "mlp"])
def test_single_class_is_predicted_as_knn_predicts_it(iris, metric):
    """One class in y: fitted (as KNeighborsClassifier and HistGradientBoosting fit it), that
    class predicted everywhere with probability 1 (a learned metric has nothing to learn)."""
    X, _ = iris
    y = np.full(len(X), "setosa")
    clf = MetricAttentionClassifier(metric, max_iter=2, random_state=0).fit(X, y)
    knn = KNeighborsClassifier().fit(X, y)
    np.testing.assert_array_equal(clf.predict(X[:7]), knn.predict(X[:7]))
    np.testing.assert_array_equal(clf.predict_proba(X[:7]), knn.predict_proba(X[:7]))
    assert clf.classes_.tolist() == ["setosa"] and clf.n_iter_ == 0
    with pytest.raises(ValueError, match="at least 2 classes.*only one class"):
        MetricAttentionTransformer(max_iter=2).fit(X, y)  # nothing to learn a map from


def test_predict_log_proba_is_the_log_of_predict_proba(iris):
    X, y = iris
    clf = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf).fit(X, y)
    proba = clf.predict_proba(X)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(clf.predict_log_proba(X), np.log(proba))
    assert np.isneginf(clf.predict_log_proba(X)).any()  # zero votes: -inf, as scikit-learn
    Y = np.column_stack([y, y % 2])
    multi = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf).fit(X, Y)
    logs = multi.predict_log_proba(X[:5])
    assert isinstance(logs, list) and len(logs) == 2
    with np.errstate(divide="ignore"):
        for log_p, p in zip(logs, multi.predict_proba(X[:5]), strict=True):
            np.testing.assert_array_equal(log_p, np.log(p))


def test_distance_weights_need_a_selection_and_equal_weights(iris):
    X, y = iris
    with pytest.raises(ValueError, match="set n_neighbors or radius"):
        MetricAttentionClassifier("euclidean", weights="distance").fit(X, y)
    with pytest.raises(ValueError, match="equal weights of the training points"):
        MetricAttentionClassifier("euclidean", n_neighbors=3, weights="distance").fit(
            X, y, sample_weight=np.arange(len(y)) % 3 + 1.0)
    with pytest.raises(ValueError, match="equal weights"):
        MetricAttentionClassifier("euclidean", n_neighbors=3, weights="distance",
                                  class_weight="balanced").fit(X[:120], y[:120])
    dot = MetricAttentionClassifier("dot", n_neighbors=3, weights="distance", max_iter=2,
                                    random_state=0)
    with pytest.raises(ValueError, match="metric='dot' has none"):
        dot.fit(X, y)  # (before training)
    bad = MetricAttentionClassifier("euclidean", n_neighbors=3, weights=lambda d: 0 * d)
    for weights, message in ((lambda d: -d, "negative"), (lambda d: d * np.nan, "NaN")):
        with pytest.raises(ValueError, match=message):
            MetricAttentionClassifier("euclidean", n_neighbors=3,
                                      weights=weights).fit(X, y).predict(X[:3])
    # a regressor's weighted mean takes negative weights, as KNeighborsRegressor's
    reg = MetricAttentionRegressor("euclidean", n_neighbors=3, weights=lambda d: d - 0.4,
                                   temperature=np.inf).fit(X, X[:, 0])
    np.testing.assert_allclose(reg.predict(X[:9]), KNeighborsRegressor(
        3, weights=lambda d: d - 0.4).fit(X, X[:, 0]).predict(X[:9]), rtol=1e-12)
    with pytest.raises(ValueError, match="zero weights"):
        bad.fit(X, y).predict(X[:3])


@pytest.mark.parametrize("temperature", [0.3, 0])
def test_distance_weights_at_a_finite_temperature(iris, temperature):
    """Each selected neighbour's weight is exp(-f / T) / distance (normalised); T=0 is the
    nearest neighbour alone."""
    X, y = iris
    Xq = X[::10] + 0.05
    reg = MetricAttentionRegressor("euclidean", n_neighbors=4, temperature=temperature,
                                   weights="distance").fit(X, y.astype(float))
    dist, ind = KNeighborsRegressor(n_neighbors=4).fit(X, y).kneighbors(Xq)
    if temperature == 0:
        expected = y[ind[:, 0]]
    else:
        w = np.exp(-(dist**2 - dist[:, :1] ** 2) / temperature) / dist
        expected = (w * y[ind]).sum(1) / w.sum(1)
    np.testing.assert_allclose(reg.predict(Xq), expected, rtol=1e-10)


def test_empty_X_is_named_by_its_own_shape(iris):
    X, y = iris
    with pytest.raises(ValueError, match=r"shape=\(0, 4\)"):
        MetricAttentionClassifier("euclidean").fit(X[:0], y[:0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
@pytest.mark.parametrize("cls", ESTIMATORS, ids=ESTIMATOR_IDS)
def test_cuda_without_gpu_is_a_clear_error(cls, iris):
    X, y = iris
    with pytest.raises(ValueError, match="CUDA is not available"):
        cls(device="cuda").fit(X, y)
    est = cls().fit(X, y).set_params(device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        est.predict(X)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cls", ESTIMATORS, ids=ESTIMATOR_IDS)
def test_cuda_matches_cpu(cls, iris):
    X, y = iris
    cpu = cls(n_neighbors=5, temperature=1.0, device="cpu").fit(X, y)
    gpu = cls(n_neighbors=5, temperature=1.0, device="cuda").fit(X, y)
    np.testing.assert_allclose(gpu.predict(X), cpu.predict(X), rtol=1e-6)
    loaded = pickle.loads(pickle.dumps(gpu)).set_params(device="cpu")
    np.testing.assert_allclose(loaded.predict(X), cpu.predict(X), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_query_arrays_are_checked_as_validate_data_checks_them(dtype):
    # float arrays of the fitted width skip scikit-learn's DataFrame probes; what
    # validate_data would say still holds: infinity, width, empty, feature names
    import pandas as pd

    X, y = load_iris(return_X_y=True)
    X = X.astype(dtype)
    est = MetricAttentionClassifier("euclidean", n_neighbors=3).fit(X, y)
    too_large = f"infinity or a value too large for dtype\\('{dtype.__name__}"
    with pytest.raises(ValueError, match=too_large):
        est.predict(np.where(X > 7, np.inf, X).astype(dtype))
    with pytest.raises(ValueError, match="3 features, but .* is expecting 4 features"):
        est.predict(X[:, :3])
    with pytest.raises(ValueError, match="0 sample"):
        est.predict(X[:0])
    named = MetricAttentionClassifier("euclidean", n_neighbors=3).fit(
        pd.DataFrame(X, columns=list("abcd")), y)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        named.predict(X[:2])


def test_regressor_validation_score_is_that_of_the_trend_residuals():
    # y linear in X: the trend explains it, the attention's validation R^2 (of the residuals)
    # is not the model's R^2; the docstring says which R^2 it is
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = X @ [3.0, -2.0, 1.0] + 0.1 * rng.normal(size=300)
    reg = MetricAttentionRegressor("mlp", max_iter=2, random_state=0).fit(X, y)
    assert reg.trend_ is not None
    assert reg.score(X, y) > 0.99
    assert reg.best_validation_score_ < 0.9
    doc = MetricAttentionRegressor.__doc__
    entry = doc[doc.index("validation_scores_ :"):doc.index("validation_loss_curve_ :")]
    assert "trend_" in entry and "score" in entry


@pytest.mark.parametrize(
    "name", ["MetricAttentionClassifier", "MetricAttentionRegressor", "MetricAttentionTransformer"]
)
def test_every_fitted_attribute_is_documented(name):
    # the transformer's n_samples_fit_ and outputs_2d_ were not (scikit-learn's own rule:
    # every public attribute a fit sets is in the docstring's Attributes, and the reverse)
    docscrape = pytest.importorskip("numpydoc.docscrape")  # the docs' extra
    rng = np.random.RandomState(0)
    X, y = rng.normal(size=(40, 3)), np.arange(40) % 2
    est = cheap(name).fit(X, rng.normal(size=40) if name == "MetricAttentionRegressor" else y)
    documented = {attr.name.split(" ")[0] for attr in docscrape.ClassDoc(type(est))["Attributes"]}
    fitted = {key for key in vars(est) if key.endswith("_") and not key.startswith("_")}
    assert fitted - documented == set()
    assert documented - fitted <= {"feature_names_in_"}  # names only for named columns
