"""The regressor's linear trend: the penalty RidgeCV would choose, found in one pass."""

import numpy as np
import pytest
from scipy import sparse
from sklearn.linear_model import RidgeCV

from skattention.neighbors._trend import fit_trend, gcv_penalty

ALPHAS = np.logspace(-3, 3, 13)


def _design(n, n_levels, n_numeric, seed, dense=False):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, n_levels, n)
    one_hot = sparse.csr_matrix((np.ones(n), (np.arange(n), codes)), shape=(n, n_levels))
    numbers = sparse.csr_matrix(rng.normal(size=(n, n_numeric)))
    X = sparse.hstack([numbers, one_hot]).tocsr()
    effect = rng.normal(size=n_levels)
    y = numbers.toarray() @ rng.normal(size=n_numeric) + effect[codes] + rng.normal(size=n)
    return (X.toarray() if dense else X), y, rng


@pytest.mark.parametrize("case", ["sparse", "dense", "weighted", "two outputs", "wide",
                                  "many rows"])
def test_the_trend_is_ridgecv_at_its_own_penalty(case):
    n, levels = {"wide": (60, 150), "many rows": (9000, 40)}.get(case, (700, 30))
    X, y, rng = _design(n, levels, 4, seed=len(case), dense=case == "dense")
    weight = rng.uniform(0.2, 3.0, n) if case == "weighted" else np.ones(n)
    if case == "two outputs":
        y = np.column_stack([y, 2.0 * y + rng.normal(size=n)])
    want = RidgeCV(alphas=ALPHAS).fit(X, y, sample_weight=weight)
    assert ALPHAS[0] < want.alpha_ < ALPHAS[-1]  # a choice, not the grid's end
    got = fit_trend(X, y, weight, ALPHAS)
    assert got.alpha_ == want.alpha_
    np.testing.assert_allclose(got.coef_, want.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.intercept_, want.intercept_, rtol=1e-9, atol=1e-12)


def test_the_penalty_follows_the_noise():
    # more noise, more penalty: the leave-one-out errors are computed, not a fixed choice
    X, y, rng = _design(400, 20, 3, seed=1)
    quiet = gcv_penalty(X, y, np.ones(400), ALPHAS)
    noisy = gcv_penalty(X, y + 30.0 * rng.normal(size=400), np.ones(400), ALPHAS)
    assert noisy > quiet
