"""Metric-attention estimators: attention from queries to the training set."""

from ._classification import MetricAttentionClassifier
from ._regression import MetricAttentionRegressor
from ._transformer import MetricAttentionTransformer

__all__ = ["MetricAttentionClassifier", "MetricAttentionRegressor", "MetricAttentionTransformer"]
