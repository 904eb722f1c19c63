"""Shared test settings: the one table of cheap estimator settings.

Tests of behaviour other than model quality (input handling, persistence, progress reports,
threads, devices) build their estimators with :func:`cheap`: two training epochs and tiny widths
for the learned metrics, one k-means initialisation, a fixed seed. The network classifier gets
enough epochs to learn easy data, since scikit-learn's checks (tests/test_common.py) score it.
"""

from skattention.utils import all_estimators

CHEAP = {
    "MetricAttentionClassifier": dict(max_iter=2, hidden_size=4, random_state=0),
    "MetricAttentionRegressor": dict(max_iter=2, hidden_size=4, random_state=0),
    "MetricAttentionTransformer": dict(max_iter=2, hidden_size=4, random_state=0),
    "AttentionDiffusionEmbedding": dict(n_components=1, random_state=0),
    "AttentionKMeans": dict(n_clusters=2, max_iter=2, n_init=1, random_state=0),
    "AttentionMeanShift": dict(max_iter=2),
    # the network's scikit-learn checks take 60 s at its default width and epochs, 11 s like this
    "AttentionNetworkClassifier": dict(width=8, max_iter=20, learning_rate=3e-2, random_state=0),
}
ESTIMATORS = dict(all_estimators())


def cheap(name, **params):
    """The estimator called ``name`` with the cheap settings, overridden by ``params``."""
    return ESTIMATORS[name](**{**CHEAP[name], **params})
