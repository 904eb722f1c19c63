"""Attention priors: positional biases and masks as one object, an additive log-prior ``log p0``.

Attention weights are the maximiser of ``<a, s> - T KL(a || p0)`` over the simplex (the
documentation's theory page): ``a_ij = p0_ij exp(s_ij / T) / sum_l p0_il exp(s_il / T)``. The
prior enters the scores only as ``+ log p0``, so a mask (``log p0 = -inf`` on forbidden keys),
T5's relative position bias (``log p0_ij = b_h(bucket(j - i))``, learned) and ALiBi
(``-m_h |j - i|``, fixed) are the same kind of object, and several priors combine by adding
their logs.

Every prior here is an :class:`AttentionPrior`: ``log_prior(query_index, key_index)`` gives the
log-prior for integer position tensors, ``forward(query_length, key_length)`` the whole table
(``(num_heads, L, S)``; a key-padding mask, which depends on the batch, gives
``(batch, 1, L, S)``), and ``+`` composes priors. The table is a float ``attn_mask`` of
:class:`~skattention.nn.MetricAttention` and :class:`torch.nn.MultiheadAttention`
(:meth:`AttentionPrior.to_attn_mask` lays it out as they expect), ``MetricAttention(prior=...)``
adds it at every call, and :meth:`AttentionPrior.as_log_prior` hands one head to
:func:`skattention.attention` as its callable ``log_prior``.

Torch only: no scikit-learn imports here.
"""

import math
import numbers

import torch
from torch import nn


def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                             max_distance=128):
    """T5's bucket of a relative position ``key position - query position``.

    The bucketing of T5 (Raffel et al., 2020; ``T5Attention._relative_position_bucket`` of
    Hugging Face transformers), computed the same way, in float32, so that the buckets are
    identical. With ``bidirectional``, half of the buckets hold keys before the query
    (``relative_position <= 0``) and half keys after it; without, every key after the query
    shares bucket 0 with the query itself. Within a half of ``n`` buckets, distances below
    ``n // 2`` get a bucket each, and larger distances share logarithmically wider buckets up to
    ``max_distance``; every distance from ``max_distance`` on falls in the half's last bucket.

    Parameters
    ----------
    relative_position : Tensor or array-like of int
        Key position minus query position, any shape.
    bidirectional : bool, default=True
        Separate buckets for keys after the query (encoders); ``False`` for causal attention.
    num_buckets : int, default=32
        Number of buckets, at least 2 (at least 4 with ``bidirectional``).
    max_distance : int, default=128
        Distance from which all keys on one side share the last bucket; larger than the number
        of exact buckets (half a side's buckets).

    Returns
    -------
    bucket : Tensor of int64, shaped like ``relative_position``
        Values in ``[0, num_buckets)``.

    Examples
    --------
    >>> import torch
    >>> from skattention.nn import relative_position_bucket
    >>> relative_position_bucket(torch.tensor([-200, -20, -3, 0, 3, 20, 200])).tolist()
    [15, 10, 3, 0, 19, 26, 31]
    >>> relative_position_bucket(torch.tensor([-3, 0, 3]), bidirectional=False).tolist()
    [3, 0, 0]
    """
    position = torch.as_tensor(relative_position)
    if position.is_floating_point() or position.is_complex() or position.dtype == torch.bool:
        raise TypeError(f"relative_position must be integer, got {position.dtype}.")
    position = position.long()
    side = _check_buckets(num_buckets, max_distance, bidirectional)
    if bidirectional:
        offset = (position > 0).long() * side
        distance = position.abs()
    else:
        offset = 0
        distance = (-position).clamp(min=0)
    max_exact = side // 2
    # T5 computes the log buckets in float32 and truncates; the same arithmetic in the same order
    # gives the same buckets where a value lands within rounding of an integer.
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    log_bucket = max_exact + (log_ratio * (side - max_exact)).long()
    log_bucket = log_bucket.clamp(max=side - 1)
    return offset + torch.where(distance < max_exact, distance, log_bucket)


def _check_buckets(num_buckets, max_distance, bidirectional):
    """The number of buckets per side, after checking the bucketing's arguments."""
    if not isinstance(num_buckets, numbers.Integral) or isinstance(num_buckets, bool):
        raise TypeError(f"num_buckets must be an int, got {num_buckets!r}.")
    side = num_buckets // 2 if bidirectional else int(num_buckets)
    if side < 2:
        raise ValueError(
            f"num_buckets must be at least {4 if bidirectional else 2}"
            f"{' with bidirectional=True' if bidirectional else ''}, got {num_buckets}."
        )
    if not isinstance(max_distance, numbers.Real) or not max_distance > side // 2:
        raise ValueError(
            f"max_distance must be larger than the {side // 2} exact buckets of a side, "
            f"got {max_distance!r}."
        )
    return side


def alibi_slopes(num_heads):
    """ALiBi's per-head slopes (Press, Smith and Lewis, 2022).

    For a power of two ``n``, the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``. For
    other ``n``, the slopes of the largest power of two ``m < n``, then every other slope of
    ``2 m`` heads (``2^(-4/m), 2^(-12/m), ...``) for the ``n - m`` remaining heads, the rule of
    the paper's code.

    Parameters
    ----------
    num_heads : int

    Returns
    -------
    slopes : list of float, length ``num_heads``

    Examples
    --------
    >>> from skattention.nn import alibi_slopes
    >>> alibi_slopes(4)
    [0.25, 0.0625, 0.015625, 0.00390625]
    >>> alibi_slopes(6)
    [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    """
    num_heads = _check_num_heads(num_heads)
    power = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * (h + 1) / power) for h in range(power)]
    if power < num_heads:
        slopes += alibi_slopes(2 * power)[0::2][:num_heads - power]
    return slopes


def _check_num_heads(num_heads):
    if not isinstance(num_heads, numbers.Integral) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}.")
    return int(num_heads)


def _check_length(length, name):
    if not isinstance(length, numbers.Integral) or isinstance(length, bool) or length < 0:
        raise ValueError(f"{name} must be a non-negative int, got {length!r}.")
    return int(length)


class AttentionPrior(nn.Module):
    """Base class of the attention priors: an additive log-prior ``log p0`` on the scores.

    A subclass sets ``num_heads`` (1 for a prior shared by every head) and implements
    :meth:`log_prior`; the base class gives the table (:meth:`forward`), the layouts of
    :class:`torch.nn.MultiheadAttention` (:meth:`to_attn_mask`) and of
    :func:`skattention.attention` (:meth:`as_log_prior`), and composition by ``+``
    (:class:`PriorSum`). ``-inf`` entries are masks: they stay ``-inf`` under addition.

    Attributes
    ----------
    num_heads : int
        Heads the prior distinguishes; 1 broadcasts over every head.
    """

    num_heads = 1

    def log_prior(self, query_index, key_index):
        """The log-prior for integer query and key positions.

        Parameters
        ----------
        query_index, key_index : Tensor of int64
            Positions, broadcastable against each other (e.g. a column and a row).

        Returns
        -------
        log_prior : Tensor
            Shape ``(num_heads, *broadcast_shape)``, or ``(batch, 1, *broadcast_shape)`` for a
            prior that depends on the batch (:class:`KeyPaddingMask`).
        """
        raise NotImplementedError

    def forward(self, query_length, key_length, *, device=None):
        """The log-prior table of ``query_length`` queries and ``key_length`` keys.

        Parameters
        ----------
        query_length, key_length : int
        device : torch.device, default=None
            ``None``: the device of the prior's parameters and buffers (the CPU without any).

        Returns
        -------
        log_prior : Tensor of shape (num_heads, query_length, key_length)
            Float, ``-inf`` where a key is masked; ``(batch, 1, query_length, key_length)``
            for a :class:`KeyPaddingMask`. It broadcasts against scores of shape
            ``(batch, heads, query_length, key_length)``.
        """
        query_length = _check_length(query_length, "query_length")
        key_length = _check_length(key_length, "key_length")
        if device is None:
            device = next(
                (t.device for t in (*self.parameters(), *self.buffers())), torch.device("cpu")
            )
        query_index = torch.arange(query_length, device=device)[:, None]
        key_index = torch.arange(key_length, device=device)[None, :]
        return self.log_prior(query_index, key_index)

    def to_attn_mask(self, query_length, key_length, *, batch_size, num_heads=None, device=None):
        """The table as the 3-D float ``attn_mask`` of :class:`torch.nn.MultiheadAttention`.

        Parameters
        ----------
        query_length, key_length : int
        batch_size : int
        num_heads : int, default=None
            Heads of the layer; ``None``: the prior's own ``num_heads``.
        device : torch.device, default=None

        Returns
        -------
        attn_mask : Tensor of shape (batch_size * num_heads, query_length, key_length)
            Row ``n * num_heads + h`` is head ``h`` of batch element ``n``, as the layers expect.
        """
        num_heads = self.num_heads if num_heads is None else _check_num_heads(num_heads)
        if self.num_heads not in (1, num_heads):
            raise ValueError(f"a prior of {self.num_heads} heads cannot mask {num_heads} heads.")
        table = self(query_length, key_length, device=device)
        table = table.expand(batch_size, num_heads, query_length, key_length)
        return table.reshape(batch_size * num_heads, query_length, key_length)

    def as_log_prior(self, head=0, batch=0):
        """One head's prior as the callable ``log_prior`` of :func:`skattention.attention`.

        The engine evaluates it block by block on query and key positions (the rows of the
        queries and keys), so the ``(n_queries, n_keys)`` table is never formed.

        Parameters
        ----------
        head : int, default=0
            Head to take (ignored by a prior shared by every head).
        batch : int, default=0
            Batch element to take (only a :class:`KeyPaddingMask` depends on it).

        Returns
        -------
        log_prior : callable ``(query_index, key_index) -> Tensor``
        """

        def log_prior(query_index, key_index):
            bias = self.log_prior(query_index, key_index)
            if bias.dim() > query_index.dim() + 1:  # (batch, heads, ...)
                bias = bias[batch if bias.shape[0] > 1 else 0]
            return bias[head if bias.shape[0] > 1 else 0]

        return log_prior

    def __add__(self, other):
        if not isinstance(other, AttentionPrior):
            return NotImplemented
        return PriorSum(self, other)


class PriorSum(AttentionPrior):
    """The sum of attention priors' logs: the product of the priors, renormalised by softmax.

    ``a + b`` of two :class:`AttentionPrior` returns one. Priors of 1 head broadcast over the
    heads of the others; priors of several heads must agree on their number.

    Parameters
    ----------
    *priors : AttentionPrior

    Examples
    --------
    >>> from skattention.nn import ALiBi, CausalMask
    >>> prior = ALiBi(2) + CausalMask()
    >>> prior(2, 3)
    tensor([[[ 0.0000,    -inf,    -inf],
             [-0.0625,  0.0000,    -inf]],
    <BLANKLINE>
            [[ 0.0000,    -inf,    -inf],
             [-0.0039,  0.0000,    -inf]]])
    """

    def __init__(self, *priors):
        super().__init__()
        flat = []
        for prior in priors:
            if not isinstance(prior, AttentionPrior):
                raise TypeError(f"PriorSum takes AttentionPrior modules, got {type(prior)}.")
            flat.extend(prior.priors if isinstance(prior, PriorSum) else [prior])
        heads = {p.num_heads for p in flat} - {1}
        if len(heads) > 1:
            raise ValueError(f"priors of different numbers of heads cannot be added: {heads}.")
        self.priors = nn.ModuleList(flat)
        self.num_heads = heads.pop() if heads else 1

    def log_prior(self, query_index, key_index):
        terms = [p.log_prior(query_index, key_index) for p in self.priors]
        rank = max(t.dim() for t in terms)
        total = terms[0].reshape((1,) * (rank - terms[0].dim()) + terms[0].shape)
        for term in terms[1:]:
            total = total + term
        return total


class RelativePositionBias(AttentionPrior):
    """T5's learned relative position bias: ``log p0_ij = weight[bucket(j - i), h]``.

    One learned scalar per head and bucket of the relative position (key position minus query
    position, bucketed by :func:`relative_position_bucket`). It starts at zero, the uniform
    prior: training moves it.

    Parameters
    ----------
    num_heads : int
    num_buckets : int, default=32
    max_distance : int, default=128
    bidirectional : bool, default=True
        ``False`` for causal attention (keys after the query share the query's bucket).
    device, dtype : optional
        Factory arguments of ``weight``.

    Attributes
    ----------
    weight : Parameter of shape (num_buckets, num_heads)
        The bias of each bucket and head (T5's ``relative_attention_bias.weight``).

    Examples
    --------
    >>> import torch
    >>> from skattention.nn import MetricAttention, RelativePositionBias
    >>> bias = RelativePositionBias(num_heads=2, num_buckets=8, max_distance=16)
    >>> with torch.no_grad():
    ...     bias.weight[:, 0] = torch.arange(8.0)  # head 0's bias is the bucket number
    ...     bias(3, 5)[0]
    tensor([[0., 5., 6., 6., 6.],
            [1., 0., 5., 6., 6.],
            [2., 1., 0., 5., 6.]])
    >>> layer = MetricAttention(8, num_heads=2, batch_first=True, prior=bias)
    >>> x = torch.randn(5, 4, 8)
    >>> out, _ = layer(x, x, x)
    >>> out.sum().backward()
    >>> tuple(bias.weight.grad.shape)
    (8, 2)
    """

    def __init__(self, num_heads, num_buckets=32, max_distance=128, bidirectional=True, *,
                 device=None, dtype=None):
        super().__init__()
        _check_buckets(num_buckets, max_distance, bidirectional)
        self.num_heads = _check_num_heads(num_heads)
        self.num_buckets = int(num_buckets)
        self.max_distance = max_distance
        self.bidirectional = bool(bidirectional)
        self.weight = nn.Parameter(
            torch.zeros(self.num_buckets, self.num_heads, device=device, dtype=dtype)
        )

    def reset_parameters(self):
        nn.init.zeros_(self.weight)

    def extra_repr(self):
        return (f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")

    def log_prior(self, query_index, key_index):
        buckets = relative_position_bucket(
            key_index - query_index, self.bidirectional, self.num_buckets, self.max_distance
        )
        return self.weight[buckets].movedim(-1, 0)


class ALiBi(AttentionPrior):
    """ALiBi's fixed linear distance penalty: ``log p0_ij = -m_h |j - i|``.

    Press, Smith and Lewis (2022), "Train short, test long": head ``h`` penalises a key by its
    distance to the query times a fixed slope ``m_h`` (:func:`alibi_slopes`). The paper's causal
    form, ``m_h (j - i)`` for keys ``j <= i``, is ``ALiBi(num_heads) + CausalMask()``; alone, the
    penalty is symmetric (keys before and after the query alike).

    Parameters
    ----------
    num_heads : int
    device, dtype : optional
        Factory arguments of the ``slopes`` buffer.

    Attributes
    ----------
    slopes : Tensor of shape (num_heads,)
        A buffer (not learned).

    Examples
    --------
    >>> from skattention.nn import ALiBi
    >>> alibi = ALiBi(4)
    >>> alibi.slopes
    tensor([0.2500, 0.0625, 0.0156, 0.0039])
    >>> alibi(1, 4)[:2]
    tensor([[[ 0.0000, -0.2500, -0.5000, -0.7500]],
    <BLANKLINE>
            [[ 0.0000, -0.0625, -0.1250, -0.1875]]])
    """

    def __init__(self, num_heads, *, device=None, dtype=None):
        super().__init__()
        self.num_heads = _check_num_heads(num_heads)
        self.register_buffer(
            "slopes", torch.tensor(alibi_slopes(self.num_heads), device=device, dtype=dtype)
        )

    def extra_repr(self):
        return f"num_heads={self.num_heads}"

    def log_prior(self, query_index, key_index):
        # negated as integers, so that distance 0 gives +0.0, not -0.0
        minus_distance = (-(key_index - query_index).abs()).to(self.slopes.dtype)
        return self.slopes.reshape(-1, *([1] * minus_distance.dim())) * minus_distance


class CausalMask(AttentionPrior):
    """The causal mask as a log-prior: ``0`` for keys ``j <= i``, ``-inf`` for ``j > i``.

    The mask of ``is_causal=True`` in :class:`torch.nn.MultiheadAttention` (query ``i`` sees the
    keys up to position ``i``), shared by every head.

    Parameters
    ----------
    dtype : torch.dtype, default=torch.float32

    Examples
    --------
    >>> from skattention.nn import CausalMask
    >>> CausalMask()(2, 3)
    tensor([[[0., -inf, -inf],
             [0., 0., -inf]]])
    """

    def __init__(self, *, dtype=torch.float32):
        super().__init__()
        self.dtype = dtype

    def log_prior(self, query_index, key_index):
        future = key_index > query_index
        zero = torch.zeros((), dtype=self.dtype, device=future.device)
        return torch.where(future, -math.inf, zero)[None]


class KeyPaddingMask(AttentionPrior):
    """A key-padding mask as a log-prior: ``-inf`` for the padded keys of each batch element.

    Parameters
    ----------
    key_padding_mask : Tensor of bool, shape (batch, key_length)
        True for keys to ignore, as ``key_padding_mask`` of :class:`torch.nn.MultiheadAttention`.
    dtype : torch.dtype, default=torch.float32

    Examples
    --------
    >>> import torch
    >>> from skattention.nn import CausalMask, KeyPaddingMask
    >>> padding = KeyPaddingMask(torch.tensor([[False, False, True]]))
    >>> (CausalMask() + padding)(3, 3)[0, 0]
    tensor([[0., -inf, -inf],
            [0., 0., -inf],
            [0., 0., -inf]])
    """

    def __init__(self, key_padding_mask, *, dtype=torch.float32):
        super().__init__()
        key_padding_mask = torch.as_tensor(key_padding_mask)
        if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
            raise ValueError(
                "key_padding_mask must be a 2-D bool tensor (batch, key_length), got "
                f"{key_padding_mask.dim()}-D {key_padding_mask.dtype}."
            )
        self.register_buffer("key_padding_mask", key_padding_mask)
        self.dtype = dtype

    def log_prior(self, query_index, key_index):
        padded = self.key_padding_mask
        if key_index.numel() and int(key_index.max()) >= padded.shape[1]:
            raise ValueError(
                f"key position {int(key_index.max())} is beyond the mask's {padded.shape[1]} keys."
            )
        zero = torch.zeros((), dtype=self.dtype, device=padded.device)
        bias = torch.where(padded, -math.inf, zero)  # (batch, key_length)
        shape = torch.broadcast_shapes(query_index.shape, key_index.shape)
        return bias[:, key_index].expand(-1, *shape)[:, None]
