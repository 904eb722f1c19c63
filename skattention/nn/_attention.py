"""MetricAttention: the seed paper's metric-attention as a drop-in for ``nn.MultiheadAttention``.

Scores of head ``h`` between a query ``x`` and a key ``y`` (the documentation's theory page):

* ``metric="mlp"``: ``-||phi(W x + b) - phi(W y + b)||^2_h / T_h`` with one shared projection ``W``
  for queries and keys and ``phi(z) = z + W2 tanh(W1 z + b1) + b2`` (the paper's metric-attention);
* ``metric="linear"``: the same without ``phi`` ("L2 self-attention" with tied query/key weights);
* ``metric="dot"``: ``(W_Q x + b_Q) . (W_K y + b_K) / sqrt(head_dim)``, standard attention, with
  parameters laid out exactly as in ``nn.MultiheadAttention``.

Keys of another width than the queries (``kdim``) get their own projection ``W_K`` into the
space where the distances are measured.

The squared-distance scores run through the fused ``scaled_dot_product_attention`` kernel with the
augmented-coordinate identity (the documentation's engine page), through the engine's own
helpers (``augmented_coordinates``, ``scaled_dot_product``):
``-||q - k||^2 / T = (q' . k') / T - ||q||^2 / T`` with ``q' = [q, 1]``, ``k' = [2 k, -||k||^2]``,
and ``||q||^2`` is constant along a softmax row. Keys (and queries) are centred per head first
(the distances do not change) to limit cancellation in float32.

Torch only: no scikit-learn imports here.
"""

import math
from numbers import Integral

import torch
import torch.nn.functional as F
from torch import nn

from .._engine import (
    LEARNED_METRICS,
    ResidualBlock,
    augmented_coordinates,
    scaled_dot_product,
)
from ._masks import merged_mask
from ._priors import AttentionPrior

# the tabular map takes category codes, not token vectors: not a layer metric
METRICS = tuple(m for m in LEARNED_METRICS if m != "tabular")


class MetricAttention(nn.Module):
    r"""Multi-head attention with a learnable pseudo-metric (the seed paper's metric-attention).

    Same constructor arguments (by keyword) and call convention as
    :class:`torch.nn.MultiheadAttention`: ``forward(query, key, value, key_padding_mask=None,
    need_weights=True, attn_mask=None, average_attn_weights=True, is_causal=False)`` returns
    ``(attn_output, attn_weights)``, with the same shapes, mask semantics and ``batch_first``
    handling, so it can replace ``self_attn`` of a :class:`torch.nn.TransformerEncoderLayer`
    and ``self_attn`` or ``multihead_attn`` (the cross-attention) of a
    :class:`torch.nn.TransformerDecoderLayer`.

    Parameters
    ----------
    embed_dim : int
        Model dimension: the width of the queries and of the output.
    num_heads : int, default=1
        Number of heads; ``embed_dim`` must be divisible by it.
    metric : {"mlp", "linear", "dot"}, default="mlp"
        Score of head ``h`` between a query ``x`` and a key ``y``:

        - ``"mlp"``: ``-||phi(z_x) - phi(z_y)||^2_h / T_h`` with ``z = W x + b`` one projection
          shared by queries and keys, ``phi(z) = z + W2 tanh(W1 z + b1) + b2`` a residual MLP on
          the whole embedding (``W2, b2`` start at zero, so training starts from ``"linear"``)
          and ``||.||_h`` the norm on head ``h``'s slice;
        - ``"linear"``: ``-||z_x - z_y||^2_h / T_h`` (L2 self-attention, tied query/key weights);
        - ``"dot"``: ``(W_Q x + b_Q).(W_K y + b_K) / sqrt(head_dim)``, exactly
          :class:`torch.nn.MultiheadAttention`, with every option below.

        With ``kdim != embed_dim`` the squared-distance metrics project keys by their own
        ``z_y = W_K y + b_K`` (queries keep ``W``), into the same space.
    dropout : float, default=0.0
        Dropout on the attention weights (training only).
    bias : bool, default=True
        Biases of the input and output projections.
    add_bias_kv : bool, default=False
        Append one learned key ``bias_k`` and value ``bias_v`` to every sequence of keys and
        values, after their projection (for ``"mlp"``, after ``phi``: ``bias_k`` is a point of
        the space where the distances are measured). No mask hides them.
    add_zero_attn : bool, default=False
        Append a key and a value of zeros after the projection (and after ``bias_k``): under
        ``"dot"`` a score of 0; under the squared-distance metrics a key at the origin of the
        space where the distances are measured, score ``-||phi(z_x)||^2_h / T_h``. No mask
        hides it.
    kdim, vdim : int, default=None
        Widths of the keys and of the values; ``None``: ``embed_dim``.
    batch_first : bool, default=False
        Inputs and output are (batch, seq, feature) instead of (seq, batch, feature).
    temperature : float, default=None
        Starting temperature ``T_h`` of the squared-distance metrics (every head).
        ``None``: ``sqrt(head_dim)``, the scale of dot-product attention. Ignored by ``"dot"``.
    learn_temperature : bool, default=False
        Learn ``log T_h`` per head (a parameter ``log_temperature`` of shape (num_heads,)).
    hidden_size : int, default=None
        Hidden width of ``phi`` (``"mlp"``); ``None``: ``embed_dim`` (the paper's choice).
    activation : {"tanh", "relu", "gelu"}, default="tanh"
        Activation of ``phi``.
    prior : AttentionPrior, default=None
        A log-prior added to the scores at every call, on top of the masks: a
        :class:`RelativePositionBias` (T5), :class:`ALiBi`, a :class:`CausalMask`, or a sum of
        them. Its table is ``prior(L, S)``; it must have 1 or ``num_heads`` heads. A learned
        prior is a submodule, so its parameters train with the layer's.
    device, dtype : optional
        Factory arguments of the parameters.

    Attributes
    ----------
    in_proj_weight : Parameter or None
        When ``kdim`` and ``vdim`` equal ``embed_dim``. ``"dot"``: shape
        (3 embed_dim, embed_dim), rows ``[W_Q; W_K; W_V]`` as in ``nn.MultiheadAttention``.
        Other metrics: shape (2 embed_dim, embed_dim), rows ``[W; W_V]`` (queries and keys
        share ``W``). ``None`` otherwise.
    q_proj_weight, k_proj_weight, v_proj_weight : Parameter or None
        When ``kdim`` or ``vdim`` differs from ``embed_dim``, as in ``nn.MultiheadAttention``:
        shapes (embed_dim, embed_dim), (embed_dim, kdim), (embed_dim, vdim).
        ``k_proj_weight`` is None for the squared-distance metrics with ``kdim == embed_dim``
        (keys share ``q_proj_weight``).
    in_proj_bias : Parameter or None
        Biases of the projections, one ``embed_dim`` slice per distinct projection, in the
        order above (3 slices, or 2 when queries and keys share ``W``).
    bias_k, bias_v : Parameter of shape (1, 1, embed_dim) or None
        The learned key and value of ``add_bias_kv``.
    out_proj : nn.Linear
    phi : nn.Module or None
        The residual MLP (``"mlp"``).
    log_temperature : Parameter or buffer of shape (num_heads,) or None
    prior : AttentionPrior or None

    Notes
    -----
    Masks follow :class:`torch.nn.MultiheadAttention`: a boolean ``attn_mask`` (shape (L, S) or
    (N * num_heads, L, S)) is True where attention is *not* allowed, a float one is added to the
    scores; a boolean ``key_padding_mask`` (N, S) is True for keys to ignore, a float one is added.
    ``is_causal=True`` without ``attn_mask`` applies a causal mask (``nn.MultiheadAttention``
    requires the mask; with a mask, the mask is used as given). A query whose keys are all
    masked gets NaN with ``need_weights=True``, and with ``need_weights=False`` what
    ``scaled_dot_product_attention`` gives it (zeros before ``out_proj`` on the CPU), as in
    ``nn.MultiheadAttention``. Masks and ``prior`` are one mechanism, an
    additive log-prior ``log p0`` (:doc:`/theory`): they are summed into one float mask. With
    ``add_bias_kv`` or ``add_zero_attn`` the weights have one column per appended key after the
    ``S`` given ones, as in ``nn.MultiheadAttention``.

    With ``need_weights=False`` the output comes from
    :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels where the device
    has them); with ``need_weights=True`` the weights are computed explicitly, from the same
    augmented scores, and averaged over heads when ``average_attn_weights``.

    Examples
    --------
    >>> import torch
    >>> from skattention.nn import MetricAttention
    >>> _ = torch.manual_seed(0)
    >>> layer = MetricAttention(16, num_heads=4, metric="mlp", batch_first=True)
    >>> x = torch.randn(2, 5, 16)
    >>> out, w = layer(x, x, x)
    >>> tuple(out.shape), tuple(w.shape)
    ((2, 5, 16), (2, 5, 5))
    >>> bool(torch.allclose(w.sum(-1), torch.ones(2, 5)))
    True

    Cross-attention from 16-wide queries to 7 keys of width 3 and values of width 5:

    >>> cross = MetricAttention(16, 4, kdim=3, vdim=5, add_zero_attn=True, batch_first=True)
    >>> out, w = cross(x, torch.randn(2, 7, 3), torch.randn(2, 7, 5))
    >>> tuple(out.shape), tuple(w.shape)  # the zero key is the 8th column
    ((2, 5, 16), (2, 5, 8))

    In a stack of encoder layers, ``enable_nested_tensor=False`` (the nested-tensor fast path
    reads ``nn.MultiheadAttention``'s packed weights; the encoder warns that it is off):

    >>> from torch import nn
    >>> layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    >>> layer.self_attn = MetricAttention(16, 4, batch_first=True)
    >>> encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    >>> tuple(encoder(x).shape)
    (2, 5, 16)
    """

    def __init__(self, embed_dim, num_heads=1, metric="mlp", *, dropout=0.0, bias=True,
                 add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
                 batch_first=False, temperature=None, learn_temperature=False, hidden_size=None,
                 activation="tanh", prior=None, device=None, dtype=None):
        super().__init__()
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}.")
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})."
            )
        for name, dim in (("kdim", kdim), ("vdim", vdim)):
            if dim is not None and not dim > 0:
                raise ValueError(f"{name} must be a positive integer or None, got {dim!r}.")
        if hidden_size is not None and not (
                isinstance(hidden_size, Integral) and not isinstance(hidden_size, bool)
                and hidden_size > 0):
            raise ValueError(f"hidden_size must be a positive integer or None, got "
                             f"{hidden_size!r}.")
        if temperature is not None and not temperature > 0:
            raise ValueError(f"temperature must be positive or None, got {temperature!r}.")
        if prior is not None and not isinstance(prior, AttentionPrior):
            raise TypeError(f"prior must be an AttentionPrior or None, got {type(prior)}.")
        if prior is not None and prior.num_heads not in (1, num_heads):
            raise ValueError(f"prior has {prior.num_heads} heads; the layer has {num_heads}.")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.metric = metric
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.add_zero_attn = bool(add_zero_attn)
        # TransformerEncoderLayer's fused inference fast path reads nn.MultiheadAttention's
        # weights directly; this flag makes it fall back to calling this module.
        self._qkv_same_embed_dim = False
        self._init_projections(bias, factory)
        self.bias_k = self.bias_v = None
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.phi = None
        if metric == "mlp":
            hidden = embed_dim if hidden_size is None else hidden_size
            self.phi = ResidualBlock(embed_dim, hidden, activation, 0.0).to(
                **factory
            )
        if metric == "dot":
            self.log_temperature = None
        else:
            t0 = math.sqrt(self.head_dim) if temperature is None else float(temperature)
            log_t = torch.full((num_heads,), math.log(t0), **factory)
            if learn_temperature:
                self.log_temperature = nn.Parameter(log_t)
            else:
                self.register_buffer("log_temperature", log_t)
        self.prior = prior
        self._reset_parameters()

    def _init_projections(self, bias, factory):
        """``nn.MultiheadAttention``'s layout: one packed weight when every input has
        ``embed_dim`` features, one weight per input otherwise."""
        E = self.embed_dim
        n_proj = 2 if self._shared_w else 3
        if self.kdim == E and self.vdim == E:
            self.in_proj_weight = nn.Parameter(torch.empty(n_proj * E, E, **factory))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(E, E, **factory))
            self.k_proj_weight = (
                None if self._shared_w else nn.Parameter(torch.empty(E, self.kdim, **factory))
            )
            self.v_proj_weight = nn.Parameter(torch.empty(E, self.vdim, **factory))
        self.in_proj_bias = nn.Parameter(torch.empty(n_proj * E, **factory)) if bias else None

    def _reset_parameters(self):
        # As nn.MultiheadAttention: xavier-uniform input projections, zero biases, xavier-normal
        # bias_k and bias_v.
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight,
                  self.v_proj_weight):
            if w is not None:
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    def __setstate__(self, state):
        # modules pickled before kdim, vdim, add_bias_kv and add_zero_attn existed
        super().__setstate__(state)
        defaults = {"kdim": self.embed_dim, "vdim": self.embed_dim, "add_zero_attn": False}
        for name, value in defaults.items():
            self.__dict__.setdefault(name, value)
        for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v"):
            self._parameters.setdefault(name, None)

    def extra_repr(self):
        dims = "" if self.kdim == self.vdim == self.embed_dim else (
            f", kdim={self.kdim}, vdim={self.vdim}"
        )
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, metric={self.metric!r}"
                f"{dims}, batch_first={self.batch_first}")

    # ------------------------------------------------------------------ helpers

    @property
    def _shared_w(self):
        """Whether queries and keys share one projection ``W`` (squared-distance metrics, keys
        as wide as queries)."""
        return self.metric != "dot" and self.kdim == self.embed_dim

    def _project(self, x, role):
        """Input projection of the queries (``role`` 0), keys (1) or values (2)."""
        E = self.embed_dim
        row = role - 1 if self._shared_w and role else role
        if self.in_proj_weight is not None:
            w = self.in_proj_weight[row * E:(row + 1) * E]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[role]
            w = self.q_proj_weight if w is None else w
        b = None if self.in_proj_bias is None else self.in_proj_bias[row * E:(row + 1) * E]
        return F.linear(x, w, b)

    def _heads(self, x):
        n, length, _ = x.shape
        return x.view(n, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _extra_keys(self):
        return (self.bias_k is not None) + self.add_zero_attn

    def _query_features(self, query):
        """Projected queries (after ``phi`` for ``"mlp"``), (N, L, E)."""
        zq = self._project(query, 0)
        return zq if self.phi is None else self.phi(zq)

    def _key_features(self, key, value):
        """Projected keys (after ``phi`` for ``"mlp"``) and values, (N, S, E), without the
        appended keys and values: what a cache of keys keeps (``IPN.prepare_context``)."""
        zk = self._project(key, 1)
        if self.phi is not None:
            zk = self.phi(zk)
        return zk, self._project(value, 2)

    def _score_inputs(self, zq, zk):
        """Per-head (q, k, scale) such that the scores are ``scale * q @ k.T`` (+ row constants)."""
        if self.metric == "dot":
            return self._heads(zq), self._heads(zk), 1.0 / math.sqrt(self.head_dim)
        inv_t = torch.exp(-self.log_temperature).to(zq.dtype)[:, None, None]
        q, k = augmented_coordinates(self._heads(zq), self._heads(zk), inv_t)
        return q, k, 1.0

    def _check_inputs(self, query, key, value):
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(
                "query, key and value must all be 2-D (unbatched) or all 3-D, got "
                f"{query.dim()}-D, {key.dim()}-D and {value.dim()}-D."
            )
        for name, t, dim in (("query", query, self.embed_dim), ("key", key, self.kdim),
                             ("value", value, self.vdim)):
            if t.shape[-1] != dim:
                raise ValueError(
                    f"{name} has {t.shape[-1]} features; the layer expects {dim} "
                    f"({'embed_dim' if name == 'query' else name[0] + 'dim'})."
                )

    # ------------------------------------------------------------------ forward

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : Tensor of shape (L, N, E), (N, L, E) if ``batch_first``, or (L, E) unbatched
        key : Tensor of shape (S, N, kdim), (N, S, kdim) if ``batch_first``, or (S, kdim)
        value : Tensor of shape (S, N, vdim), (N, S, vdim) if ``batch_first``, or (S, vdim)
        key_padding_mask : Tensor of shape (N, S) or (S,), bool or float, default=None
        need_weights : bool, default=True
        attn_mask : Tensor of shape (L, S) or (N * num_heads, L, S), bool or float, default=None
        average_attn_weights : bool, default=True
        is_causal : bool, default=False

        Returns
        -------
        attn_output : Tensor shaped like ``query``
        attn_weights : Tensor of shape (N, L, S'), (N, num_heads, L, S') when not averaged,
            without the batch axis for unbatched inputs; None when ``need_weights=False``.
            ``S' = S`` plus one for ``add_bias_kv`` and one for ``add_zero_attn``.
        """
        self._check_inputs(query, key, value)
        batched = query.dim() == 3
        if not batched:
            query, key, value = query[None], key[None], value[None]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[None]
            if attn_mask is not None and attn_mask.dim() == 3:  # (num_heads, L, S) unbatched
                attn_mask = attn_mask.reshape(-1, *attn_mask.shape[-2:])
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        n, length, _ = query.shape
        src_len = key.shape[1]
        if key.shape[0] != n or value.shape[0] != n or value.shape[1] != src_len:
            raise ValueError("key and value must have the same batch size and length, and the "
                             "batch size of query.")
        zk, v = self._key_features(key, value)
        out, weights = self._attend_features(
            self._query_features(query), zk, v, key_padding_mask, need_weights, attn_mask,
            average_attn_weights, is_causal,
        )
        if not batched:
            out = out[0]
            weights = None if weights is None else weights[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _attend_features(self, zq, zk, v, key_padding_mask=None, need_weights=True,
                         attn_mask=None, average_attn_weights=True, is_causal=False):
        """``forward`` from the projected queries ``zq`` (N, L, E), keys ``zk`` and values ``v``
        (N, S, E; without the appended keys and values), batch first: ``(out (N, L, E),
        weights)``."""
        n, length, _ = zq.shape
        src_len = zk.shape[1]
        if self._extra_keys():
            zk = _appended(zk, self.bias_k, self.add_zero_attn)
            v = _appended(v, self.bias_v, self.add_zero_attn)
        q, k, scale = self._score_inputs(zq, zk)
        v = self._heads(v)
        # A causal mask alone goes to SDPA as is_causal: as an array it would be L x S (bytes
        # and floats: 5 GiB at 32k positions) where the fused kernel needs none.
        causal_kernel = (is_causal and not need_weights and attn_mask is None
                         and key_padding_mask is None and self.prior is None
                         and not self._extra_keys())
        mask = merged_mask(
            attn_mask, key_padding_mask, is_causal and not causal_kernel, self.prior, n=n,
            num_heads=self.num_heads, length=length, src_len=src_len,
            extra_keys=self._extra_keys(), dtype=q.dtype, device=q.device,
        )
        out, weights = self._attend(q, k, v, scale, mask, need_weights, causal_kernel)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, self.embed_dim))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def _attend(self, q, k, v, scale, mask, need_weights, is_causal=False):
        """Per-head outputs (N, H, L, head_dim) and weights (N, H, L, S') or None;
        ``is_causal``: SDPA's causal mask (``need_weights=False`` only)."""
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = torch.matmul(q, k.transpose(-2, -1)) * scale
            if mask is not None:
                scores = scores + mask
            weights = torch.softmax(scores, dim=-1)
            if dropout_p > 0:
                weights = F.dropout(weights, p=dropout_p)
            return torch.matmul(weights, v), weights
        v_wide = v
        if q.shape[-1] != v.shape[-1]:
            # The fused kernels want one head size for queries, keys and values, a multiple
            # of 8 (as the engine's SDPA backend pads); the augmented coordinates have one
            # column more than the values. Zero columns change no score and no output kept.
            width = -(-q.shape[-1] // 8) * 8
            q, k, v_wide = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
        n, heads, length, _ = q.shape
        out = scaled_dot_product(
            q,
            k,
            v_wide,
            attn_mask=None if mask is None else mask.expand(n, heads, length, k.shape[-2]),
            dropout_p=dropout_p,
            scale=scale,
            is_causal=is_causal,
        )
        return out[..., :self.head_dim], None


def _appended(z, bias, zero):
    """``z`` (N, S, E) followed by ``bias`` (1, 1, E) if given and a row of zeros if ``zero``."""
    n, _, width = z.shape
    parts = [z]
    if bias is not None:
        parts.append(bias.to(z.dtype).expand(n, 1, width))
    if zero:
        parts.append(z.new_zeros(n, 1, width))
    return torch.cat(parts, dim=1)
