"""Clustering by attention: soft k-means as cross-attention, mean shift as repeated attention."""

from ._kmeans import AttentionKMeans
from ._mean_shift import AttentionMeanShift

__all__ = ["AttentionKMeans", "AttentionMeanShift"]
