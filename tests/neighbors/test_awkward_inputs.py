"""Inputs a fuzzing pass found mishandled by the tabular estimators: categorical columns whose
prediction batch is all missing or mixes numbers and strings, empty and complex inputs,
infinity in object columns, a validation split of zero weights, targets beyond float32."""

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning

from skattention import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
)
from skattention._engine._calibration import calibrate_temperature
from skattention._engine._maps import build_map
from skattention.neighbors._levels import MISSING_CODE, OTHER_CODE
from skattention.neighbors._tabular import _TabularEncoder

pd = pytest.importorskip("pandas")

FAST = dict(max_iter=3, random_state=0)


def _frame(n=200):
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"num": rng.normal(size=n),
                      "city": rng.choice(["Oslo", "Rome", "Paris"], n)})
    return X, np.where(X.num > 0, "yes", "no")


@pytest.fixture(scope="module")
def clf():
    X, y = _frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MetricAttentionClassifier(**FAST).fit(X, y)


# ------------------------------------------------------- categorical columns at prediction


def test_an_all_missing_string_column_gets_the_missing_code(clf):
    X, _ = _frame()
    row = pd.DataFrame([{"num": 0.3, "city": np.nan}])  # pandas makes the column float64
    assert row.dtypes["city"] == np.float64
    reference = clf.predict_proba(pd.DataFrame({"num": [0.3], "city": [None]}))
    np.testing.assert_array_equal(clf.predict_proba(row), reference)
    # a batch whose column is all NaN: the same codes as the rows one at a time
    batch = X[:20].assign(city=np.nan)
    proba = clf.predict_proba(batch)
    alone = np.vstack([clf.predict_proba(batch.iloc[i : i + 1]) for i in range(20)])
    np.testing.assert_array_equal(alone, proba)
    codes = clf._strategy.input.encoder.transform(batch).categories
    assert (codes == MISSING_CODE).all()


def test_an_all_missing_column_of_numeric_levels_gets_the_missing_code():
    X, y = _frame()
    rng = np.random.default_rng(1)
    Xi = X.assign(city=pd.Categorical(rng.integers(0, 3, len(X))))
    clf = MetricAttentionClassifier(**FAST).fit(Xi, y)
    # one row missing in a batch that holds numbers: the reference
    batch = Xi[:2].assign(city=pd.Categorical([np.nan, 1], categories=[0, 1, 2]))
    expected = clf.predict_proba(batch)[:1]
    for city in [pd.Categorical([np.nan], categories=[0, 1, 2]), [np.nan], [None]]:
        np.testing.assert_array_equal(clf.predict_proba(Xi[:1].assign(city=city)), expected)
    # an int column declared categorical, None at prediction
    Xb = X.assign(b=rng.integers(0, 4, len(X)))
    reg = MetricAttentionClassifier(categorical_features=["city", "b"], **FAST).fit(Xb, y)
    mixed = reg.predict_proba(Xb[:2].assign(b=pd.array([None, 1], dtype=object)))
    np.testing.assert_array_equal(reg.predict_proba(Xb[:1].assign(b=[None])), mixed[:1])


def test_a_numbers_for_strings_error_names_the_real_column(clf):
    X, _ = _frame()
    # a single row (predict's few-rows path) and a batch name the same column
    for rows in [X[:1].assign(city=[5]), X[:20].assign(city=5)]:
        with pytest.raises(ValueError, match="'city' held strings at fit time but holds "
                                             "numbers now"):
            clf.predict(rows)


def test_levels_mixing_numbers_and_strings_are_found_whatever_carries_them():
    X, y = _frame()
    Xm = X.assign(city=[1, 2, "other"] * 66 + [1, 2])
    model = MetricAttentionClassifier(**FAST).fit(Xm, y)
    encoder = model._strategy.input.encoder
    assert list(encoder.categories_[0]) == ["1", "2", "other"]
    expected = model.predict_proba(Xm[:3])
    # the numbers alone, as int64 (one row or several), float64 with a missing value, object
    for rows in [Xm[:1].assign(city=[1]), Xm[:3].assign(city=[1, 2, 1]),
                 Xm[:3].assign(city=[1.0, 2.0, np.nan]),
                 Xm[:3].assign(city=pd.Series([1, 2, "other"], dtype=object))]:
        codes = encoder.transform(rows).categories[:, 0]
        assert OTHER_CODE not in codes
    np.testing.assert_array_equal(model.predict_proba(Xm[:1].assign(city=[1])), expected[:1])
    np.testing.assert_array_equal(model.predict_proba(Xm[:2].assign(city=[1.0, 2.0])),
                                  expected[:2])
    # an unseen number is an unseen level, not an error
    assert encoder.transform(Xm[:1].assign(city=[7])).categories[0, 0] == OTHER_CODE


# ------------------------------------------------------------------ checks of X


def test_an_empty_categorical_features_list_means_no_categorical_column():
    X, y = _frame()
    a = MetricAttentionClassifier("euclidean", categorical_features=[]).fit(X[["num"]], y)
    b = MetricAttentionClassifier("euclidean", categorical_features=None).fit(X[["num"]], y)
    np.testing.assert_array_equal(a._keys.inputs, b._keys.inputs)
    assert not _TabularEncoder(categorical_features=[]).fit(X[["num"]]).categorical_.any()
    with pytest.raises(ValueError, match="mask has 0 entries"):
        _TabularEncoder(categorical_features=np.zeros(0, dtype=bool)).fit(X)


@pytest.mark.parametrize("value", [np.inf, "inf", -np.inf])
def test_infinity_in_an_object_column_is_scikit_learns_error(clf, value):
    row = pd.DataFrame({"num": pd.Series([value], dtype=object), "city": ["Oslo"]})
    with pytest.raises(ValueError, match="Input X contains infinity"):
        clf.predict(row)
    X, y = _frame()
    with pytest.raises(ValueError, match="Input X contains infinity"):
        clf.predict(X[:30].assign(num=pd.Series([value] + [0.5] * 29, dtype=object)))
    numbers = X.assign(num=pd.Series([value] + list(X.num[1:]), dtype=object))
    with pytest.raises(ValueError, match="Input X contains infinity"):
        MetricAttentionClassifier(categorical_features=["city"], **FAST).fit(numbers, y)


def test_complex_columns_are_rejected_as_complex_arrays_are(clf):
    X, y = _frame()
    with pytest.raises(ValueError, match="Complex data not supported"):
        MetricAttentionClassifier(**FAST).fit(X[["num"]].to_numpy() + 1j, y)
    with pytest.raises(ValueError, match=r"Complex data not supported: .*\['num'\]"):
        MetricAttentionClassifier(**FAST).fit(X.assign(num=X.num + 1j), y)
    for rows in [X[:2].assign(num=X.num[:2] + 100j), X[:40].assign(num=X.num[:40] + 0j)]:
        with pytest.raises(ValueError, match="Complex data not supported"):
            clf.predict(rows)


def test_a_frame_without_columns_is_scikit_learns_error(clf):
    X, y = _frame()
    message = r"0 feature\(s\) \(shape=\(200, 0\)\) while a minimum of 1 is required"
    for estimator in [MetricAttentionClassifier(), MetricAttentionTransformer()]:
        with pytest.raises(ValueError, match=message):
            estimator.fit(X[[]], y)
    with pytest.raises(ValueError, match=r"0 feature\(s\) \(shape=\(3, 0\)\)"):
        clf.predict(X[:3][[]])


# ------------------------------------------------------------------ the regressor


def test_a_frame_without_rows_is_scikit_learns_error(clf):
    # as an array without rows (and scikit-learn's estimators on either): a frame of no rows
    # was predicted as an empty array, and at fit the error named y's shape
    X, y = _frame()
    message = r"0 sample\(s\) \(shape=\(0, 2\)\) while a minimum of 1 is required by Metric"
    with pytest.warns(ConvergenceWarning):
        reg = MetricAttentionRegressor(**FAST).fit(X, X.num)
        transformer = MetricAttentionTransformer(**FAST).fit(X, y)
    calls = [clf.predict, clf.predict_proba, clf.kneighbors, clf.attention_weights,
             reg.predict, transformer.transform]
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call(X.iloc[:0])
        with pytest.raises(ValueError, match=message):
            call(X.to_numpy()[:0])
    for estimator in [MetricAttentionClassifier(), MetricAttentionTransformer()]:
        with pytest.raises(ValueError, match=message):
            estimator.fit(X.iloc[:0], y[:0])


def test_targets_beyond_float32_fail_at_fit_not_at_predict():
    X, _ = _frame()
    with pytest.raises(ValueError, match="dtype='float64'"):
        MetricAttentionRegressor(**FAST).fit(X, X.num * 1e100)
    reg = MetricAttentionRegressor(dtype="float64", **FAST).fit(X, X.num * 1e100)
    assert np.isfinite(reg.predict(X[:3])).all()
    # ordinary targets are untouched
    assert np.isfinite(MetricAttentionRegressor(**FAST).fit(X, X.num * 1e30).predict(X[:3])).all()


# ------------------------------------------------------- a validation split of zero weights


@pytest.mark.parametrize("estimator", [MetricAttentionClassifier, MetricAttentionRegressor])
def test_a_validation_split_of_zero_weights_trains_as_without_early_stopping(estimator):
    X, y = _frame()
    w = np.zeros(len(X))
    if estimator is MetricAttentionRegressor:
        y = X.num.to_numpy()
        w[:5] = 1  # rows that random_state=0 trains on, none of them held out
    else:
        w[[1, 2, 4, 6, 7, 8, 9, 10, 11, 12]] = 1  # the same for the stratified split
    with pytest.warns(UserWarning, match="validation split holds only rows of zero"):
        model = estimator(**FAST).fit(X, y, sample_weight=w)
    assert model.validation_scores_ is None and model.best_validation_score_ is None
    reference = estimator(early_stopping=False, **FAST).fit(X, y, sample_weight=w)
    assert model.temperature_ == reference.temperature_
    assert model.loss_curve_ == reference.loss_curve_
    predict = getattr(model, "predict_proba", model.predict)
    np.testing.assert_array_equal(
        predict(X), getattr(reference, "predict_proba", reference.predict)(X))


def test_calibration_on_zero_weights_keeps_the_temperature():
    torch.manual_seed(0)
    metric_map = build_map("tabular", n_components=4, n_numeric=2, cardinalities=[],
                           numeric_embedding="none")
    X = torch.randn(30, 2)
    values = torch.nn.functional.one_hot(torch.arange(30) % 2).float()
    log_t = torch.tensor(0.3)
    validation = (torch.randn(5, 2), values[:5], torch.zeros(5))
    loss = calibrate_temperature(metric_map, log_t, X, values, torch.ones(30), validation,
                                 "log_loss")
    assert math.isnan(loss) and float(log_t) == pytest.approx(0.3)
    validation = (validation[0], validation[1], torch.ones(5))
    assert math.isfinite(calibrate_temperature(metric_map, log_t, X, values, torch.ones(30),
                                               validation, "log_loss"))


def test_object_columns_of_numbers_are_numeric():
    # numbers that lost their dtype (X.to_numpy() of a mixed frame, a passthrough column)
    X, _ = _frame()
    y = 3 * X.num.to_numpy()
    frame = MetricAttentionRegressor(**FAST).fit(X, y)
    array = MetricAttentionRegressor(**FAST).fit(X.to_numpy(), y)
    assert array._strategy.input.encoder.categorical_.tolist() == [False, True]
    np.testing.assert_array_equal(array.predict(X.to_numpy()), frame.predict(X))
    mixed = pd.DataFrame({"n": pd.Series([1, 2.5, None, 4] * 5, dtype=object),
                          "t": pd.Series([1, "a", None, 2] * 5, dtype=object),
                          "b": pd.Series([True, False, None, True] * 5, dtype=object),
                          "none": pd.Series([None] * 20, dtype=object),
                          "c": pd.Categorical([1, 2, 3, 4] * 5)})
    assert _TabularEncoder().fit(mixed).categorical_.tolist() == [False, True, True, True, True]


@pytest.mark.parametrize("scale", [1e-60, 1e50])
def test_the_scale_of_sample_weights_does_not_matter(scale):
    # weights of 1e-60 underflowed float32 ("All training sample weights are zero") and of
    # 1e50 overflowed it ("Training diverged"); their scale changes no softmax
    X, y = _frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unit = MetricAttentionClassifier(**FAST).fit(X, y).predict_proba(X[:20])
        scaled = MetricAttentionClassifier(**FAST).fit(
            X, y, sample_weight=np.full(len(y), scale)).predict_proba(X[:20])
    np.testing.assert_allclose(scaled, unit, atol=1e-5)


@pytest.mark.parametrize("weight", [1e-300, 1e-308, 1e-320])
def test_equal_tiny_sample_weights_count_every_key_in_a_knn_vote(weight):
    # a weight is a key's multiplicity in the k nearest: k units of weights this small take
    # every key (k / w overflowed to inf from about 1e-308 and the selection's count raised
    # OverflowError)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 3))
    y = (X[:, 0] > 0).astype(int)
    w = np.full(len(y), weight)
    proba = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(
        X, y, sample_weight=w).predict_proba(X[:5])
    np.testing.assert_allclose(proba, np.tile(np.bincount(y) / len(y), (5, 1)))
    pred = MetricAttentionRegressor("euclidean", n_neighbors=3, temperature=np.inf).fit(
        X, X[:, 1], sample_weight=w).predict(X[:5])
    np.testing.assert_allclose(pred, np.full(5, X[:, 1].mean()))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_distances_that_underflow_are_a_clear_error(dtype):
    # coordinates of 1e-200: the squared distances between distinct points are 0 in float64,
    # every weight equal; the fit predicted the class prior (accuracy 0.54) without a word
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="underflow float64.*rescale the data"):
        MetricAttentionClassifier("euclidean", dtype=dtype).fit(X * 1e-200, y)
    # duplicated points alone (no distance at all) still fit, as before
    model = MetricAttentionClassifier("euclidean", dtype=dtype).fit(np.zeros((4, 2)), [0, 1, 0, 1])
    assert model.temperature_ > 0


@pytest.mark.parametrize("params", [dict(), dict(n_neighbors=3, temperature=np.inf),
                                    dict(temperature=0.5)])
def test_inputs_beyond_float32_are_named_when_attention_computes_in_it(params):
    # the engine's cast to float32 made them infinite: "keys contains NaN or infinity" (of
    # inputs that hold none), at fit with dtype='float32', at predict after a float32 fit
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    y = (X[:, 0] > 0).astype(int)
    message = r"X reaches 2.37e\+50 in magnitude, beyond float32.*pass dtype='float64'"
    with pytest.raises(ValueError, match=message):
        MetricAttentionClassifier("euclidean", dtype="float32", **params).fit(X * 1e50, y)
    model = MetricAttentionClassifier("euclidean", **params).fit(X.astype(np.float32), y)
    for rows in [X[:3], X]:  # the few-rows path and the blocks
        for call in [model.predict, model.kneighbors]:
            with pytest.raises(ValueError, match="beyond float32.*pass dtype='float64'"):
                call(rows * 1e50)
    # float64 attention takes them
    model = MetricAttentionClassifier("euclidean", dtype="float64", **params).fit(X * 1e50, y)
    np.testing.assert_array_equal(model.predict(X * 1e50), model.predict(X * 1e50))


@pytest.mark.parametrize(("scale", "dtype"), [(1e-18, np.float32), (1e-155, np.float64)])
def test_distances_too_small_for_the_compute_dtype_are_named_at_fit(scale, dtype):
    # float32 data of 1e-18: the neighbour scale (1.6e-38) calls for temperatures whose scores
    # overflow float32; the fit failed with the engine's advice to "raise the temperature",
    # which temperature='auto' chooses
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(200, 2)) * scale).astype(dtype)
    y = (X[:, 0] > 0).astype(int)
    message = rf"temperature='auto': attention in {dtype.__name__} overflows .* rescale the data"
    with pytest.raises(ValueError, match=message) as info:
        MetricAttentionClassifier("euclidean").fit(X, y)
    assert "raise the temperature" not in str(info.value)
    assert ("dtype='float64'" in str(info.value)) == (dtype == np.float32)
    if dtype == np.float32:  # as the message says
        model = MetricAttentionClassifier("euclidean", dtype="float64").fit(X, y)
        assert model.score(X, y) > 0.9
