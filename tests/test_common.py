"""scikit-learn's estimator checks on every public estimator, found automatically."""

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from skattention.utils import all_estimators

ESTIMATORS = [cls() for _, cls in all_estimators()]

# Expected failures: {estimator name: {check name: written reason}}. Keep this empty unless a
# check cannot apply; every entry needs its reason.
EXPECTED_FAILED_CHECKS = {}


def test_discovery_finds_the_estimators():
    names = {name for name, _ in all_estimators()}
    assert {"MetricAttentionClassifier", "MetricAttentionRegressor"} <= names


@parametrize_with_checks(
    ESTIMATORS,
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS.get(type(est).__name__, {}),
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
