"""PyTorch modules: metric-attention as a layer, attention priors and the seed paper's network.

* :class:`MetricAttention`: drop-in for :class:`torch.nn.MultiheadAttention` (its whole
  constructor, ``kdim``/``vdim`` cross-attention included) with a learnable pseudo-metric
  (``"mlp"``: the paper's metric-attention, ``"linear"``: L2 self-attention, ``"dot"``: standard
  attention);
* attention priors, additive log-priors on the scores (masks and positional biases alike):
  :class:`RelativePositionBias` (T5, learned; :func:`relative_position_bucket`), :class:`ALiBi`
  (:func:`alibi_slopes`), :class:`CausalMask`, :class:`KeyPaddingMask`, their base
  :class:`AttentionPrior` and their sum :class:`PriorSum`;
* :class:`IPN`: linear -> attention blocks across the samples of a batch -> linear (a
  context propagated once for many calls: :class:`PreparedContext`);
* :class:`AttentionNetworkClassifier`: a scikit-learn classifier training an :class:`IPN`.
"""

from ._attention import MetricAttention
from ._estimator import AttentionNetworkClassifier
from ._ipn import IPN, PreparedContext
from ._priors import (
    ALiBi,
    AttentionPrior,
    CausalMask,
    KeyPaddingMask,
    PriorSum,
    RelativePositionBias,
    alibi_slopes,
    relative_position_bucket,
)

__all__ = [
    "MetricAttention",
    "IPN",
    "PreparedContext",
    "AttentionNetworkClassifier",
    "AttentionPrior",
    "RelativePositionBias",
    "ALiBi",
    "CausalMask",
    "KeyPaddingMask",
    "PriorSum",
    "relative_position_bucket",
    "alibi_slopes",
]
