"""scikit-learn's estimator checks on AttentionNetworkClassifier (to be folded into tests/test_common.py)."""

from sklearn.utils.estimator_checks import parametrize_with_checks

from skattention.nn import AttentionNetworkClassifier

# A small network keeps the ~55 checks fast (the other metrics share this code and differ only
# inside MetricAttention, which tests/nn/test_attention.py covers).
ESTIMATORS = [AttentionNetworkClassifier("mlp", width=8, max_iter=20, learning_rate=3e-2)]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
