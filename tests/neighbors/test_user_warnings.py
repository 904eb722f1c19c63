"""The estimators' warnings point at the user's line (the caller's file), not at the library's
helpers or decorators, whatever lies between the public method and the warning."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skattention import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
)

rng = np.random.default_rng(0)
X = rng.normal(size=(60, 3))
y = (X[:, 0] > 0).astype(int)
FAR = X + 100.0  # no training point within a small radius


def _reported(call, category):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    files = {w.filename for w in caught if issubclass(w.category, category)}
    assert files, f"no {category.__name__}"
    return files


@pytest.mark.parametrize("estimator", [
    MetricAttentionClassifier("linear", max_iter=1, random_state=0),
    MetricAttentionRegressor("linear", max_iter=1, random_state=0),
    MetricAttentionTransformer(metric="linear", max_iter=1, random_state=0),
])
def test_the_convergence_warning_points_at_the_callers_fit(estimator):
    target = X[:, 0] if isinstance(estimator, MetricAttentionRegressor) else y
    assert _reported(lambda: estimator.fit(X, target), ConvergenceWarning) == {__file__}


def test_a_warning_inside_a_scikit_learn_meta_estimator_points_at_the_callers_line():
    pipe = make_pipeline(StandardScaler(),
                         MetricAttentionClassifier("linear", max_iter=1, random_state=0))
    assert _reported(lambda: pipe.fit(X, y), ConvergenceWarning) == {__file__}


def test_prediction_and_label_warnings_point_at_the_callers_line():
    clf = MetricAttentionClassifier("euclidean", radius=0.1, temperature=np.inf,
                                    outlier_label=7).fit(X, y)
    assert _reported(lambda: clf.predict(FAR), UserWarning) == {__file__}
    assert _reported(lambda: clf.predict_proba(FAR), UserWarning) == {__file__}
    reg = MetricAttentionRegressor("euclidean", radius=0.1, temperature=np.inf).fit(X, X[:, 0])
    assert _reported(lambda: reg.predict(FAR), UserWarning) == {__file__}
    column = MetricAttentionClassifier("euclidean")
    assert _reported(lambda: column.fit(X, y[:, None]), DataConversionWarning) == {__file__}
