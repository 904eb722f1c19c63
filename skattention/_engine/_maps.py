"""Learned maps behind the learned pseudo-metrics (torch only).

Each map turns inputs into the space where the attention scores are computed:

* ``LinearMap``: f(x, y) = ||W x - W y||^2 ("L2 self-attention");
* ``ResidualMLPMap``: f(x, y) = ||phi(x) - phi(y)||^2 with phi a residual MLP (the seed paper's
  metric-attention: phi(x) = z + W2 act(W1 z + b1) + b2 per block, z = W_in x);
* ``DotProductMaps``: s(x, y) = (W_Q x).(W_K y), standard asymmetric dot-product attention.

All start at a known metric: the projection is initialised to the given matrix (identity or a PCA
basis) and each residual block's output layer to zero, so training starts from Euclidean attention
on the (projected) inputs.
"""

import torch
from torch import nn

from ._scores import LEARNED_METRICS

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class MetricMap(nn.Module):
    """Base class: ``query`` and ``key`` map inputs; ``kind`` is the engine metric on the images.

    ``n_features`` and ``n_components`` are the input and output dimensions.
    """

    kind = "sqeuclidean"

    def __init__(self, init):
        super().__init__()
        self.n_components, self.n_features = (int(v) for v in init.shape)

    def query(self, x):
        return self(x)

    def key(self, x):
        return self(x)


class LinearMap(MetricMap):
    """phi(x) = W x."""

    kind = LEARNED_METRICS["linear"]

    def __init__(self, init):
        super().__init__(init)
        self.linear = nn.Linear(init.shape[1], init.shape[0], bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(init)

    def forward(self, x):
        return self.linear(x)


class ResidualBlock(nn.Module):
    """z -> z + W2 drop(act(W1 z + b1)) + b2, starting as the identity (W2, b2 = 0)."""

    def __init__(self, width, hidden, activation, dropout):
        super().__init__()
        self.inner = nn.Linear(width, hidden)
        self.act = _ACTIVATIONS[activation]()
        self.drop = nn.Dropout(dropout)
        self.outer = nn.Linear(hidden, width)
        with torch.no_grad():  # the block starts as the identity
            self.outer.weight.zero_()
            self.outer.bias.zero_()

    def forward(self, z):
        return z + self.outer(self.drop(self.act(self.inner(z))))


class ResidualMLPMap(MetricMap):
    """phi(x) = blocks(W_in x), each block z -> z + W2 drop(act(W1 z + b1)) + b2."""

    kind = LEARNED_METRICS["mlp"]

    def __init__(self, init, hidden_size, n_blocks, activation="relu", dropout=0.0):
        super().__init__(init)
        width = init.shape[0]
        self.proj = nn.Linear(init.shape[1], width, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(init)
        self.blocks = nn.Sequential(
            *[ResidualBlock(width, hidden_size, activation, dropout) for _ in range(n_blocks)]
        )

    def forward(self, x):
        return self.blocks(self.proj(x))


_ResidualBlock = ResidualBlock  # the name in pickles of earlier versions


class DotProductMaps(MetricMap):
    """Queries W_Q x and keys W_K y scored by their dot product."""

    kind = LEARNED_METRICS["dot"]

    def __init__(self, init):
        super().__init__(init)
        self.w_query = nn.Linear(init.shape[1], init.shape[0], bias=False)
        self.w_key = nn.Linear(init.shape[1], init.shape[0], bias=False)
        with torch.no_grad():
            self.w_query.weight.copy_(init)
            self.w_key.weight.copy_(init)

    def forward(self, x):
        return self.w_query(x)

    def query(self, x):
        return self.w_query(x)

    def key(self, x):
        return self.w_key(x)


def build_map(kind, init, *, hidden_size=256, n_blocks=1, activation="relu", dropout=0.0):
    """Build the map of a learned metric ``kind`` in {"linear", "mlp", "dot"}.

    ``init`` is the (n_components, n_features) initial projection.
    """
    init = torch.as_tensor(init, dtype=torch.float32)
    if kind == "linear":
        return LinearMap(init)
    if kind == "mlp":
        return ResidualMLPMap(init, hidden_size, n_blocks, activation, dropout)
    if kind == "dot":
        return DotProductMaps(init)
    raise ValueError(f"unknown learned metric {kind!r}; use one of {tuple(LEARNED_METRICS)}.")
