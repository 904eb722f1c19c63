"""MetricAttention as a drop-in layer, and the IPN classifier on two moons.

1. Swap ``self_attn`` of a ``nn.TransformerEncoderLayer`` for ``MetricAttention``: with
   ``metric="dot"`` and the same weights it reproduces the encoder's output exactly; with
   ``metric="mlp"`` it is the seed paper's metric-attention, f(x, y) = ||phi(x) - phi(y)||^2.
2. ``AttentionNetworkClassifier``: the paper's IPN (attention across samples) as a scikit-learn
   classifier, for the three attentions.
"""

import torch
from sklearn.datasets import make_moons
from torch import nn

from skattention.nn import AttentionNetworkClassifier, MetricAttention

torch.manual_seed(0)
encoder = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
x = torch.randn(2, 7, 16)
reference = encoder(x)
dot = MetricAttention(16, 4, "dot", batch_first=True)
dot.load_state_dict(encoder.self_attn.state_dict())  # same parameter names as nn.MultiheadAttention
encoder.self_attn = dot
print("dot-product MetricAttention == nn.MultiheadAttention:",
      torch.allclose(encoder(x), reference, atol=1e-6))
encoder.self_attn = MetricAttention(16, 4, "mlp", batch_first=True)
out, weights = encoder.self_attn(x, x, x)
print("metric-attention output", tuple(out.shape), "weights", tuple(weights.shape))

X, y = make_moons(300, noise=0.2, random_state=0)
for metric in ["dot", "linear", "mlp"]:
    clf = AttentionNetworkClassifier(
        metric, width=10, max_iter=60, learning_rate=1e-2, random_state=0
    )
    clf.fit(X[:200], y[:200])
    print(f"IPN with {metric:6s} attention: final training loss {clf.loss_curve_[-1]:.3f}, "
          f"test accuracy {clf.score(X[200:], y[200:]):.2f}")
