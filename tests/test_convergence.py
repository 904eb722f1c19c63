"""ConvergenceWarning when training runs all max_iter epochs without its stopping rule."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from tests.conftest import cheap

TRAINING = ["MetricAttentionClassifier", "MetricAttentionRegressor",
            "MetricAttentionTransformer", "AttentionNetworkClassifier"]


@pytest.fixture(scope="module")
def data():
    return make_classification(n_samples=120, n_features=4, random_state=0)


@pytest.mark.parametrize("name", TRAINING)
def test_warns_at_max_iter(data, name):
    X, y = data
    with pytest.warns(ConvergenceWarning, match="max_iter=3"):
        est = cheap(name, max_iter=3).fit(X, y)
    assert est.n_iter_ == 3


@pytest.mark.parametrize("name", TRAINING)
def test_hint_names_warm_start_only_where_it_is_a_parameter(data, name):
    X, y = data
    est = cheap(name, max_iter=1)
    with pytest.warns(ConvergenceWarning, match="Raise max_iter") as record:
        est.fit(X, y)
    message = str(record[0].message)
    assert ("warm_start" in message) == ("warm_start" in est.get_params())
    assert ("warm_start" in message) == (name != "AttentionNetworkClassifier")


@pytest.mark.parametrize("name", TRAINING)
def test_silent_when_the_stopping_rule_stops(data, name):
    X, y = data
    # tol larger than any improvement: the rule stops after n_iter_no_change epochs
    est = cheap(name, max_iter=20, tol=1e9, n_iter_no_change=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est.fit(X, y)
    assert est.n_iter_ == 3  # the first epoch improves on nothing, two more do not


def test_fixed_metric_never_warns(data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        cheap("MetricAttentionClassifier", metric="euclidean", max_iter=1).fit(X, y)


def test_warm_start_counts_this_fit(data):
    X, y = data
    est = cheap("MetricAttentionClassifier", max_iter=2, warm_start=True)
    with pytest.warns(ConvergenceWarning):
        est.fit(X, y)
    with pytest.warns(ConvergenceWarning):
        est.fit(X, y)  # two more epochs: all of this fit's max_iter
    assert est.n_iter_ == 4
    assert np.isfinite(est.loss_curve_).all()
