"""The regressor's linear trend: a ridge regression fitted first, attention on its residuals."""

import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import RidgeCV
from sklearn.neighbors import KNeighborsRegressor

from skattention import MetricAttentionRegressor
from skattention.neighbors._trend import fit_trend, gcv_penalty

from ..conftest import cheap

ALPHAS = np.logspace(-3, 3, 13)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.integers(0, 6, size=(120, 3)).astype(float)  # ties and duplicated rows
    y = X @ [2.0, -1.0, 0.5] + np.sin(X[:, 0]) + rng.normal(0, 0.1, 120)
    return X, y


def test_auto_is_linear_for_learned_metrics_and_none_for_the_fixed_one(data):
    X, y = data
    with pytest.warns(ConvergenceWarning):
        learned = cheap("MetricAttentionRegressor").fit(X, y)
    assert isinstance(learned.trend_, RidgeCV)
    fixed = MetricAttentionRegressor("euclidean", n_neighbors=5, temperature=np.inf).fit(X, y)
    assert fixed.trend_ is None
    # the k-NN special case is untouched (continuous points: no tied 5th neighbours, where
    # scikit-learn's brute force picks any of the tied ones)
    rng = np.random.default_rng(2)
    Xc, queries = rng.normal(size=(120, 3)), rng.normal(size=(30, 3))
    fixed.fit(Xc, y)
    knn = KNeighborsRegressor(5, algorithm="brute").fit(Xc, y)
    np.testing.assert_allclose(fixed.predict(queries), knn.predict(queries))


@pytest.mark.parametrize("multi_output", [False, True])
def test_linear_trend_then_neighbours_on_the_residuals(data, multi_output):
    X, y = data
    if multi_output:
        y = np.column_stack([y, -3 * y + X[:, 1]])
    weight = np.random.default_rng(1).uniform(0.5, 2.0, len(y))
    model = MetricAttentionRegressor("euclidean", n_neighbors=4, temperature=np.inf,
                                     trend="linear").fit(X, y, sample_weight=weight)
    ridge = RidgeCV(alphas=ALPHAS).fit(X, y, sample_weight=weight)
    residual = y - ridge.predict(X)
    # sample weights are also the keys' multiplicities of the weighted k-NN
    queries = X[:40] + 0.25
    expected = ridge.predict(queries) + MetricAttentionRegressor(
        "euclidean", n_neighbors=4, temperature=np.inf, trend=None
    ).fit(X, residual, sample_weight=weight).predict(queries)
    np.testing.assert_allclose(model.predict(queries), expected, rtol=1e-10, atol=1e-10)
    assert model.predict(queries).shape == expected.shape


def test_trend_extrapolates_a_linear_target():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, size=(200, 2))
    y = 3 * X[:, 0] - X[:, 1]
    far = np.array([[1.5, 0.5], [-0.5, 0.5]])
    kw = dict(metric="euclidean", n_neighbors=5, temperature=np.inf)
    with_trend = MetricAttentionRegressor(trend="linear", **kw).fit(X, y).predict(far)
    without = MetricAttentionRegressor(trend=None, **kw).fit(X, y).predict(far)
    truth = 3 * far[:, 0] - far[:, 1]
    assert np.abs(with_trend - truth).max() < 0.05 < np.abs(without - truth).min()


def test_categorical_levels_enter_the_trend_one_hot():
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"size": rng.normal(size=150),
                      "city": pd.Series(rng.choice(["a", "b", "c"], 150), dtype="category")})
    y = 2 * X["size"].to_numpy() + X["city"].map({"a": 0.0, "b": 5.0, "c": -5.0}).to_numpy()
    with pytest.warns(ConvergenceWarning):
        model = cheap("MetricAttentionRegressor").fit(X, y)
    # a level's effect is one coefficient of the trend: the exact offsets are recovered
    assert model.score(X, y) > 0.999
    unseen = X.iloc[:3].assign(city=pd.Categorical(["z"] * 3))
    assert np.isfinite(model.predict(unseen)).all()


def test_trend_needs_features_and_in_memory_data(data):
    X, y = data
    D = np.abs(X[:, None, 0] - X[None, :, 0])
    with pytest.raises(ValueError, match="precomputed"):
        MetricAttentionRegressor("precomputed", trend="linear", temperature=1.0).fit(D, y)
    assert MetricAttentionRegressor("precomputed", temperature=1.0).fit(D, y).trend_ is None
    with pytest.raises(ValueError, match="trend"):
        MetricAttentionRegressor(trend="quadratic").fit(X, y)


def test_radius_outliers_stay_nan_with_a_trend(data):
    X, y = data
    model = MetricAttentionRegressor("euclidean", radius=0.5, temperature=np.inf,
                                     trend="linear").fit(X, y)
    with pytest.warns(UserWarning, match="no neighbors"):
        pred = model.predict(np.vstack([[100.0, 100.0, 100.0], X[0]]))
    assert np.isnan(pred[0]) and np.isfinite(pred[1])


def test_sample_weights_are_checked_before_the_trend_and_few_rows_fit_none(data):
    X, y = data
    weight = np.ones(len(y))
    weight[0] = -1.0
    with pytest.raises(ValueError, match="Negative values"):
        MetricAttentionRegressor("euclidean", trend="linear").fit(X, y, sample_weight=weight)
    weight = np.zeros(len(y))
    weight[:2] = 1.0
    model = MetricAttentionRegressor("euclidean", trend="linear", n_neighbors=2,
                                     temperature=np.inf).fit(X, y, sample_weight=weight)
    assert model.trend_ is None


def test_the_trend_leaves_out_the_widest_categorical_columns():
    # a column with thousands of levels would make the penalty search cubic in its width: the
    # trend takes the narrow columns and leaves that one to the attention (found in review)
    rng = np.random.default_rng(0)
    n = 6000
    X = pd.DataFrame({"x": rng.normal(size=n),
                      "id": pd.Series(rng.integers(0, 3000, n).astype(str), dtype="category"),
                      "kind": pd.Series(rng.choice(["a", "b"], n), dtype="category")})
    y = 2 * X["x"].to_numpy() + (X["kind"] == "a").to_numpy()
    model = MetricAttentionRegressor(max_iter=1, hidden_size=4, random_state=0,
                                     early_stopping=False)
    with pytest.warns(ConvergenceWarning):
        model.fit(X, y)
    width = model.trend_.coef_.shape[-1]
    assert width <= 1024
    encoder = model._strategy.input.encoder
    assert width == encoder.n_numeric_out_ + encoder.cardinalities_[1]


# the penalty RidgeCV would choose, found in one pass (neighbors/_trend.py)


def _design(n, n_levels, n_numeric, seed, dense=False):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, n_levels, n)
    one_hot = sparse.csr_matrix((np.ones(n), (np.arange(n), codes)), shape=(n, n_levels))
    numbers = sparse.csr_matrix(rng.normal(size=(n, n_numeric)))
    X = sparse.hstack([numbers, one_hot]).tocsr()
    effect = rng.normal(size=n_levels)
    y = numbers.toarray() @ rng.normal(size=n_numeric) + effect[codes] + rng.normal(size=n)
    return (X.toarray() if dense else X), y, rng


@pytest.mark.parametrize("case", ["sparse", "dense", "weighted", "two outputs", "one column",
                                  "wide", "many rows", "float32"])
def test_the_trend_is_ridgecv_at_its_own_penalty(case):
    n, levels = {"wide": (60, 150), "many rows": (9000, 40)}.get(case, (700, 30))
    X, y, rng = _design(n, levels, 4, seed=len(case), dense=case == "dense")
    weight = rng.uniform(0.2, 3.0, n) if case == "weighted" else np.ones(n)
    if case == "two outputs":
        y = np.column_stack([y, 2.0 * y + rng.normal(size=n)])
    if case == "one column":  # as the regressor passes a single target
        y = y[:, None]
    if case == "float32":
        X, y = X.astype(np.float32), y.astype(np.float32)
    want = RidgeCV(alphas=ALPHAS).fit(X, y, sample_weight=weight)
    assert ALPHAS[0] < want.alpha_ < ALPHAS[-1]  # a choice, not the grid's end
    got = fit_trend(X, y, weight, ALPHAS)
    assert got.alpha_ == want.alpha_
    # float32: RidgeCV computes in float32, the trend in float64 then rounds to it
    rtol, atol = (1e-5, 1e-5) if case == "float32" else (1e-9, 1e-12)
    np.testing.assert_allclose(got.coef_, want.coef_, rtol=rtol, atol=atol)
    np.testing.assert_allclose(got.intercept_, want.intercept_, rtol=rtol, atol=atol)
    assert np.shape(got.coef_) == np.shape(want.coef_)
    assert np.shape(got.intercept_) == np.shape(want.intercept_)
    assert got.coef_.dtype == want.coef_.dtype
    np.testing.assert_allclose(got.best_score_, want.best_score_, rtol=rtol)
    np.testing.assert_allclose(got.predict(X[:50]), want.predict(X[:50]), rtol=rtol,
                               atol=atol)


def test_the_penalty_follows_the_noise():
    # more noise, more penalty: the leave-one-out errors are computed, not a fixed choice
    X, y, rng = _design(400, 20, 3, seed=1)
    quiet = gcv_penalty(X, y, np.ones(400), ALPHAS)
    noisy = gcv_penalty(X, y + 30.0 * rng.normal(size=400), np.ones(400), ALPHAS)
    assert noisy > quiet


def test_a_design_without_columns_fits_no_trend():
    # a single categorical column of more levels than the trend's width takes: no column is
    # left for the trend, and the regressor propagates the targets alone (it raised before)
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"id": [f"l{i}" for i in rng.integers(0, 1500, 3000)]})
    y = rng.normal(size=3000)
    with pytest.warns(ConvergenceWarning):
        model = MetricAttentionRegressor(random_state=0, max_iter=2).fit(X, y)
    assert model.trend_ is None
    assert np.isfinite(model.predict(X[:5])).all()


def test_the_trend_is_the_same_on_any_number_of_blas_threads():
    # OpenBLAS splits the eigendecomposition's and the chunks' products over its threads,
    # in other roundings: a regressor's trend depended on the machine's load and cores
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(0)
    n, levels = 6000, 300
    codes = rng.integers(0, levels, size=n)
    design = sparse.hstack([sparse.csr_matrix(rng.normal(size=(n, 4))),
                            sparse.csr_matrix((np.ones(n), (np.arange(n), codes)),
                                              shape=(n, levels))]).tocsr()
    y = design @ rng.normal(size=design.shape[1]) + rng.normal(size=n)
    fits = []
    for threads in (2, 1):
        with threadpoolctl.threadpool_limits(limits=threads, user_api="blas"):
            fits.append(fit_trend(design, y, np.ones(n), ALPHAS))
    assert fits[0].alpha_ == fits[1].alpha_
    np.testing.assert_array_equal(fits[0].coef_, fits[1].coef_)
    assert fits[0].intercept_ == fits[1].intercept_
