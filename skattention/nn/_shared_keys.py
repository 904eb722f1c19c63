"""Queries that attend to keys shared by all of them and to their own key only: the
inductive rule of an IPN's context (``IPN.prepare_context``), on a :class:`MetricAttention`
layer's projections.

The shared keys are prepared once, per head in the form the scores take (the squared metrics'
augmented coordinates about the shared keys' mean); each call then scores its queries against
them and against each query's own key, and one softmax runs over both, without an L x (S + L)
mask. A layer with a prior or appended keys attends through that mask instead (its prior and
its appended keys follow the shared and own keys' positions).
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._engine import centred_keys, centred_queries, key_centre


class SharedKeys(NamedTuple):
    """Keys and values shared by many queries (:func:`shared_keys`): per head, ``k`` (N, H,
    S, .) in the scores' form about ``centre`` (None: ``"dot"``) and ``v`` (N, H, S,
    head_dim); or, ``masked``, the projected ``k`` and ``v`` (N, S, E)."""

    k: torch.Tensor
    v: torch.Tensor
    centre: torch.Tensor | None
    masked: bool


def shared_keys(layer, key, value):
    """Keys and values (batch first, (N, S, .)) of the :class:`MetricAttention` ``layer``,
    prepared once for many calls of :func:`attend_shared_and_own`."""
    zk, v = layer._key_features(key, value)
    if layer.prior is not None or layer._extra_keys():
        return SharedKeys(zk, v, None, masked=True)
    k = layer._heads(zk)
    if layer.metric == "dot":
        return SharedKeys(k, layer._heads(v), None, masked=False)
    # (no shared key: any centre, the distances do not depend on it)
    centre = key_centre(k) if k.shape[-2] else k.new_zeros((*k.shape[:-2], 1, k.shape[-1]))
    return SharedKeys(centred_keys(k, centre), layer._heads(v), centre, masked=False)


def attend_shared_and_own(layer, query, shared, own_key, own_value):
    """Outputs (N, L, E) of the ``layer``'s queries ``query`` (N, L, E) that each attend to the
    keys ``shared`` (:func:`shared_keys`) and to their own key (row ``i`` of ``own_key`` and
    ``own_value``) only, never to the other queries'."""
    n, length, _ = query.shape
    zq = layer._query_features(query)
    zk, v = layer._key_features(own_key, own_value)
    if shared.masked:
        n_shared = shared.k.shape[1]
        mask = torch.ones(length, n_shared + length, dtype=torch.bool, device=query.device)
        mask[:, :n_shared] = False
        mask[:, n_shared:].fill_diagonal_(False)
        return layer._attend_features(zq, torch.cat([shared.k, zk], 1),
                                      torch.cat([shared.v, v], 1), attn_mask=mask,
                                      need_weights=False)[0]
    q, k = layer._heads(zq), layer._heads(zk)
    if shared.centre is None:
        q = q / math.sqrt(layer.head_dim)
    else:
        inv_t = torch.exp(-layer.log_temperature).to(zq.dtype)[:, None, None]
        q, k = centred_queries(q, shared.centre, inv_t), centred_keys(k, shared.centre)
    scores = torch.matmul(q, shared.k.transpose(-2, -1))
    own = (q * k).sum(-1, keepdim=True)
    top = torch.maximum(scores.amax(-1, keepdim=True), own) if scores.shape[-1] else own
    # (outside autograd the scores become their weights in place)
    weights = torch.exp(scores - top) if scores.requires_grad else scores.sub_(top).exp_()
    own = torch.exp(own - top)
    total = weights.sum(-1, keepdim=True) + own
    v = layer._heads(v)
    if layer.training and layer.dropout > 0:
        weights = F.dropout(weights / total, p=layer.dropout)
        out = torch.matmul(weights, shared.v) + F.dropout(own / total, p=layer.dropout) * v
    else:  # the weighted sums divided once, not every weight
        out = (torch.matmul(weights, shared.v) + own * v) / total
    return layer.out_proj(out.transpose(1, 2).reshape(n, length, layer.embed_dim))
