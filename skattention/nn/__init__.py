"""PyTorch modules: metric-attention as a layer and the seed paper's propagation network.

* :class:`MetricAttention`: drop-in for :class:`torch.nn.MultiheadAttention` with a learnable
  pseudo-metric (``"mlp"``: the paper's metric-attention, ``"linear"``: L2 self-attention,
  ``"dot"``: standard attention);
* :class:`IPN`: linear -> attention blocks across the samples of a batch -> linear;
* :class:`AttentionNetworkClassifier`: a scikit-learn classifier training an :class:`IPN`.
"""

from ._attention import MetricAttention
from ._estimator import AttentionNetworkClassifier
from ._ipn import IPN

__all__ = ["MetricAttention", "IPN", "AttentionNetworkClassifier"]
