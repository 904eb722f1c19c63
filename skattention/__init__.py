"""skattention: attention as classical machine learning, with scikit-learn estimators.

Attention is a learnable pseudo-metric plus similarity-weighted propagation; k-NN, radius
neighbours and Nadaraya-Watson regression are its exact special cases.
"""

import importlib

from ._config import config_context, get_config, set_config

# The estimators and the engine (torch, scikit-learn) load on first use (PEP 562), so that the
# command line answers a mistyped argument without importing them.
_LAZY_NAMES = {
    "attention": "_engine",
    "kneighbors": "_engine",
    "resolve_device": "_engine",
    "AttentionKMeans": "cluster",
    "AttentionMeanShift": "cluster",
    "AttentionDiffusionEmbedding": "manifold",
    "MetricAttentionClassifier": "neighbors",
    "MetricAttentionRegressor": "neighbors",
    "MetricAttentionTransformer": "neighbors",
    "AttentionNetworkClassifier": "nn",
}
# the subpackages that importing the names above made attributes of the package, and the
# public ones no name above comes from
_LAZY_MODULES = {"_engine", "cluster", "manifold", "neighbors", "nn", "plotting", "utils"}

__version__ = "0.1.0.dev0"

__all__ = [
    "AttentionDiffusionEmbedding",
    "AttentionKMeans",
    "AttentionMeanShift",
    "AttentionNetworkClassifier",
    "MetricAttentionClassifier",
    "MetricAttentionRegressor",
    "MetricAttentionTransformer",
    "attention",
    "kneighbors",
    "resolve_device",
    "get_config",
    "set_config",
    "config_context",
    "__version__",
]


def __getattr__(name):
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    elif name in _LAZY_MODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | _LAZY_MODULES)
