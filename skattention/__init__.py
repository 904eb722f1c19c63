"""skattention: attention as classical machine learning, with scikit-learn estimators.

Attention is a learnable pseudo-metric plus similarity-weighted propagation; k-NN, radius
neighbours and Nadaraya-Watson regression are its exact special cases.
"""

from ._config import config_context, get_config, set_config
from ._engine import attention, kneighbors, resolve_device
from .cluster import AttentionKMeans, AttentionMeanShift
from .manifold import AttentionDiffusionEmbedding
from .neighbors import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
)
from .nn import AttentionNetworkClassifier

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
