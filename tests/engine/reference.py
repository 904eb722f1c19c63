"""A naive, dense float64 implementation of THEORY.md's attention, for checking the engine."""

import math

import torch


def reference_attention(
    Q, K, V, metric="sqeuclidean", T=1.0, k=None, radius=None, log_prior=None, exclude=None
):
    """Materialise every score; returns (out, weights) with weights of shape (n_q, n_k)."""
    Q, K, V = (torch.as_tensor(a).double() for a in (Q, K, V))
    if metric == "dot":
        s = Q @ K.T
    else:
        if callable(metric):
            Q, K = metric(Q), metric(K)
        s = -torch.cdist(Q, K) ** 2
    mask = torch.zeros_like(s, dtype=torch.bool)
    if radius is not None:
        mask |= -s > radius**2
    if exclude is not None:
        rows = torch.arange(len(Q))[exclude >= 0]
        mask[rows, exclude[exclude >= 0]] = True
    prior = (
        torch.zeros_like(s)
        if log_prior is None
        else torch.as_tensor(log_prior).double()[None].expand_as(s)
    )
    mask |= torch.isneginf(prior)
    if k is not None:
        kth = s.masked_fill(mask, -math.inf).topk(k, 1).values[:, -1:]
        mask |= s < kth
    sm = s.masked_fill(mask, -math.inf)
    if T == 0:
        z = torch.where(sm == sm.amax(1, keepdim=True), prior, -math.inf)
    elif T == math.inf:
        z = prior.clone()
    else:
        z = sm / T + prior
    z = z.masked_fill(mask, -math.inf)
    w = torch.nan_to_num(torch.softmax(z, 1))
    return w @ V, w
