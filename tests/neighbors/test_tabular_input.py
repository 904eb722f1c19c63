"""Mixed-type tabular input of the metric-attention estimators (DataFrames, missing values,
categories, sparse matrices) and the awkward inputs of issue 15."""

import decimal

import numpy as np
import pytest
from scipy import sparse
from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
from sklearn.preprocessing import OneHotEncoder
from sklearn.utils.estimator_checks import check_estimator_sparse_tag

from skattention import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
    config_context,
)
from tests.conftest import cheap

pd = pytest.importorskip("pandas")

FAST = dict(max_iter=3, hidden_size=16, random_state=0)


def _frame(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({
        "age": rng.normal(40, 10, n),
        "visits": pd.array(rng.integers(0, 20, n), dtype="Int64"),
        "plan": pd.Categorical(rng.choice(["basic", "plus", "pro"], n)),
        "member": rng.random(n) > 0.5,
        "city": rng.choice(["Oslo", "Rome", "Lima"], n).astype(object),
    })
    X.loc[::7, "age"] = np.nan
    X.loc[::11, "visits"] = pd.NA
    X.loc[::13, "city"] = None
    y = np.where((X["plan"] == "pro").to_numpy() | X["member"].to_numpy(), "yes", "no")
    return X, y


@pytest.mark.parametrize("metric", ["tabular", "mlp", "euclidean"])
def test_mixed_frame_fits_and_predicts_without_preprocessing(metric):
    X, y = _frame()
    clf = MetricAttentionClassifier(metric, **FAST).fit(X, y)
    assert clf.n_features_in_ == 5
    assert list(clf.feature_names_in_) == list(X.columns)
    queries = X.iloc[:4].copy()
    queries["plan"] = pd.Categorical(["enterprise", "basic", None, "pro"])  # unseen, missing
    queries["city"] = ["Paris", None, "Oslo", "Rome"]
    queries.loc[queries.index[0], "age"] = np.nan
    proba = clf.predict_proba(queries)
    assert proba.shape == (4, 2) and np.isfinite(proba).all()
    np.testing.assert_allclose(proba.sum(1), 1.0)
    target = X["age"].fillna(X["age"].median()).to_numpy()
    reg = MetricAttentionRegressor(metric, **FAST).fit(X, target)
    assert np.isfinite(reg.predict(queries)).all()


def test_transformer_takes_a_mixed_frame():
    X, y = _frame()
    out = MetricAttentionTransformer(n_components=3, **FAST).fit(X, y).transform(X)
    assert out.shape == (len(X), 3) and out.dtype == np.float64 and np.isfinite(out).all()


def test_fixed_metric_is_knn_on_raw_numbers_and_one_hot_categories():
    # the fixed metric keeps the numbers as given (no scaling) and one-hot encodes categories
    X, y = _frame()
    X = X.drop(columns=["visits"]).assign(age=X["age"].fillna(30.0))
    X["city"] = X["city"].fillna("none")
    one_hot = OneHotEncoder(sparse_output=False).fit(X[["plan", "city"]])
    numbers = np.column_stack([X["age"], X["member"].astype(float)])
    Xk = np.hstack([numbers, one_hot.transform(X[["plan", "city"]])])
    for est, knn, target in [
        (MetricAttentionClassifier, KNeighborsClassifier, y),
        (MetricAttentionRegressor, KNeighborsRegressor, X["age"].to_numpy()),
    ]:
        ours = est("euclidean", n_neighbors=5, temperature=np.inf).fit(X, target)
        reference = knn(n_neighbors=5).fit(Xk, target)
        if est is MetricAttentionClassifier:
            np.testing.assert_array_equal(ours.predict(X), reference.predict(Xk))
        else:  # a weighted sum against a mean: rounding apart, as in tests/conformance
            np.testing.assert_allclose(ours.predict(X), reference.predict(Xk), rtol=1e-12)


def test_numeric_frame_equals_array_exactly():
    rng = np.random.default_rng(1)
    X = rng.integers(0, 4, (80, 3)).astype(np.float32)  # ties and duplicated rows
    y = rng.integers(0, 3, 80)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    for metric in ["euclidean", "mlp"]:
        kwargs = dict(temperature=np.inf, n_neighbors=7) if metric == "euclidean" else FAST
        a = MetricAttentionClassifier(metric, **kwargs).fit(X, y).predict_proba(X)
        b = MetricAttentionClassifier(metric, **kwargs).fit(frame, y).predict_proba(frame)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spec", [[2, 4], ["plan", "city"], [False, False, True, False, True]])
def test_categorical_features_explicit_equals_from_dtype(spec):
    X, y = _frame()
    a = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(X, y)
    b = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf,
                                  categorical_features=spec).fit(X, y)
    np.testing.assert_array_equal(a._keys.inputs, b._keys.inputs)


def test_categorical_features_on_numeric_codes():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.normal(size=60), rng.integers(0, 5, 60) * 100.0])
    y = rng.integers(0, 2, 60)
    clf = MetricAttentionClassifier("euclidean", categorical_features=[1]).fit(X, y)
    assert clf._keys.inputs.shape == (60, 1 + 5)  # the codes' magnitudes no longer count
    assert clf.predict(np.array([[0.0, 700.0]])).shape == (1,)  # an unseen code


def test_categorical_features_errors_are_clear():
    X, y = _frame()
    with pytest.raises(ValueError, match="not in X's columns"):
        MetricAttentionClassifier(categorical_features=["nope"]).fit(X, y)
    with pytest.raises(ValueError, match="holds text"):
        MetricAttentionClassifier(categorical_features=None).fit(X, y)
    with pytest.raises(ValueError, match="mask has 2 entries"):
        MetricAttentionClassifier(categorical_features=[True, False]).fit(X, y)
    with pytest.raises(ValueError, match="sparse"):
        MetricAttentionClassifier(categorical_features=[0]).fit(
            sparse.csr_matrix(np.eye(4)), [0, 1, 0, 1])



@pytest.mark.parametrize("name", ["MetricAttentionClassifier", "MetricAttentionTransformer"])
@pytest.mark.parametrize("categorical_features", [[0], [True, False, False], ["a"]])
def test_columns_named_categorical_are_tagged_dense_only(name, categorical_features):
    # the sparse tag follows the refusal above, so scikit-learn's checks do not send sparse
    # matrices (check_estimator_sparse_tag failed with categorical_features=[0])
    estimator = cheap(name, categorical_features=categorical_features)
    assert not estimator.__sklearn_tags__().input_tags.sparse
    for numeric in ["from_dtype", None, [], [False, False, False]]:
        assert cheap(name, categorical_features=numeric).__sklearn_tags__().input_tags.sparse
    if categorical_features == [0]:
        check_estimator_sparse_tag(name, estimator)

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_sparse_equals_dense(fmt):
    rng = np.random.default_rng(3)
    dense = sparse.random(90, 12, density=0.2, random_state=3).toarray()
    dense[5, 2] = np.nan  # an explicit NaN: a missing value
    y = rng.integers(0, 3, 90)
    X = sparse.csr_matrix(dense) if fmt == "csr" else sparse.csc_matrix(dense)
    assert np.isnan(X.data).any()
    for metric, kwargs in [("euclidean", dict(n_neighbors=4, temperature=np.inf)),
                           ("mlp", FAST)]:
        a = MetricAttentionClassifier(metric, **kwargs).fit(X, y).predict_proba(X)
        b = MetricAttentionClassifier(metric, **kwargs).fit(dense, y).predict_proba(dense)
        np.testing.assert_array_equal(a, b)


def test_queries_are_encoded_in_blocks_within_the_budget():
    rng = np.random.default_rng(4)
    X = sparse.random(3000, 40, density=0.05, format="csr", random_state=4)
    y = rng.integers(0, 2, 3000)
    clf = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(X, y)
    whole = clf.predict_proba(X)
    with config_context(working_memory=1):  # 1 MiB: blocks of a few thousand rows or fewer
        assert len(list(clf._encoded_blocks(X))) > 1
        np.testing.assert_array_equal(clf.predict_proba(X), whole)


def test_sparse_training_matrix_beyond_the_budget_is_a_clear_error():
    X = sparse.random(2000, 200, density=0.01, format="csr", random_state=5)
    with config_context(working_memory=1), pytest.raises(MemoryError, match="sparse training"):
        MetricAttentionClassifier("euclidean").fit(X, np.arange(2000) % 2)


# ---------------------------------------------------------------- issue 15's awkward inputs


def test_all_nan_column_is_a_constant():
    X, y = _frame()
    X["empty"] = np.nan
    clf = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(X, y)
    ref = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(
        X.drop(columns="empty"), y)
    np.testing.assert_array_equal(clf.predict(X), ref.predict(X.drop(columns="empty")))
    assert np.isfinite(MetricAttentionClassifier(**FAST).fit(X, y).predict_proba(X)).all()


def test_single_level_category():
    X, y = _frame()
    X["country"] = pd.Categorical(["NO"] * len(X))
    clf = MetricAttentionClassifier(**FAST).fit(X, y)
    queries = X.iloc[:3].assign(country=pd.Categorical(["NO", "SE", None]))
    assert np.isfinite(clf.predict_proba(queries)).all()
    # a column that never varied moves no distance, whatever it holds later
    np.testing.assert_array_equal(clf.predict_proba(queries), clf.predict_proba(X.iloc[:3]))


def test_columns_constant_at_fit_move_no_prediction():
    X, y = _frame()
    X = X.assign(empty=np.nan, const=0.0, one="A")
    clf = MetricAttentionClassifier(**FAST).fit(X, y)
    expected = clf.predict_proba(X)
    for column, value in [("empty", 3.0), ("const", 3.0), ("one", "B"), ("one", None)]:
        np.testing.assert_array_equal(clf.predict_proba(X.assign(**{column: value})), expected)
        # a single row, encoded on its own path
        np.testing.assert_array_equal(
            clf.predict_proba(X.iloc[:1].assign(**{column: value})), expected[:1])


def test_dtype_change_between_fit_and_predict_is_a_clear_error():
    X, y = _frame()
    clf = MetricAttentionClassifier(**FAST).fit(X, y)
    with pytest.raises(ValueError, match="'age' is numeric .* holds text"):
        clf.predict(X.assign(age=["old"] * len(X)))
    numbers_as_text = X.assign(age=X["age"].astype(str))  # "41.3": still numbers
    np.testing.assert_array_equal(clf.predict(numbers_as_text), clf.predict(X))
    codes = X.assign(city=np.arange(len(X)) % 3)
    with pytest.raises(ValueError, match="'city' held strings at fit time but holds numbers"):
        clf.predict(codes)
    with pytest.raises(ValueError, match="feature names should match"):
        clf.predict(X[X.columns[::-1]])


def test_infinity_is_still_an_error():
    X, y = _frame()
    X.loc[0, "age"] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        MetricAttentionClassifier(**FAST).fit(X, y)


def test_infinity_in_a_categorical_column_is_an_error():
    # it became the level "inf" at fit, and at predict a misleading "holds numbers now"
    X, y = _frame()
    n = len(X)
    for column in (pd.Series(["a", np.inf] * (n // 2), dtype=object),
                   pd.Categorical([1.0, np.inf] * (n // 2)),
                   pd.Series([1, "b", np.inf, "c"] * (n // 4), dtype=object)):
        with pytest.raises(ValueError, match="infinity"):
            MetricAttentionClassifier(**FAST).fit(X.assign(town=column), y)
    clf = MetricAttentionClassifier(**FAST).fit(X.assign(town=["a", "b"] * (n // 2)), y)
    with pytest.raises(ValueError, match="infinity"):
        clf.predict(X.assign(town=pd.Series(["a", np.inf] * (n // 2), dtype=object)))


def test_warm_start_keeps_the_encoding():
    X, y = _frame()
    clf = MetricAttentionClassifier(warm_start=True, **FAST).fit(X, y)
    encoder = clf._strategy.input.encoder
    clf.fit(X.iloc[:60], y[:60])
    assert clf._strategy.input.encoder is encoder


@pytest.mark.parametrize("metric", ["tabular", "euclidean"])
@pytest.mark.parametrize("float32", [False, True])
def test_a_few_rows_of_a_numeric_frame_equal_the_same_rows_in_a_batch(metric, float32):
    # a few rows of a frame of NumPy number columns take predict's few-rows path (converted
    # at once); batches and other frames are converted column by column: the same numbers
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.normal(size=300), "b": rng.integers(0, 9, 300),
                      "c": rng.normal(size=300) * 100, "d": rng.random(300) > 0.5})
    if float32:
        X = X[["a", "c"]].astype(np.float32)
    X.iloc[::7, 0] = np.nan
    y = (X["a"].fillna(0) + X["c"] / 100 > 0).to_numpy()
    clf = MetricAttentionClassifier(metric, **FAST).fit(X, y)
    batch = clf.predict_proba(X.iloc[:120])
    numeric = X if float32 else X.assign(d=X["d"].astype(int))  # bool columns: general path
    alone = np.vstack([clf.predict_proba(numeric.iloc[i : i + 1]) for i in range(0, 120, 7)])
    np.testing.assert_array_equal(alone, batch[::7])
    with pytest.raises(ValueError, match="feature names should match"):
        clf.predict(X.iloc[:1, ::-1])
    with pytest.raises(ValueError, match="infinity"):
        clf.predict(X.iloc[:1].replace(X.iloc[0, 1], np.inf))


@pytest.mark.parametrize("string_dtype", [object, "string"])
@pytest.mark.parametrize("estimator", [MetricAttentionClassifier, MetricAttentionRegressor])
def test_a_few_rows_of_a_mixed_frame_equal_the_general_encoding(string_dtype, estimator):
    # a few rows of numbers and string columns take predict's few-rows path (encoded at once);
    # the column-by-column encoding of a batch gives the same numbers, missing values, unseen
    # levels and errors included
    rng = np.random.default_rng(1)
    n = 300
    X = pd.DataFrame({"a": rng.normal(size=n), "b": rng.integers(0, 9, n),
                      "plan": rng.choice(["x", "y", "z"], n), "c": rng.normal(size=n),
                      "city": rng.choice(["p", "q"], n)})
    X[["plan", "city"]] = X[["plan", "city"]].astype(string_dtype)
    X.loc[::7, "a"] = np.nan
    X.loc[::5, "plan"] = None
    # (with pyarrow installed the comparison is a bool[pyarrow] column, which adds to no array)
    y = X["c"].to_numpy() + (X["city"] == "p").to_numpy(dtype=float)
    if estimator is MetricAttentionClassifier:
        y = y > 0.5
    model = estimator(**FAST).fit(X, y)
    assert model._strategy.input.few_rows(model, X.iloc[:1]) is not None  # the path is taken
    queries = X.iloc[:60].copy()
    queries.loc[3, "plan"] = "never seen"
    queries.loc[4, "city"] = None
    predict = model.predict_proba if hasattr(model, "predict_proba") else model.predict
    batch = predict(queries)
    alone = np.vstack([np.atleast_2d(predict(queries.iloc[i : i + 1])).reshape(1, -1)
                       for i in range(60)])
    np.testing.assert_array_equal(alone, np.asarray(batch).reshape(60, -1))
    with pytest.raises(ValueError, match="infinity"):
        predict(queries.iloc[:1].assign(c=np.inf))
    # numbers in a column of strings: the general way decides (here: still categorical)
    odd = queries.iloc[:1].astype({"plan": object})
    odd.loc[odd.index[0], "plan"] = 3
    assert model._strategy.input.few_rows(model, odd) is None


@pytest.mark.parametrize("metric", ["euclidean", "tabular"])
def test_datetime_and_decimal_columns_are_the_numbers_they_hold(metric):
    # a datetime column is its seconds since the epoch (NaT missing), a Decimal column its
    # values: the model equals the one fitted on those numbers, and predicts from the same kind
    rng = np.random.default_rng(0)
    n = 200
    days = rng.permutation(n).astype(float)
    days[::17] = np.nan
    cents = rng.integers(-500, 500, n)
    times = pd.to_datetime(days * 86400, unit="s")
    X = pd.DataFrame({"t": times, "d": pd.Series([decimal.Decimal(int(c)) / 100 for c in cents],
                                                 dtype=object)})
    numbers = pd.DataFrame({"t": days * 86400, "d": cents / 100})
    y = np.where(np.isnan(days), cents > 0, days > n / 2)
    params = dict(n_neighbors=5, temperature=np.inf) if metric == "euclidean" else FAST
    model = MetricAttentionClassifier(metric, **params).fit(X, y)
    expected = MetricAttentionClassifier(metric, **params).fit(numbers, y)
    assert not model._strategy.input.encoder.categorical_.any()
    np.testing.assert_array_equal(model.predict_proba(X), expected.predict_proba(numbers))
    np.testing.assert_array_equal(model.predict_proba(X.iloc[:3]), expected.predict_proba(
        numbers.iloc[:3]))  # a few rows: the few-rows paths read the times alike
    with pytest.raises(ValueError, match="'t' held datetimes at fit time but holds"):
        model.predict(numbers.iloc[:3])  # numbers for times: an error, also on a few rows
    with pytest.raises(ValueError, match="'t' held datetimes at fit time but holds 'x'"):
        model.predict(X.assign(t="x"))
