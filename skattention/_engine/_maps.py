"""Learned maps behind the learned pseudo-metrics (torch only).

Each map turns inputs into the space where the attention scores are computed:

* ``LinearMap``: f(x, y) = ||W x - W y||^2 ("L2 self-attention");
* ``ResidualMLPMap``: f(x, y) = ||phi(x) - phi(y)||^2 with phi a residual MLP (the seed paper's
  metric-attention: phi(x) = z + W2 act(W1 z + b1) + b2 per block, z = W_in x);
* ``DotProductMaps``: s(x, y) = (W_Q x).(W_K y), standard asymmetric dot-product attention;
* ``TabularMap``: f(x, y) = ||phi(x) - phi(y)|| (not squared) with phi ModernNCA's map of a
  mixed-type row: periodic ("PLR-lite") embeddings of the numbers, learned embeddings of the
  category codes, one linear layer.

The first three start at a known metric: the projection is initialised to the given matrix
(identity or a PCA basis) and each residual block's output layer to zero, so training starts
from Euclidean attention on the (projected) inputs.
"""

import copy
import itertools
import math

import torch
from torch import nn

from ._kinds import LEARNED_METRICS
from ._parallel import _mkl_threads
from ._scores import padded_rows

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

    def for_inference(self, device, dtype):
        """A copy on ``device`` in ``dtype``, in eval mode, for :meth:`images`: each linear
        layer's weight held transposed in memory (the same values), so that its product takes
        a contiguous operand, as the attention's do (``PreparedKeys.keys_t``): with the transposed
        one MKL rounded a row among 4 rows differently from among 1,024 (float32, 96 or more
        inputs: a row predicted alone differed from the same row in a batch by 1e-5)."""
        out = copy.deepcopy(self).to(device=device, dtype=dtype).eval()
        for module in out.modules():
            if isinstance(module, nn.Linear):
                module.weight.data = module.weight.data.T.contiguous().T
        return out

    def images(self, x, side="query"):
        """``query(x)`` or ``key(x)`` (``side``) at inference, each row rounded as in any other
        batch: rows padded as ``padded_rows`` pads them, MKL's products on one thread (on two,
        MKL splits a short product's inner dimension and rounds it differently: a row mapped
        alone differed from the same row in a batch by 1e-14)."""
        fn = self.query if side == "query" else self.key
        with _mkl_threads(1):
            return fn(padded_rows(x))[: x.shape[0]]

    def activation_width(self):
        """Floats per row held while mapping it (input, output and their temporaries)."""
        return 3 * (self.n_components + self.n_features)


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

    def activation_width(self):
        hidden = self.blocks[0].inner.out_features if len(self.blocks) else 0
        return 2 * hidden + super().activation_width()


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


class TabularMap(MetricMap):
    """ModernNCA's map of a mixed-type row ``x = [numbers, category codes]`` (torch only).

    ``phi(x) = W [e(x_1), ..., e(x_m)] + b + sum_j E_j[c_j]``: each of the ``n_numeric`` numbers
    (scaled; missing indicators count as numbers) either enters ``W`` as it is
    (``numeric_embedding="none"``) or through a periodic embedding
    ``e(x) = relu(L [cos(2 pi w x), sin(2 pi w x)])`` with ``n_frequencies`` frequencies ``w``
    per number (drawn from N(0, ``frequency_scale``^2) and learned) and one linear layer ``L``
    to ``d_embedding`` shared by all numbers ("PLR-lite", Gorishniy et al. 2022); each
    categorical column ``j`` adds a learned vector ``E_j[c_j]`` for its integer code ``c_j``
    (the codes travel as floats in the trailing columns of ``x``), which is one-hot times a
    linear layer. The vectors of codes 0 (missing) and 1 (unseen or rare) start at zero, so a
    level that training never saw adds nothing. The output has ``n_components`` dimensions;
    the metric is the non-squared Euclidean distance (``kind = "euclidean"``).
    """

    kind = LEARNED_METRICS["tabular"]

    def __init__(self, n_components, n_numeric, cardinalities, *, numeric_embedding="plr",
                 n_frequencies=24, frequency_scale=0.04, d_embedding=12):
        nn.Module.__init__(self)
        cardinalities = [int(c) for c in cardinalities]
        self.n_numeric, self.n_categorical = int(n_numeric), len(cardinalities)
        self.n_components = int(n_components)
        self.n_features = self.n_numeric + self.n_categorical
        self.numeric_embedding = numeric_embedding
        self.plr = numeric_embedding == "plr" and self.n_numeric > 0
        d_in = self.n_numeric
        if self.plr:
            self.frequencies = nn.Parameter(
                torch.randn(self.n_numeric, n_frequencies) * frequency_scale
            )
            self.periodic = nn.Linear(2 * n_frequencies, d_embedding)
            d_in = self.n_numeric * d_embedding
        self.linear = nn.Linear(max(d_in, 1), self.n_components)
        if d_in == 0:  # no numbers: the output is the bias plus the category vectors
            with torch.no_grad():
                self.linear.weight.zero_()
        n_codes = sum(cardinalities)
        self.embedding = None
        if n_codes:
            offsets = [0, *itertools.accumulate(cardinalities)][:-1]
            self.register_buffer("offsets", torch.as_tensor(offsets, dtype=torch.long))
            self.embedding = nn.Embedding(n_codes, self.n_components)
            # as nn.Linear's initialisation over the numbers and the one-hot codes together
            bound = 1.0 / math.sqrt(max(d_in + n_codes, 1))
            nn.init.uniform_(self.embedding.weight, -bound, bound)
            with torch.no_grad():  # codes 0 (missing) and 1 (unseen) start neutral: a level
                # never seen in training adds nothing to the row's image
                self.embedding.weight[self.offsets] = 0.0
                self.embedding.weight[self.offsets + 1] = 0.0

    def for_inference(self, device, dtype):
        out = super().for_inference(device, dtype)
        if out.plr:  # the copy is not trained: its angular frequencies computed once
            out.angular_frequencies = (2 * math.pi * out.frequencies).detach()
        return out

    def forward(self, x):
        numbers = x if x.shape[1] == self.n_numeric else x[:, : self.n_numeric]
        if self.plr:
            # 2 pi w: the inference copy's, else from the (trained) frequencies (same numbers)
            angular = self.__dict__.get("angular_frequencies")
            if angular is None:
                angular = 2 * math.pi * self.frequencies
            z = angular * numbers[..., None]
            z = torch.relu(self.periodic(_CosSin.apply(z)))
            numbers = z.flatten(1)
        if numbers.shape[1]:
            out = self.linear(numbers)
        else:
            out = self.linear.bias.expand(x.shape[0], -1)
        if self.embedding is not None:
            codes = x[:, self.n_numeric :].long() + self.offsets
            out = out + self.embedding(codes).sum(1)
        return out

    def activation_width(self):
        """Floats per row held while mapping it (input, periodic features, output)."""
        periodic = self.n_numeric * 3 * (self.periodic.in_features if self.plr else 1)
        return self.n_features + periodic + (self.n_categorical + 3) * self.n_components


class _CosSin(torch.autograd.Function):
    """``cat([cos z, sin z], -1)`` with a backward from the saved ``cos z`` and ``sin z``:
    autograd's chain would compute ``sin`` and ``cos`` again for their gradients (a good part
    of a tabular training step). (Written into the halves of one output, the two run on
    strided rows, slower than the concatenation's copy.)"""

    @staticmethod
    def forward(ctx, z):
        cos, sin = torch.cos(z), torch.sin(z)
        ctx.save_for_backward(cos, sin)
        return torch.cat([cos, sin], -1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        n = cos.shape[-1]
        # d cos = -sin, d sin = cos: the terms autograd's chain adds, in the same roundings
        return grad[..., n:] * cos + grad[..., :n] * -sin


def build_map(kind, init=None, *, hidden_size=256, n_blocks=1, activation="relu", dropout=0.0,
              n_components=None, n_numeric=0, cardinalities=(), numeric_embedding="plr"):
    """Build the map of a learned metric ``kind`` in {"linear", "mlp", "dot", "tabular"}.

    ``init`` is the (n_components, n_features) initial projection of the first three.
    ``"tabular"`` maps rows of ``n_numeric`` numbers followed by one code per categorical
    column (``cardinalities``: the number of codes of each) to ``n_components`` dimensions.
    """
    if kind == "tabular":
        return TabularMap(n_components, n_numeric, cardinalities,
                          numeric_embedding=numeric_embedding)
    init = torch.as_tensor(init, dtype=torch.float32)
    if kind == "linear":
        return LinearMap(init)
    if kind == "mlp":
        return ResidualMLPMap(init, hidden_size, n_blocks, activation, dropout)
    if kind == "dot":
        return DotProductMaps(init)
    raise ValueError(f"unknown learned metric {kind!r}; use one of {tuple(LEARNED_METRICS)}.")
