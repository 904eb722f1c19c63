"""MetricAttention: the seed paper's metric-attention as a drop-in for ``nn.MultiheadAttention``.

Scores of head ``h`` between a query ``x`` and a key ``y`` (the documentation's theory page):

* ``metric="mlp"``: ``-||phi(W x + b) - phi(W y + b)||^2_h / T_h`` with one shared projection ``W``
  for queries and keys and ``phi(z) = z + W2 tanh(W1 z + b1) + b2`` (the paper's metric-attention);
* ``metric="linear"``: the same without ``phi`` ("L2 self-attention" with tied query/key weights);
* ``metric="dot"``: ``(W_Q x + b_Q) . (W_K y + b_K) / sqrt(head_dim)``, standard attention, with
  parameters laid out exactly as in ``nn.MultiheadAttention``.

The squared-distance scores run through the fused ``scaled_dot_product_attention`` kernel with the
augmented-coordinate identity (the documentation's engine page), through the engine's own
helpers (``augmented_coordinates``, ``scaled_dot_product``):
``-||q - k||^2 / T = (q' . k') / T - ||q||^2 / T`` with ``q' = [q, 1]``, ``k' = [2 k, -||k||^2]``,
and ``||q||^2`` is constant along a softmax row. Keys (and queries) are centred per head first
(the distances do not change) to limit cancellation in float32.

Torch only: no scikit-learn imports here.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._engine import LEARNED_METRICS, ResidualBlock, augmented_coordinates, scaled_dot_product
from ._priors import AttentionPrior

# the tabular map takes category codes, not token vectors: not a layer metric
METRICS = tuple(m for m in LEARNED_METRICS if m != "tabular")


class MetricAttention(nn.Module):
    r"""Multi-head attention with a learnable pseudo-metric (the seed paper's metric-attention).

    Same call convention as :class:`torch.nn.MultiheadAttention`: ``forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
    is_causal=False)`` returns ``(attn_output, attn_weights)``, with the same shapes, mask
    semantics and ``batch_first`` handling, so it can replace ``self_attn`` in a
    :class:`torch.nn.TransformerEncoderLayer`.

    Parameters
    ----------
    embed_dim : int
        Model dimension (queries, keys and values all have it).
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
          :class:`torch.nn.MultiheadAttention`.
    dropout : float, default=0.0
        Dropout on the attention weights (training only).
    bias : bool, default=True
        Biases of the input and output projections.
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
    in_proj_weight : Parameter
        ``"dot"``: shape (3 embed_dim, embed_dim), rows ``[W_Q; W_K; W_V]`` as in
        ``nn.MultiheadAttention``. Other metrics: shape (2 embed_dim, embed_dim), rows
        ``[W; W_V]`` (queries and keys share ``W``).
    in_proj_bias : Parameter or None
        Biases matching ``in_proj_weight``'s rows.
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
    ``is_causal=True`` without ``attn_mask`` applies a causal mask (with a mask, the mask is used
    as given). A query whose keys are all masked gets NaN, as in ``nn.MultiheadAttention``.
    Masks and ``prior`` are one mechanism, an additive log-prior ``log p0`` (:doc:`/theory`):
    they are summed into one float mask.

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
    """

    def __init__(self, embed_dim, num_heads=1, metric="mlp", *, dropout=0.0, bias=True,
                 batch_first=False, temperature=None, learn_temperature=False, hidden_size=None,
                 activation="tanh", prior=None, device=None, dtype=None):
        super().__init__()
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}.")
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})."
            )
        if temperature is not None and not temperature > 0:
            raise ValueError(f"temperature must be positive or None, got {temperature!r}.")
        if prior is not None and not isinstance(prior, AttentionPrior):
            raise TypeError(f"prior must be an AttentionPrior or None, got {type(prior)}.")
        if prior is not None and prior.num_heads not in (1, num_heads):
            raise ValueError(f"prior has {prior.num_heads} heads; the layer has {num_heads}.")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.metric = metric
        self.dropout = float(dropout)
        self.batch_first = batch_first
        # TransformerEncoderLayer's fused inference fast path reads nn.MultiheadAttention's
        # weights directly; this flag makes it fall back to calling this module.
        self._qkv_same_embed_dim = False
        n_proj = 3 if metric == "dot" else 2
        self.in_proj_weight = nn.Parameter(torch.empty(n_proj * embed_dim, embed_dim, **factory))
        self.in_proj_bias = (
            nn.Parameter(torch.empty(n_proj * embed_dim, **factory)) if bias else None
        )
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.phi = None
        if metric == "mlp":
            self.phi = ResidualBlock(embed_dim, hidden_size or embed_dim, activation, 0.0).to(
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

    def _reset_parameters(self):
        # As nn.MultiheadAttention: xavier-uniform input projection, zero biases.
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, metric={self.metric!r}, "
                f"batch_first={self.batch_first}")

    # ------------------------------------------------------------------ helpers

    def _project(self, x, index):
        E = self.embed_dim
        w = self.in_proj_weight[index * E:(index + 1) * E]
        b = None if self.in_proj_bias is None else self.in_proj_bias[index * E:(index + 1) * E]
        return F.linear(x, w, b)

    def _heads(self, x):
        n, length, _ = x.shape
        return x.view(n, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _score_inputs(self, query, key):
        """Per-head (q, k, scale) such that the scores are ``scale * q @ k.T`` (+ row constants)."""
        if self.metric == "dot":
            q, k = self._heads(self._project(query, 0)), self._heads(self._project(key, 1))
            return q, k, 1.0 / math.sqrt(self.head_dim)
        zq, zk = self._project(query, 0), self._project(key, 0)
        if self.phi is not None:
            zq, zk = self.phi(zq), self.phi(zk)
        inv_t = torch.exp(-self.log_temperature).to(zq.dtype)[:, None, None]
        q, k = augmented_coordinates(self._heads(zq), self._heads(zk), inv_t)
        return q, k, 1.0

    def _merged_mask(
        self, attn_mask, key_padding_mask, is_causal, n, length, src_len, dtype, device
    ):
        """One additive float mask broadcastable to (N, H, L, S), or None."""
        mask = None
        if attn_mask is None and is_causal:
            attn_mask = torch.ones(length, src_len, dtype=torch.bool, device=device).triu(1)
        if attn_mask is not None:
            attn_mask = _as_additive(attn_mask, dtype, "attn_mask")
            if attn_mask.dim() == 2:
                if attn_mask.shape != (length, src_len):
                    raise ValueError(
                        f"attn_mask must have shape {(length, src_len)}, "
                        f"got {tuple(attn_mask.shape)}."
                    )
                mask = attn_mask[None, None]
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (n * self.num_heads, length, src_len):
                    raise ValueError(
                        f"attn_mask must have shape {(n * self.num_heads, length, src_len)}, "
                        f"got {tuple(attn_mask.shape)}."
                    )
                mask = attn_mask.view(n, self.num_heads, length, src_len)
            else:
                raise ValueError(f"attn_mask must be 2-D or 3-D, got {attn_mask.dim()}-D.")
        if key_padding_mask is not None:
            key_padding_mask = _as_additive(key_padding_mask, dtype, "key_padding_mask")
            if key_padding_mask.shape != (n, src_len):
                raise ValueError(
                    f"key_padding_mask must have shape {(n, src_len)}, "
                    f"got {tuple(key_padding_mask.shape)}."
                )
            kpm = key_padding_mask[:, None, None, :]
            mask = kpm if mask is None else mask + kpm
        if self.prior is not None:
            table = _as_additive(self.prior(length, src_len, device=device), dtype, "prior")
            table = table if table.dim() == 4 else table[None]
            if table.shape[0] not in (1, n):
                raise ValueError(f"prior is for a batch of {table.shape[0]}, the inputs have {n}.")
            mask = table if mask is None else mask + table
        return mask

    # ------------------------------------------------------------------ forward

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : Tensor of shape (L, N, E), (N, L, E) if ``batch_first``, or (L, E) unbatched
        key, value : Tensor of shape (S, N, E), (N, S, E) if ``batch_first``, or (S, E)
        key_padding_mask : Tensor of shape (N, S) or (S,), bool or float, default=None
        need_weights : bool, default=True
        attn_mask : Tensor of shape (L, S) or (N * num_heads, L, S), bool or float, default=None
        average_attn_weights : bool, default=True
        is_causal : bool, default=False

        Returns
        -------
        attn_output : Tensor shaped like ``query``
        attn_weights : Tensor of shape (N, L, S), (N, num_heads, L, S) when not averaged, without
            the batch axis for unbatched inputs; None when ``need_weights=False``.
        """
        batched = query.dim() == 3
        if not batched:
            if query.dim() != 2:
                raise ValueError(f"query must be 2-D or 3-D, got {query.dim()}-D.")
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
        q, k, scale = self._score_inputs(query, key)
        v = self._heads(self._project(value, 2 if self.metric == "dot" else 1))
        mask = self._merged_mask(attn_mask, key_padding_mask, is_causal, n, length, src_len,
                                 q.dtype, q.device)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = torch.matmul(q, k.transpose(-2, -1)) * scale
            if mask is not None:
                scores = scores + mask
            weights = torch.softmax(scores, dim=-1)
            if dropout_p > 0:
                weights = F.dropout(weights, p=dropout_p)
            out = torch.matmul(weights, v)
        else:
            v_wide = v
            if q.shape[-1] != v.shape[-1]:
                # The fused kernels want one head size for queries, keys and values, a multiple
                # of 8 (as the engine's SDPA backend pads); the augmented coordinates have one
                # column more than the values. Zero columns change no score and no output kept.
                width = -(-q.shape[-1] // 8) * 8
                q, k, v_wide = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
            out = scaled_dot_product(
                q,
                k,
                v_wide,
                attn_mask=None if mask is None else mask.expand(n, self.num_heads, length, src_len),
                dropout_p=dropout_p,
                scale=scale,
            )[..., :self.head_dim]
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, self.embed_dim))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            out = out[0]
            weights = None if weights is None else weights[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


def _as_additive(mask, dtype, name):
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf")
        )
    if not mask.is_floating_point():
        raise TypeError(f"{name} must be bool or float, got {mask.dtype}.")
    return mask.to(dtype)
