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

from ._budget import budget_bytes, plan_rows
from ._code_vectors import summed_code_vectors
from ._first_order import first_order_backward
from ._kinds import LEARNED_METRICS
from ._parallel import _mkl_threads
from ._scores import padded_rows

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class MetricMap(nn.Module):
    """Base class: ``query`` and ``key`` map inputs; ``kind`` is the engine metric on the images.

    ``n_features`` and ``n_components`` are the input and output dimensions; ``symmetric``:
    queries and keys are one map (a training step maps each of its points once).
    """

    kind = "sqeuclidean"
    symmetric = True

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

    def budget_rows(self, n_rows, itemsize, max_rows=None):
        """Rows of ``n_rows`` mapped at once within the working memory: each holds its input
        row and :meth:`activation_width` numbers of ``itemsize`` bytes (at most ``max_rows``)."""
        row_bytes = itemsize * (self.n_features + self.activation_width())
        return plan_rows(n_rows, row_bytes=row_bytes, budget=budget_bytes(None),
                         max_rows=max_rows)

    def chunked_keys(self, x, max_rows=None):
        """``key(x)`` of many rows (a fit's training rows) in blocks of :meth:`budget_rows`:
        mapped at once, a table's rows x periodic features held gigabytes."""
        rows = self.budget_rows(x.shape[0], x.element_size(), max_rows)
        # a short last block padded as ``images`` pads rows: one to three rows take another
        # product path, rounded otherwise than among many
        return torch.cat([self.key(padded_rows(x[s:s + rows]))[: min(rows, x.shape[0] - s)]
                          for s in range(0, max(x.shape[0], 1), rows)])

    def training_images(self, matrices, rows_per_call):
        """``images(i, rows=None)``: the key images of ``matrices[i][rows]`` (every row for
        ``None``), for a training's many calls over the same matrices of about
        ``rows_per_call`` rows each: here the map of the rows (:class:`MappedRows`)."""
        return MappedRows(self, matrices)


class MappedRows:
    """The key images of rows of fixed matrices: the map applied to them."""

    def __init__(self, metric_map, matrices):
        self.metric_map, self.matrices = metric_map, matrices

    def __call__(self, i, rows=None):
        return self.metric_map.key(self.matrices[i] if rows is None
                                   else self.matrices[i].index_select(0, rows))


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
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got "
                             f"{activation!r}.")
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
    symmetric = False

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
            numbers = self.periodic_features(self.angular() * numbers[..., None]).flatten(1)
        return self.output(numbers, x)

    def angular(self):
        """``2 pi w``: the inference copy's, else from the (trained) frequencies (same numbers)."""
        angular = self.__dict__.get("angular_frequencies")
        return 2 * math.pi * self.frequencies if angular is None else angular

    def periodic_features(self, z):
        """``e = relu(L [cos z, sin z])`` of angles ``z = 2 pi w x`` (..., n_frequencies)."""
        return torch.relu(self.periodic(_CosSin.apply(z)))

    def output(self, numbers, x):
        """The image of rows ``x`` from their numbers as ``linear`` takes them (the periodic
        features, flattened, or the numbers themselves) and their category codes."""
        if numbers.shape[1]:
            out = self.linear(numbers)
        else:
            out = self.linear.bias.expand(x.shape[0], -1)
        return self.with_codes(out, x)

    def with_codes(self, out, x):
        """``out`` (the numbers' part of the images of rows ``x``) plus their codes' vectors."""
        if self.embedding is not None:
            codes = x[:, self.n_numeric :].long() + self.offsets
            out = out + summed_code_vectors(self.embedding.weight, codes)
        return out

    def activation_width(self):
        """Floats per row held while mapping it (input, periodic features, output)."""
        periodic = self.n_numeric * 3 * (self.periodic.in_features if self.plr else 1)
        return self.n_features + periodic + (self.n_categorical + 3) * self.n_components

    def training_images(self, matrices, rows_per_call):
        """:class:`TabulatedRows` where numeric columns take at most half as many distinct
        values as a call has rows and that saves enough of the features' evaluations, else
        the map of the rows."""
        if self.plr:
            tables = TabulatedRows(self, matrices, max(rows_per_call // 2, 1))
            saved = rows_per_call * tables.n_tabulated - tables.n_values
            if saved >= MIN_SAVED_FEATURES:
                return tables
        return MappedRows(self, matrices)


MIN_SAVED_FEATURES = 8192
"""The fewest periodic features (a row's number in one column) per call that
:class:`TabulatedRows` must save: a call costs it a dozen more kernels, about as much as a few
thousand rows' features (below, small tables' steps were no faster or slower)."""

FEW_VALUES = 32
"""Columns of at most this many distinct values take :class:`TabulatedRows`' 0/1 product
(its cost grows with the values, the gathered features' with the rows)."""


class TabulatedRows:
    """The key images of rows of fixed matrices under a :class:`TabularMap` whose numeric
    columns take few distinct values (most columns of survey and business tables: codes,
    counts, missing indicators), computed per call from each such column's distinct values
    (at most ``max_values`` over all the matrices) instead of per row and column. Per call,
    the periodic features of every such value, then:

    * a column of at most :data:`FEW_VALUES` values: each value's term of the image (its
      features through the column's block of the linear layer); a row's terms are selected by
      a 0/1 matrix, one product forward and one backward;
    * a column of more: its values' features gathered for the rows;
    * the other columns: their features per row, as the map computes them.

    The same images as the map's up to rounding (its linear layer's sum taken in parts); the
    gradients are sums over the values instead of the rows. A training step's periodic
    features were most of its map's cost (docs/performance.md)."""

    def __init__(self, metric_map, matrices, max_values):
        self.metric_map, self.matrices = metric_map, matrices
        few, many, rest = [], [], []
        for j in range(metric_map.n_numeric):
            column = torch.cat([X[:, j] for X in matrices])
            head = column[: 4 * max_values]  # more distinct values there: more everywhere
            distinct = None
            if head.numel() == column.numel() or torch.unique(head).numel() <= max_values:
                distinct, inverse = torch.unique(column, return_inverse=True)
            if distinct is None or distinct.numel() > max_values:
                rest.append(j)
            else:
                (few if distinct.numel() <= FEW_VALUES else many).append((j, distinct, inverse))
        device = matrices[0].device
        long = {"dtype": torch.long, "device": device}
        tabulated = few + many  # the few-valued columns' values first
        self.n_tabulated, self.n_few = len(tabulated), len(few)
        self.n_few_values = sum(distinct.numel() for _, distinct, _ in few)
        self.n_values = sum(distinct.numel() for _, distinct, _ in tabulated)
        self.rest = torch.as_tensor(rest, **long)
        # the columns whose features enter the linear layer per row: gathered, then computed
        self.per_row = torch.as_tensor([j for j, _, _ in many] + rest, **long)
        if not tabulated:
            return
        self.values = torch.cat([distinct for _, distinct, _ in tabulated])
        self.value_column = torch.repeat_interleave(
            torch.as_tensor([j for j, _, _ in tabulated], **long),
            torch.as_tensor([distinct.numel() for _, distinct, _ in tabulated], **long))
        # a row's code of its value in each column: the value's place among all of them
        offsets = itertools.accumulate([d.numel() for _, d, _ in tabulated[:-1]], initial=0)
        codes = torch.stack([inverse + offset
                             for (_, _, inverse), offset in zip(tabulated, offsets)], 1)
        self.codes = list(torch.split(codes.to(torch.int32), [X.shape[0] for X in matrices]))

    def __call__(self, i, rows=None):
        m = self.metric_map
        # index_select: a gather of whole rows, several times faster than indexing
        x = self.matrices[i] if rows is None else self.matrices[i].index_select(0, rows)
        angular = m.angular()
        weight = m.linear.weight.view(m.n_components, m.n_numeric, -1)
        # index_select rather than indexing: its backward adds in a fixed order (indexing's
        # accumulating put does not on several threads)
        features = m.periodic_features(angular.index_select(0, self.value_column)
                                       * self.values[:, None])
        # int32 in memory; a long index adds rows back twice as fast
        codes = (self.codes[i] if rows is None else self.codes[i].index_select(0, rows)).long()
        out = m.linear.bias.expand(x.shape[0], -1)
        if self.n_few:
            few = slice(0, self.n_few_values)
            terms = torch.einsum("oud,ud->uo",
                                 weight.index_select(1, self.value_column[few]), features[few])
            select = x.new_zeros((x.shape[0], self.n_few_values))
            out = torch.addmm(out, select.scatter_(1, codes[:, : self.n_few], 1.0), terms)
        if self.per_row.numel():
            parts = []
            if self.n_tabulated > self.n_few:
                many = codes[:, self.n_few :]
                parts.append(features.index_select(0, many.flatten()).view(*many.shape, -1))
            if self.rest.numel():
                parts.append(m.periodic_features(angular.index_select(0, self.rest)
                                                 * x[:, self.rest, None]))
            row_features = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
            block = weight.index_select(1, self.per_row).flatten(1)
            out = torch.addmm(out, row_features.flatten(1), block.T)
        return m.with_codes(out, x)


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
    @first_order_backward
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
