"""A naive, dense float64 implementation of the attention in docs/theory.md, for checking the
engine."""

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
        s = -((Q[:, None, :] - K[None, :, :]) ** 2).sum(-1)  # differences: exact at distance 0
    mask = torch.zeros_like(s, dtype=torch.bool)
    if radius is not None:
        mask |= -s > radius**2
    if metric == "euclidean":
        s = -torch.sqrt(-s)
    if exclude is not None:
        rows = torch.arange(len(Q))[exclude >= 0]
        mask[rows, exclude[exclude >= 0]] = True
    prior = (
        torch.zeros_like(s)
        if log_prior is None
        else torch.as_tensor(log_prior).double()[None].expand_as(s)
    )
    mask |= torch.isneginf(prior)
    if k is not None and log_prior is None:
        kth = s.masked_fill(mask, -math.inf).topk(k, 1).values[:, -1:]
        mask |= s < kth
    elif k is not None:
        # A per-key weight exp(log_prior) is a multiplicity: keys by increasing distance until
        # their weights add up to k, the last contributing the remainder.
        order = torch.argsort(-s.masked_fill(mask, -math.inf), dim=1, stable=True)
        weight = torch.exp(prior).masked_fill(mask, 0.0).gather(1, order)
        share = torch.minimum(weight, (k - (weight.cumsum(1) - weight)).clamp(min=0))
        share = torch.zeros_like(share).scatter(1, order, share)
        mask |= share <= 4 * k * torch.finfo(share.dtype).eps
        prior = torch.log(share)
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


N_KEYS, N_QUERIES, DIM = 300, 70, 5


def attention_data():
    """Queries, keys, values and a log-prior (every seventh key's -inf), float64."""
    g = torch.Generator().manual_seed(0)
    K = torch.randn(N_KEYS, DIM, generator=g, dtype=torch.float64)
    Q = torch.randn(N_QUERIES, DIM, generator=g, dtype=torch.float64)
    V = torch.randn(N_KEYS, 3, generator=g, dtype=torch.float64)
    prior = torch.randn(N_KEYS, generator=g, dtype=torch.float64)
    prior[::7] = -math.inf
    return Q, K, V, prior
