"""The target statistics of categorical columns of many levels (``_target_statistics``): the
shrinkage of scikit-learn's TargetEncoder, cross fitting that never reads a row's own target,
sample weights, and the tabular estimators that add them on many rows."""

import pickle
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import TargetEncoder

from skattention.neighbors._levels import level_codes
from skattention.neighbors._target_statistics import TargetStatistics, target_numbers
from tests.conftest import cheap


def _column(n, n_levels, seed=0):
    rng = np.random.default_rng(seed)
    levels = np.array([f"L{i:04d}" for i in range(n_levels)], dtype=object)
    values = levels[rng.integers(0, n_levels, n)]
    y = rng.normal(size=n_levels)[level_codes(values, levels) - 2] + rng.normal(size=n)
    return values, levels, y


@pytest.mark.parametrize("classes", [False, True])
def test_statistics_of_new_rows_are_target_encoders(classes):
    values, levels, y = _column(3000, 40)
    if classes:
        y = np.where(y > 0.5, "b", np.where(y < -0.5, "a", "c"))
    targets = target_numbers(y, classes, 16)
    statistics = TargetStatistics()
    statistics.fit_transform([level_codes(values, levels)], [levels.size + 2], targets, None,
                             np.random.RandomState(0))
    encoder = TargetEncoder(smooth="auto", target_type="multiclass" if classes else "continuous")
    encoder.fit(values[:, None], y if classes else targets[:, 0])
    expected = np.column_stack(encoder.encodings_)
    if classes:  # TargetEncoder's classes sorted; target_numbers' in order of appearance
        order = [list(pd.unique(y)).index(c) for c in encoder.classes_]
        expected = expected[:, np.argsort(order)]
    np.testing.assert_allclose(statistics.tables[0][2:], expected, rtol=1e-10, atol=1e-12)
    # unseen levels: the overall mean
    np.testing.assert_allclose(statistics.tables[0][1], targets.mean(0), atol=1e-12)


def test_a_training_row_statistics_never_read_its_own_target():
    values, levels, y = _column(2000, 30)
    codes = [level_codes(values, levels)]
    targets = y[:, None].copy()

    def cross_fitted(t):
        return TargetStatistics().fit_transform(codes, [levels.size + 2], t, None,
                                                np.random.RandomState(0))

    before = cross_fitted(targets)
    targets[7] += 100.0
    after = cross_fitted(targets)
    changed = np.flatnonzero(np.abs(after - before).ravel() > 1e-12)
    # the rows of the other four folds read it (the overall mean and variance at least); its
    # own fold's, row 7 among them, do not
    assert 7 not in changed
    assert changed.size == 2000 - 2000 // 5


def test_zero_weights_are_rows_left_out():
    values, levels, y = _column(1500, 35)
    weight = np.ones(y.size)
    weight[::3] = 0.0
    targets = y[:, None]
    size = [levels.size + 2]
    weighted = TargetStatistics()
    weighted.fit_transform([level_codes(values, levels)], size, targets, weight,
                           np.random.RandomState(0))
    kept = weight > 0
    # the overall mean and variance of the kept rows
    alone = TargetStatistics()
    alone.fit_transform([level_codes(values[kept], levels)], size, targets[kept], None,
                        np.random.RandomState(0))
    np.testing.assert_allclose(weighted.tables[0], alone.tables[0], rtol=1e-12, atol=1e-12)


def _many_rows(n=17_000, seed=0):
    """A table beyond the rows where the tabular map codes rare levels alike, with a column of
    3,000 levels (most rare) that carries most of the target."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3000, n)
    X = pd.DataFrame({
        "x": rng.normal(size=n),
        "name": np.array([f"n{i}" for i in range(3000)], dtype=object)[codes],
        "kind": np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, n)],
    })
    y = rng.normal(size=3000)[codes] + 0.3 * X["x"].to_numpy() + 0.3 * rng.normal(size=n)
    return X, y


@pytest.fixture(scope="module")
def fitted_regressor():
    X, y = _many_rows()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return cheap("MetricAttentionRegressor", max_iter=1).fit(X, y), X, y


def test_many_rows_add_the_statistics_of_columns_of_many_levels(fitted_regressor):
    model, X, _ = fitted_regressor
    encoder = model._strategy.input.encoder
    names = list(encoder.get_feature_names_out())
    assert "name_target" in names and "kind_target" not in names  # 3 levels: the embedding
    assert model._strategy.input.layout.n_numeric == encoder.n_numeric_out_ == 2
    # a single row and the row in a batch, and after a pickle round trip, read them alike
    rows = X.iloc[:8]
    batch = model.predict(rows)
    np.testing.assert_allclose([model.predict(rows.iloc[[i]])[0] for i in range(8)], batch,
                               rtol=1e-6)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(model)).predict(rows), batch)


def test_training_rows_keep_their_cross_fitted_statistics_as_keys(fitted_regressor):
    model, X, _ = fitted_regressor
    column = list(model._strategy.input.encoder.get_feature_names_out()).index("name_target")
    keys = np.asarray(model._keys.inputs)
    assert keys.shape[0] == X.shape[0]
    # the same rows as queries take the statistics of every training row, which differ from
    # the cross-fitted ones the map trained on and the keys keep
    queries = next(model._strategy.input.blocks(X.iloc[:2000]))
    assert not np.allclose(keys[:2000, column], queries[:, column])
    np.testing.assert_array_equal(keys[:2000, :column], queries[:, :column])


def test_few_rows_fit_no_statistics():
    X, y = _many_rows(n=4000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionRegressor", max_iter=1).fit(X, y)
    assert model._strategy.input.encoder.statistic_columns_.size == 0


def test_statistics_help_where_most_levels_are_rare():
    X, y = _many_rows(n=20_000, seed=1)
    test_X, test_y = X.iloc[16_500:], y[16_500:]
    X, y = X.iloc[:16_500], y[:16_500]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionRegressor", max_iter=3, hidden_size=16).fit(X, y)
    # the name's effect (variance 1) is most of the target's: without it R^2 is about 0.1
    assert model.score(test_X, test_y) > 0.5


def test_a_warm_start_keeps_the_first_fits_statistics():
    X, y = _many_rows()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionRegressor", max_iter=1, warm_start=True).fit(X, y)
        statistics = model._strategy.input.encoder._statistics.target_statistics
        tables = [t.copy() for t in statistics.tables]
        model.fit(X, -y)  # other targets: statistics refitted would differ
    kept = model._strategy.input.encoder._statistics.target_statistics.tables
    for before, after in zip(tables, kept, strict=True):
        np.testing.assert_array_equal(before, after)


def test_statistics_that_predict_no_better_than_the_mean_are_left_out():
    values, levels, y = _column(4000, 800, seed=3)  # 5 rows a level, the level matters
    rng = np.random.default_rng(4)
    noise = levels[rng.integers(0, levels.size, y.size)]  # 5 rows a level, unrelated to y
    statistics = TargetStatistics()
    out = statistics.fit_transform(
        [level_codes(noise, levels), level_codes(values, levels)], [levels.size + 2] * 2,
        y[:, None], None, np.random.RandomState(0))
    assert statistics.kept == [1] and statistics.skills[0] < 0 < statistics.skills[1]
    assert out.shape == (y.size, 1) and len(statistics.tables) == 1


def test_equal_rows_take_one_statistic_per_fold():
    # 17,500 rows drawn from 700 distinct ones: a row's statistics come from the other folds,
    # so the copies of a row differ by fold (at most 5 keys a row), equal within one
    rng = np.random.default_rng(5)
    distinct = pd.DataFrame({"x": rng.integers(0, 3, 700).astype(float),
                             "name": np.array([f"n{i}" for i in range(100)],
                                              dtype=object)[rng.integers(0, 100, 700)]})
    rows = rng.integers(0, 700, 17_500)
    X = distinct.iloc[rows].reset_index(drop=True)
    y = rng.normal(size=100)[X["name"].str[1:].astype(int)] + rng.normal(size=rows.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionRegressor", max_iter=1).fit(X, y)
    assert "name_target" in model._strategy.input.encoder.get_feature_names_out()
    n_distinct = X.drop_duplicates().shape[0]
    assert n_distinct < np.unique(np.asarray(model._keys.inputs), axis=0).shape[0]
    assert np.unique(np.asarray(model._keys.inputs), axis=0).shape[0] <= 5 * n_distinct


def test_more_indicator_columns_than_the_limit_fit_no_statistics():
    X, y = _many_rows()
    labels = np.digitize(y, np.quantile(y, np.linspace(0, 1, 18)[1:-1]))  # 17 classes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionClassifier", max_iter=1).fit(X, labels)
    assert model._strategy.input.encoder.statistic_columns_.size == 0
    assert model.predict(X.iloc[:3]).shape == (3,)


def test_a_column_of_rare_levels_only_reads_other_kinds_as_its_levels(fitted_regressor):
    model, X, y = fitted_regressor
    assert model._strategy.input.encoder.categories_[0].size == 0  # every name is rare
    rows = X.iloc[:4].assign(name=np.arange(4))
    for query in (rows, rows.iloc[[0]]):  # numbers for levels of words: as for kept levels
        with pytest.raises(ValueError, match="held strings at fit time"):
            model.predict(query)
    ids = X.assign(name=X["name"].str[1:].astype(int))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionRegressor", max_iter=1,
                      categorical_features=["name", "kind"]).fit(ids, y)
    rows = ids.iloc[:4]
    as_text = rows.assign(name=rows["name"].astype(str))  # "12" is the level 12
    np.testing.assert_allclose(model.predict(as_text), model.predict(rows), rtol=1e-6)
    np.testing.assert_allclose(model.predict(as_text.iloc[[1]]), model.predict(rows.iloc[[1]]),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="held numbers at fit time"):
        model.predict(rows.assign(name="abc"))


def test_targets_of_too_many_classes_are_never_built():
    # a classifier given a continuous target (rejected after this) or thousands of classes:
    # n x n_classes indicators took gigabytes on a few ten thousand rows
    y = np.arange(20_000) * 0.5
    tracemalloc.start()
    try:
        assert target_numbers(y, True, 16) is None
        assert target_numbers(np.column_stack([y % 9, y % 10]), True, 16) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20


def test_the_docs_say_many_classes_take_no_statistics():
    # 17 classes or more add no column's statistics (target_numbers' None): the estimators'
    # categorical_features says so, not only the 16 columns per column that fewer classes take
    from skattention import MetricAttentionClassifier

    assert target_numbers(np.arange(17), True, 16) is None
    assert target_numbers(np.arange(16), True, 16).shape == (16, 16)
    doc = " ".join(MetricAttentionClassifier.__doc__.split())
    assert "17 classes or more" in doc


def test_a_column_whose_tables_exceed_the_memory_budget_adds_none():
    values, levels, y = _column(3000, 40)
    codes, size = [level_codes(values, levels)], [levels.size + 2]
    statistics = TargetStatistics()
    out = statistics.fit_transform(codes, size, y[:, None], None, np.random.RandomState(0),
                                   max_bytes=1000)
    assert out.shape == (3000, 0) and statistics.kept == [] and np.isnan(statistics.skills[0])
    statistics.fit_transform(codes, size, y[:, None], None, np.random.RandomState(0),
                             max_bytes=10**6)
    assert statistics.kept == [0]


def test_the_transformers_fit_transform_gives_the_training_rows_cross_fitted_statistics():
    X, y = _many_rows()
    labels = np.where(y > 0, "hi", "lo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionTransformer", max_iter=1)
        fitted = model.fit_transform(X, labels)
    assert "name_target" in model._strategy.input.encoder.get_feature_names_out()
    assert fitted.shape == (X.shape[0], model.map_.n_components)
    # transform(X) gives the training rows every row's statistics, their own targets' among them
    assert not np.allclose(fitted, model.transform(X))
    expected = model._strategy.embed(np.asarray(model._keys.inputs), "key",
                                     torch.device("cpu"), model._compute_dtype())
    np.testing.assert_array_equal(fitted, expected)


def test_the_transformers_fit_transform_without_statistics_is_fit_then_transform():
    X, y = _many_rows(n=3000)
    labels = np.where(y > 0, "hi", "lo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = cheap("MetricAttentionTransformer", max_iter=1)
        fitted = model.fit_transform(X, labels)
    np.testing.assert_array_equal(fitted, model.transform(X))


def test_levels_seen_once_take_training_statistics_near_the_centre():
    # Most levels are seen in one row (an id): their cross-fitted statistics are their other
    # folds' means, a hair apart, and must stay a hair apart once scaled, not be blown up by
    # quartiles that fall among those means (the few repeated levels carry the signal).
    from skattention.neighbors._tabular import _TabularEncoder

    rng = np.random.default_rng(0)
    repeated = np.repeat([f"r{i}" for i in range(10)], 40)
    once = np.array([f"u{i}" for i in range(1600)], dtype=object)
    values = np.concatenate([repeated, once]).astype(object)
    y = np.where(np.char.startswith(values.astype(str), "r"),
                 np.repeat(np.linspace(-2, 2, 10), 40).tolist() + [0.0] * 1600, 0.0)
    y = y + 0.3 * rng.normal(size=y.size)
    X = pd.DataFrame({"id": values})
    encoder = _TabularEncoder().fit(X)
    rows = encoder.fit_statistics(X, target_numbers(y, False, 16), 30, random_state=0)
    assert rows is not None
    seen_once = rows[repeated.size:, 0]
    assert np.ptp(seen_once) < 0.1
    assert np.ptp(rows[:repeated.size, 0]) > 1.0
