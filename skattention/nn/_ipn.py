"""IPN: the seed paper's propagation network, attention across the samples of a batch.

``logits = W_out h_L + b_out`` with ``h_0 = W_in x + b_in`` and L propagation blocks
``h_{l+1} = h_l + MetricAttention_l(h_l, h_l, h_l)``: every sample attends to the other samples
of the set (the batch), so the network is a learned kernel smoother over samples
(the documentation's theory page). Torch only.
"""

import torch
from torch import nn

from .._engine import budget_bytes, plan_rows
from ._attention import MetricAttention


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
        context : Tensor of shape (m, in_features), default=None
            ``None``: the samples of ``x`` attend to each other. Otherwise each sample of ``x``
            attends to the context and to itself only.
        chunk_size : int, default=None
            With a context, queries per attention call (bounds memory; the same result up to
            rounding: a call's keys are the context and the chunk's queries, so the last bits of
            a query's logits can depend on the chunk, about 1e-15 in float64).
            ``None``: as many as fit ``working_memory`` (``skattention.config_context``), at
            most 1024.

        Returns
        -------
        logits : Tensor of shape (n, n_outputs)
        """
        for name, t in (("x", x), ("context", context)):
            if t is not None and t.ndim != 2:
                raise ValueError(f"{name} must be 2-D (n, in_features) (IPN attends across the "
                                 f"samples of one set); got {t.ndim}-D.")
        h = self.input(x)
        if context is None:
            for block in self.blocks:
                h = self._step(block, h, h)
            return self.output(h)
        hc = self.input(context)
        contexts = []
        for block in self.blocks:
            contexts.append(hc)
            hc = self._step(block, hc, hc)
        outs = []
        m = context.shape[0]
        if chunk_size is None:
            chunk_size = _chunk_rows(
                m,
                hc.shape[1],
                self.blocks[0].num_heads if len(self.blocks) else 1,
                hc.element_size(),
            )
        for start in range(0, x.shape[0], chunk_size):
            hx = h[start:start + chunk_size]
            c = hx.shape[0]
            # query i may see the m context samples and key m + i (itself) only
            mask = torch.ones(c, m + c, dtype=torch.bool, device=x.device)
            mask[:, :m] = False
            mask[:, m:].fill_diagonal_(False)
            for block, hc_l in zip(self.blocks, contexts):
                hx = self._step(block, hx, torch.cat([hc_l, hx]), attn_mask=mask)
            outs.append(self.output(hx))
        return torch.cat(outs) if outs else self.output(h)


def _chunk_rows(m, width, num_heads, itemsize):
    """Queries per chunk within ``working_memory``: each query row of a chunk holds a boolean and
    an additive mask over the m + 1 keys it may see (and its per-head copies); each chunk also
    copies and projects the context (about 4 m x width values)."""
    return plan_rows(
        None, row_bytes=(m + 1) * (1 + (1 + num_heads) * itemsize) + 8 * width * itemsize,
        fixed_bytes=4 * m * width * itemsize, budget=budget_bytes(), max_rows=1024,
        what=f"IPN with a context of {m} samples", hint="use a smaller context", per="per query",
    )
