"""The mixed-type tabular encoder: column kinds, scaling, codes, sparse blocks, bad input."""

import datetime
import decimal

import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.preprocessing import QuantileTransformer

from skattention.neighbors._levels import MISSING_CODE, OTHER_CODE
from skattention.neighbors._tabular import _TabularEncoder


def _frame(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "income": rng.lognormal(10, 1, n),
        "age": pd.array(rng.integers(18, 80, n), dtype="Int64"),
        "flag": rng.random(n) > 0.5,
        "city": pd.Series(rng.choice(["Oslo", "Rome", "Lima"], n), dtype="category"),
        "plan": pd.Series(rng.choice(["basic", "pro"], n), dtype="string"),
        "note": rng.choice(["a", "b", None], n).astype(object),
    })


def test_from_dtype_kinds_and_shapes():
    X = _frame()
    X.loc[3, "income"] = np.nan
    X.loc[5, "age"] = pd.NA
    enc = _TabularEncoder().fit(X)
    assert enc.n_features_in_ == 6
    assert list(enc.feature_names_in_) == list(X.columns)
    assert enc.categorical_.tolist() == [False, False, False, True, True, True]
    assert enc.indicator_columns_.tolist() == [0, 1]  # income and age had missing values
    block = enc.transform(X)
    assert block.numeric.dtype == np.float32 and block.numeric.shape == (60, 3 + 2)
    assert block.categories.dtype == np.int64 and block.categories.shape == (60, 3)
    assert np.isfinite(block.numeric).all()
    assert block.numeric[3, 3] == 1 and block.numeric[5, 4] == 1  # the indicators
    assert block.numeric[3, 0] == 0  # a missing value sits at the scaled median
    assert enc.cardinalities_.tolist() == [3 + 2, 2 + 2, 2 + 2]
    assert (block.categories[:, 2][X["note"].isna().to_numpy()] == MISSING_CODE).all()
    names = enc.get_feature_names_out()
    assert list(names) == ["income", "age", "flag", "missing_income", "missing_age", "city",
                           "plan", "note"]


@pytest.mark.parametrize("spec", [[3, 4, 5], ["city", "plan", "note"],
                                  [False, False, False, True, True, True]])
def test_explicit_categorical_features(spec):
    enc = _TabularEncoder(categorical_features=spec).fit(_frame())
    assert enc.categorical_columns_.tolist() == [3, 4, 5]


def test_integer_column_declared_categorical_and_none():
    X = _frame()
    enc = _TabularEncoder(categorical_features=["age", "city", "plan", "note"]).fit(X)
    assert enc.categorical_[1] and enc._level_is_numeric[0]
    codes = enc.transform(X).categories[:, 0]
    assert codes.min() >= 2  # every training age is a level
    X_num = X[["income", "age"]]
    assert not _TabularEncoder(categorical_features=None).fit(X_num).categorical_.any()


def test_bad_categorical_features():
    X = _frame()
    with pytest.raises(ValueError, match="not in X's columns"):
        _TabularEncoder(categorical_features=["town"]).fit(X)
    with pytest.raises(ValueError, match="mask has 2 entries"):
        _TabularEncoder(categorical_features=[True, False]).fit(X)
    for indices in ([9], [-1]):  # negative ones too, as HistGradientBoosting
        with pytest.raises(ValueError, match="indices must be in"):
            _TabularEncoder(categorical_features=indices).fit(X)
    with pytest.raises(ValueError, match="'from_dtype'"):
        _TabularEncoder(categorical_features="auto").fit(X)
    with pytest.raises(ValueError, match="needs X as a DataFrame"):
        _TabularEncoder(categorical_features=["a"]).fit(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="numeric_scaling"):
        _TabularEncoder(numeric_scaling="minmax").fit(X)


def test_unseen_and_missing_at_predict_are_codes_not_errors():
    X = _frame()
    enc = _TabularEncoder().fit(X)
    new = X.head(3).copy()
    new["city"] = pd.Series(["Paris", None, "Rome"], dtype="category")
    new["income"] = [np.nan, 1e9, -5.0]  # missing, beyond the training range
    block = enc.transform(new)
    assert block.categories[:, 0].tolist()[:2] == [OTHER_CODE, MISSING_CODE]
    assert block.categories[2, 0] >= 2
    assert np.isfinite(block.numeric).all()
    assert block.numeric[0, 0] == 0
    # no indicator for a column without missing values at fit time
    assert block.numeric.shape[1] == 3


def test_all_nan_column_and_single_level_category():
    X = pd.DataFrame({"empty": [np.nan] * 5, "one": ["x"] * 5, "v": [1.0, 2, 3, 4, 5]})
    enc = _TabularEncoder().fit(X)
    block = enc.transform(X)
    assert np.all(block.numeric[:, 0] == block.numeric[0, 0])  # constant, finite
    assert np.isfinite(block.numeric).all()
    assert enc.cardinalities_.tolist() == [3]
    assert set(block.categories[:, 0]) == {2}


@pytest.mark.parametrize("numeric_scaling", ["robust", "quantile", None])
def test_columns_that_never_varied_are_held_at_their_fitted_encoding(numeric_scaling):
    # the map learns nothing from such a column: a value that differs at predict moved
    # queries by its untrained weights (a probability by up to 0.7)
    X = pd.DataFrame({"empty": [np.nan] * 6, "const": [2.5] * 6, "one": ["x"] * 6,
                      "none": pd.Series([None] * 6, dtype=object), "v": np.arange(6.0),
                      "c": list("abcabc")})
    enc = _TabularEncoder(numeric_scaling=numeric_scaling, hold_constant=True,
                          categorical_features=["one", "none", "c"]).fit(X)
    fitted = enc.transform(X)
    later = X.assign(empty=[3.0, np.nan, -1, 0, 1e6, 2], const=[np.nan, 1, 2, 3, 4, 5],
                     one=["y", None, "x", "z", "x", "w"], none=list("pqrstu"))
    for block in (enc.transform(later), next(enc.transform_blocks(later, 2))):
        n = len(block)
        held = [0, 1, enc.n_numeric_out_ - 1]  # empty, const, empty's missing indicator
        np.testing.assert_array_equal(block.numeric[:, held], fitted.numeric[:n, held])
        np.testing.assert_array_equal(block.categories[:, :2], fitted.categories[:n, :2])
    # the columns that varied are encoded as before
    np.testing.assert_array_equal(enc.transform(later).categories[:, 2], fitted.categories[:, 2])
    assert enc.transform(later.assign(v=-X.v)).numeric[1, 2] != fitted.numeric[1, 2]
    # without hold_constant (the fixed metrics: their distances are the input's), as read
    free = _TabularEncoder(numeric_scaling=numeric_scaling,
                           categorical_features=["one", "none", "c"]).fit(X)
    assert free.transform(later).numeric[1, 1] != fitted.numeric[1, 1]


def test_quantile_scaling_matches_scikit_learn_on_training_data():
    rng = np.random.default_rng(0)
    x = rng.exponential(size=(3000, 1))
    ours = _TabularEncoder(numeric_scaling="quantile").fit(x).transform(x).numeric[:, 0]
    ref = QuantileTransformer(n_quantiles=100, output_distribution="normal").fit_transform(x)
    np.testing.assert_allclose(ours, ref[:, 0], atol=0.02)
    assert abs(np.median(ours)) < 0.05


def test_quantile_scaling_of_a_binary_column_is_symmetric():
    x = np.array([[0.0], [1.0]] * 50)
    z = _TabularEncoder(numeric_scaling="quantile").fit(x).transform(x).numeric[:, 0]
    assert z[0] < 0 < z[1] and np.isclose(z[0], -z[1])


def test_robust_scaling_is_smoothly_clipped():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(200, 1)), [[1e6], [-1e6]]])
    z = _TabularEncoder().fit(x).transform(x).numeric[:, 0]
    assert np.abs(z).max() <= 3.0 and np.abs(z).max() > 2.9
    assert abs(np.median(z)) < 1e-6
    z = _TabularEncoder(numeric_scaling="standard").fit(x).transform(x).numeric[:, 0]
    np.testing.assert_allclose(z.std(), 1.0, rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numbers_whose_square_overflows_are_clipped_not_sent_to_the_median(dtype):
    # the clip's square overflowed beyond ~1e154 (1e19 in float32): z / inf = 0, the median
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 1)).astype(dtype)
    big = np.finfo(dtype).max / 2
    far = np.array([[big], [-big], [big / 1e6], [-big / 1e6]], dtype=dtype)
    encoder = _TabularEncoder().fit(x)
    z = encoder.transform(far).numeric[:, 0]
    np.testing.assert_array_equal(z, [3.0, -3.0, 3.0, -3.0])
    assert z.dtype == encoder.transform(x).numeric.dtype


def test_min_frequency_groups_rare_levels():
    X = pd.DataFrame({"c": ["a"] * 10 + ["b"] * 10 + ["rare"]})
    enc = _TabularEncoder(min_frequency=2).fit(X)
    assert list(enc.categories_[0]) == ["a", "b"]
    assert enc.transform(X).categories[-1, 0] == OTHER_CODE


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_sparse_with_explicit_nan_blocks_match_dense(fmt):
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(50, 4)) * (rng.random((50, 4)) < 0.3)
    dense[2, 1] = np.nan
    X = sparse.csr_matrix(dense).asformat(fmt)
    enc = _TabularEncoder().fit(X)
    assert enc.indicator_columns_.tolist() == [1]
    ref = _TabularEncoder().fit(dense).transform(dense)
    whole = enc.transform(X)
    np.testing.assert_allclose(whole.numeric, ref.numeric)
    blocks = list(enc.transform_blocks(X, block_rows=16))
    assert [len(b) for b in blocks] == [16, 16, 16, 2]
    np.testing.assert_allclose(np.concatenate([b.numeric for b in blocks]), ref.numeric)
    assert whole.numeric[2, 4] == 1 and whole.numeric[2, 1] == 0
    with pytest.raises(ValueError, match="sparse matrix"):
        _TabularEncoder(categorical_features=[0]).fit(X)


def test_dtype_changes_between_fit_and_predict():
    X = _frame()
    enc = _TabularEncoder().fit(X)
    as_text = X.copy()
    as_text["income"] = as_text["income"].astype(str)  # strings of numbers: converted
    np.testing.assert_allclose(enc.transform(as_text).numeric, enc.transform(X).numeric,
                               rtol=1e-6)
    words = X.copy()
    words["income"] = "high"
    with pytest.raises(ValueError, match="'income' is numeric for this encoder but holds text"):
        enc.transform(words)
    enc_num = _TabularEncoder(categorical_features=["age", "city", "plan", "note"]).fit(X)
    changed = X.copy()
    changed["age"] = "old"
    with pytest.raises(ValueError, match="'age' held numbers at fit time but holds strings now "
                                         "that are no numbers \\(e.g. 'old'\\)"):
        enc_num.transform(changed)


@pytest.mark.parametrize("fit_as", ["numbers", "strings"])
def test_category_levels_of_numbers_and_strings_of_numbers_are_one(fit_as):
    # 1, 1.0 and "1" are one level (level_text), whichever of them the column held at fit: a
    # category column of integers takes "1", one of "1" takes 1, as an object column does
    numbers = pd.Categorical([1, 2, 3, 1, 2])
    texts = pd.Categorical(["1", "2", "3", "1", "2"])
    X = pd.DataFrame({"icat": numbers if fit_as == "numbers" else texts, "w": np.arange(5.0)})
    enc = _TabularEncoder().fit(X)
    expected = enc.transform(X).categories
    others = ([texts, texts.astype(object), ["1", "2.0", "3", "1", "2"]] if fit_as == "numbers"
              else [numbers, np.array([1, 2, 3, 1, 2]), [1.0, 2.0, 3.0, 1.0, 2.0]])
    for other in others:
        np.testing.assert_array_equal(enc.transform(X.assign(icat=other)).categories, expected)
    unseen = ["7", None, "1", "1", "1"] if fit_as == "numbers" else [7, None, 1, 1, 1]
    np.testing.assert_array_equal(enc.transform(X.assign(icat=unseen)).categories[:3, 0],
                                  [OTHER_CODE, MISSING_CODE, expected[0, 0]])


def test_category_kind_change_that_no_level_can_match_is_a_clear_error():
    X = pd.DataFrame({"icat": pd.Categorical([1, 2, 3]), "word": pd.Categorical(list("abc"))})
    enc = _TabularEncoder().fit(X)
    with pytest.raises(ValueError, match="'icat' held numbers at fit time but holds strings "
                                         "now that are no numbers \\(e.g. 'x'\\)"):
        enc.transform(X.assign(icat=["1", "x", "2"]))
    with pytest.raises(ValueError, match="'word' held strings at fit time but holds numbers "
                                         "now \\(e.g. 1\\), and no level is a number"):
        enc.transform(X.assign(word=[1, 2, 3]))


def test_text_in_a_numeric_column_at_fit_is_a_clear_error():
    X = pd.DataFrame({"v": pd.Series(["1", "x"], dtype="category"), "w": [1.0, 2.0]})
    with pytest.raises(ValueError, match="'v' is numeric for this encoder but holds text at fit"):
        _TabularEncoder(categorical_features=None).fit(X)


def test_column_mismatch_errors():
    X = _frame()
    enc = _TabularEncoder().fit(X)
    with pytest.raises(ValueError, match="X has 5 features"):
        enc.transform(X.iloc[:, :5])
    with pytest.raises(ValueError, match="feature names should match"):
        enc.transform(X[X.columns[::-1]])
    with pytest.raises(ValueError, match="0 sample"):
        _TabularEncoder().fit(X.iloc[:0])
    with pytest.raises(ValueError, match="2-D"):
        _TabularEncoder().fit(np.zeros(3))


def test_numpy_input_has_no_feature_names():
    X = np.arange(12.0).reshape(6, 2)
    enc = _TabularEncoder().fit(pd.DataFrame(X, columns=["a", "b"]))
    enc.fit(X)
    assert enc.n_features_in_ == 2 and not hasattr(enc, "feature_names_in_")
    object_array = np.array([["a", 1.0], ["b", 2.0]], dtype=object)
    enc = _TabularEncoder().fit(object_array)
    # object columns are categorical, unless they hold only numbers
    assert enc.categorical_.tolist() == [True, False]


def test_zero_rows_at_predict():
    X = _frame()
    block = _TabularEncoder().fit(X).transform(X.iloc[:0])
    assert block.numeric.shape == (0, 3) and block.categories.shape == (0, 3)


def test_nullable_dtypes_and_mixed_object_column():
    X = pd.DataFrame({
        "b": pd.array([True, None, False, True], dtype="boolean"),
        "s": pd.array(["x", None, "y", "x"], dtype="string"),
        "f": pd.array([1.5, None, 2.0, 3.0], dtype="Float64"),
        "o": [1, "a", None, 2.5],
    })
    enc = _TabularEncoder().fit(X)
    assert enc.categorical_.tolist() == [False, True, False, True]
    assert list(enc.categories_[1]) == ["1", "2.5", "a"]  # mixed values compare as strings
    block = enc.transform(X)
    assert np.isfinite(block.numeric).all()
    assert block.numeric[1].tolist()[-2:] == [1.0, 1.0]  # both indicators of row 1
    assert block.categories[1].tolist() == [MISSING_CODE, 4]


_SECONDS = np.array([86400.0 * 18262, np.nan, 86400.0 * 3, 86400.0 * 20000.5, -86400.0])


def _times(form):
    """A column of the instants (or durations) ``_SECONDS`` (NaN: missing) in ``form``."""
    present = ~np.isnan(_SECONDS)
    if form.startswith("timedelta"):
        column = pd.Series(pd.to_timedelta(_SECONDS, unit="s"))
        return column if form == "timedelta64" else column.astype(object)
    column = pd.Series(pd.to_datetime(_SECONDS, unit="s"))
    if form == "datetime64":
        return column
    if form == "tz-aware":  # the same instants in another time zone
        return column.dt.tz_localize("UTC").dt.tz_convert("Europe/Oslo")
    if form == "Timestamp objects":
        return column.astype(object)
    cells = np.full(_SECONDS.size, None, dtype=object)
    cells[present] = [t.to_pydatetime() for t in column[present]]
    if form == "date objects":  # whole days (20000.5 days becomes day 20000)
        cells[present] = [t.date() for t in cells[present]]
    return pd.Series(cells, dtype=object)


@pytest.mark.parametrize("form", ["datetime64", "tz-aware", "Timestamp objects",
                                  "datetime objects", "date objects", "timedelta64",
                                  "timedelta objects"])
def test_datetimes_and_durations_are_seconds(form):
    # seconds since the Unix epoch (or of the duration), NaT missing: the same encoding as the
    # numbers themselves, at fit and at prediction
    seconds = np.floor(_SECONDS / 86400) * 86400 if form == "date objects" else _SECONDS
    X = pd.DataFrame({"t": _times(form), "v": np.arange(5.0)})
    numbers = pd.DataFrame({"t": seconds, "v": np.arange(5.0)})
    for scaling in (None, "robust"):
        enc = _TabularEncoder(numeric_scaling=scaling).fit(X)
        assert enc.categorical_.tolist() == [False, False]
        expected = _TabularEncoder(numeric_scaling=scaling).fit(numbers).transform(numbers)
        np.testing.assert_array_equal(enc.transform(X).numeric, expected.numeric)
        np.testing.assert_array_equal(enc.transform(X.iloc[[2, 1]]).numeric,
                                      expected.numeric[[2, 1]])
    missing = X.iloc[[1]].assign(t=[np.nan])  # a batch of missing values only (float64)
    np.testing.assert_array_equal(enc.transform(missing).numeric, expected.numeric[[1]])
    held = "durations" if form.startswith("timedelta") else "datetimes"
    for other in (["2020-01-01"] * 5, numbers["t"]):
        with pytest.raises(ValueError, match=f"'t' held {held} at fit time but holds"):
            enc.transform(X.assign(t=other))
    with pytest.raises(ValueError, match="'v' held numbers at fit time but holds"):
        enc.transform(X.assign(v=pd.to_datetime(X["v"], unit="s")))


def test_dates_beyond_pandas_range_are_a_clear_error():
    X = pd.DataFrame({"d": pd.Series([datetime.date(1, 1, 1), datetime.date(2020, 1, 1)])})
    with pytest.raises(ValueError, match="'d' holds datetimes beyond pandas' range"):
        _TabularEncoder().fit(X)


def test_decimal_values_are_numbers():
    values = [decimal.Decimal("1.50"), None, decimal.Decimal("-2"), decimal.Decimal("0.25")]
    X = pd.DataFrame({"d": pd.Series(values, dtype=object)})
    numbers = pd.DataFrame({"d": [1.5, np.nan, -2.0, 0.25]})
    enc = _TabularEncoder(numeric_scaling=None).fit(X)
    assert enc.categorical_.tolist() == [False]
    expected = enc.transform(numbers).numeric
    np.testing.assert_array_equal(expected, _TabularEncoder(numeric_scaling=None).fit(numbers)
                                  .transform(numbers).numeric)
    np.testing.assert_array_equal(enc.transform(X).numeric, expected)
    # declared categorical, a Decimal is the level of its value, as a float is
    enc = _TabularEncoder(categorical_features=[0]).fit(pd.DataFrame({"d": [1, "a", 1.5]}))
    np.testing.assert_array_equal(enc.transform(X.iloc[[0, 2]]).categories,
                                  enc.transform(pd.DataFrame({"d": [1.5, -2]})).categories)


def test_periods_and_intervals_are_categorical():
    X = pd.DataFrame({"p": pd.period_range("2020-01", periods=4, freq="M"),
                      "i": pd.interval_range(0, 4)})
    assert _TabularEncoder().fit(X).categorical_.tolist() == [True, True]


def test_wide_sparse_blocks_are_bounded():
    X = sparse.random(300, 2000, density=0.002, format="csr", random_state=0)
    enc = _TabularEncoder().fit(X)
    assert enc.n_numeric_out_ == 2000
    sizes = [b.numeric.shape for b in enc.transform_blocks(X, block_rows=128)]
    assert sizes == [(128, 2000), (128, 2000), (44, 2000)]
    dense = X.toarray()
    np.testing.assert_allclose(
        np.concatenate([b.numeric for b in enc.transform_blocks(X.tocsc(), block_rows=100)]),
        _TabularEncoder().fit(dense).transform(dense).numeric,
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_arrays_of_each_numeric_dtype_encode_alike_and_infinity_is_an_error(dtype):
    # float64 arrays skip the second full check (the estimators validated them already), but
    # the encoder alone still refuses infinity and encodes them as any other numeric array
    rng = np.random.default_rng(0)
    X = rng.integers(0, 9, size=(40, 3)).astype(dtype)
    enc = _TabularEncoder().fit(X.astype(np.float64))
    np.testing.assert_array_equal(enc.transform(X).numeric,
                                  enc.transform(X.astype(np.float64)).numeric)
    if dtype != np.int64:
        bad = X.copy()
        bad[1, 2] = -np.inf
        with pytest.raises(ValueError, match="infinity"):
            enc.transform(bad)


@pytest.mark.parametrize("scaling", [None, "robust", "standard"])
def test_numeric_arrays_encode_as_column_by_column(scaling):
    # arrays take a vectorised path (all numeric columns at once); a DataFrame of the same
    # numbers goes column by column: the same numbers to the bit
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6)) * [1, 10, 1e-3, 1e5, 1, 1]
    X[rng.random(X.shape) < 0.1] = np.nan
    X[:, 4] = rng.integers(0, 3, 300)
    enc = _TabularEncoder(numeric_scaling=scaling, categorical_features=[4]).fit(X)
    Xq = rng.normal(size=(50, 6)) * 3
    Xq[rng.random(Xq.shape) < 0.2] = np.nan
    Xq[:, 4] = rng.integers(0, 4, 50)
    fast, slow = enc.transform(Xq), enc.transform(pd.DataFrame(Xq))
    assert fast.numeric.shape == (50, 5 + enc.indicator_columns_.size)
    np.testing.assert_array_equal(fast.numeric, slow.numeric)
    np.testing.assert_array_equal(fast.categories, slow.categories)
