"""Manifold learning with attention as a diffusion operator, and tools for its continuous limit."""

from ._embedding import AttentionDiffusionEmbedding
from ._theory import attention_generator, spectral_cluster_count

__all__ = ["AttentionDiffusionEmbedding", "attention_generator", "spectral_cluster_count"]
