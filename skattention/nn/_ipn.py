"""IPN: the seed paper's propagation network, attention across the samples of a batch.

``logits = W_out h_L + b_out`` with ``h_0 = W_in x + b_in`` and L propagation blocks
``h_{l+1} = h_l + MetricAttention_l(h_l, h_l, h_l)``: every sample attends to the other samples
of the set (the batch), so the network is a learned kernel smoother over samples
(the documentation's theory page). Torch only.
"""

from typing import NamedTuple

import torch
from torch import nn

from .._engine import budget_bytes, cpu_block_rows, plan_rows
from ._attention import MetricAttention
from ._shared_keys import attend_shared_and_own, shared_keys


class IPN(nn.Module):
    """Linear -> L attention blocks across the samples of a set -> linear -> logits.

    Parameters
    ----------
    in_features : int
    n_outputs : int
        Number of logits (classes).
    width : int, default=10
        Width of the hidden representation (the paper: 10 on two moons, 100 on MNIST).
    n_blocks : int, default=2
        Number of propagation blocks L.
    metric : {"mlp", "linear", "dot"}, default="mlp"
        Attention of every block (see :class:`MetricAttention`): metric-attention, L2
        self-attention or self-attention.
    num_heads : int, default=1
    residual : bool, default=True
        ``h + attention(h)`` (True) or ``attention(h)`` (False, pure propagation ``H <- S H``).
    **attention_kwargs
        Passed to every :class:`MetricAttention` (``temperature``, ``learn_temperature``,
        ``hidden_size``, ``dropout``...).

    Notes
    -----
    ``forward(x)`` lets the n samples of ``x`` attend to each other (themselves included).
    ``forward(x, context=c)`` is the inductive rule: the context samples propagate among
    themselves only, and each sample of ``x`` attends to the context plus itself, never to the
    other samples of ``x``; so its logits do not depend on which other samples are in ``x``.

    Examples
    --------
    >>> import torch
    >>> from skattention.nn import IPN
    >>> _ = torch.manual_seed(0)
    >>> net = IPN(2, 3, width=8, metric="mlp")
    >>> train, test = torch.randn(50, 2), torch.randn(4, 2)
    >>> tuple(net(train).shape)
    (50, 3)
    >>> alone = net(test[:1], context=train)
    >>> together = net(test, context=train)[:1]
    >>> bool(torch.allclose(alone, together, atol=1e-6))
    True
    """

    def __init__(self, in_features, n_outputs, width=10, n_blocks=2, metric="mlp", num_heads=1,
                 residual=True, **attention_kwargs):
        super().__init__()
        self.residual = residual
        self.input = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(
            MetricAttention(width, num_heads, metric, batch_first=True, **attention_kwargs)
            for _ in range(n_blocks)
        )
        self.output = nn.Linear(width, n_outputs)

    def _step(self, block, h_query, h_keys, attn_mask=None):
        out = block(
            h_query[None], h_keys[None], h_keys[None], attn_mask=attn_mask, need_weights=False
        )[0][0]
        return h_query + out if self.residual else out

    def forward(self, x, context=None, chunk_size=None):
        """Logits of the samples of ``x`` (n, in_features).

        Parameters
        ----------
        x : Tensor of shape (n, in_features)
        context : Tensor of shape (m, in_features), PreparedContext or None, default=None
            ``None``: the samples of ``x`` attend to each other. Otherwise each sample of ``x``
            attends to the context and to itself only. A context used for many calls is
            propagated once by :meth:`prepare_context` (its result passed here).
        chunk_size : int, default=None
            With a context, queries per attention call (bounds memory; the same result up to
            rounding: the products' blocking over a chunk's rows can round a query's logits
            otherwise in the last bits, about 1e-16 in float64). ``None``: as many as fit
            ``working_memory`` (``skattention.config_context``), from 64 to 1024 (on the CPU,
            as few as keep a chunk's scores cache-sized).

        Returns
        -------
        logits : Tensor of shape (n, n_outputs)
        """
        _check_2d("x", x)
        h = self.input(x)
        if context is None:
            for block in self.blocks:
                h = self._step(block, h, h)
            return self.output(h)
        if not isinstance(context, PreparedContext):
            context = self.prepare_context(context)
        m = context.n_samples
        if chunk_size is None:
            chunk_size = _chunk_rows(
                m,
                h.shape[1],
                self.blocks[0].num_heads if len(self.blocks) else 1,
                h.element_size(),
                h.device,
            )
        outs = []
        for start in range(0, x.shape[0], chunk_size):
            hx = h[start:start + chunk_size][None]
            for block, shared in zip(self.blocks, context.keys, strict=True):
                out = attend_shared_and_own(block, hx, shared, hx, hx)
                hx = hx + out if self.residual else out
            outs.append(self.output(hx[0]))
        return torch.cat(outs) if outs else self.output(h)

    def prepare_context(self, context):
        """The context samples propagated through the blocks once, for many ``forward`` calls.

        ``forward(x, context=c)`` propagates the m context samples among themselves through
        every block (m x m attention per block) before the queries attend to them; a
        :class:`PreparedContext` keeps what the queries need of that (each block's projected
        keys and values of the context, per head in the form the scores take), so that calls
        with it cost the queries' attention over m keys only. It holds about ``2 * n_blocks *
        m * width`` numbers, and is valid while the network's parameters do not change.

        Parameters
        ----------
        context : Tensor of shape (m, in_features)

        Returns
        -------
        PreparedContext
            To pass as ``context`` to :meth:`forward`.

        Examples
        --------
        >>> import torch
        >>> from skattention.nn import IPN
        >>> _ = torch.manual_seed(0)
        >>> net = IPN(2, 3, width=8).double()
        >>> train, test = torch.randn(50, 2).double(), torch.randn(4, 2).double()
        >>> prepared = net.prepare_context(train)
        >>> prepared.n_samples
        50
        >>> bool(torch.allclose(net(test, context=prepared), net(test, context=train)))
        True
        """
        _check_2d("context", context)
        hc = self.input(context)
        keys = []
        for block in self.blocks:
            keys.append(shared_keys(block, hc[None], hc[None]))
            hc = self._step(block, hc, hc)
        return PreparedContext(context.shape[0], tuple(keys))


class PreparedContext(NamedTuple):
    """An :class:`IPN`'s context propagated once (:meth:`IPN.prepare_context`).

    Attributes
    ----------
    n_samples : int
        The number m of context samples.
    keys : tuple
        Per block, the context's keys and values as that block's queries score them (per
        head; for the squared-distance metrics their augmented coordinates about the context's
        mean key, which the queries are centred on too).
    """

    n_samples: int
    keys: tuple


def _check_2d(name, t):
    if t.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, in_features) (IPN attends across the samples "
                         f"of one set); got {t.ndim}-D.")


# Queries per chunk of a call over a context at least (within the budget), on the CPU
_MIN_CHUNK = 64


def _chunk_rows(m, width, num_heads, itemsize, device):
    """Queries per chunk within ``working_memory``, at most 1024 (on the CPU, as many as keep
    a chunk's scores cache-sized, and at least :data:`_MIN_CHUNK`): each query row of a chunk
    holds its scores and weights over the m + 1 keys it sees, per head (or, for a layer with
    a prior or appended keys, a boolean and an additive mask and its per-head copies); each
    chunk of those layers also copies and projects the context (about 4 m x width values)."""
    max_rows = 1024
    if device.type == "cpu":  # (at least _MIN_CHUNK rows: a chunk's fixed work stays small)
        max_rows = min(max_rows, max(_MIN_CHUNK, cpu_block_rows((m + 1) * num_heads)))
    return plan_rows(
        None, row_bytes=(m + 1) * (1 + (1 + 2 * num_heads) * itemsize) + 8 * width * itemsize,
        fixed_bytes=4 * m * width * itemsize, budget=budget_bytes(), max_rows=max_rows,
        what=f"IPN with a context of {m} samples",
        hint="use a smaller context (AttentionNetworkClassifier: fewer training samples)",
        per="per query",
    )
