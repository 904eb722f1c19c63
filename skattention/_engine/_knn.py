"""The top-k backend: blockwise selection of each query's k best keys, then a softmax over them.

Selection streams over key blocks with a top-k merge (no autograd); the softmax over the k
selected keys recomputes their exact scores with autograd when differentiating. The selection
alone is :func:`skattention.kneighbors`.
"""

import math

import torch

from ._blocks import (
    NEG_INF,
    TopK,
    backend_result,
    call_prior_fn,
    cat_or_empty,
    empty_rows,
    query_index,
    raw_scores,
    scaled,
    score_pair_bytes,
)
from ._budget import plan_blocks
from ._progress import track


def topk_blocks(spec, k, query_bytes, what):
    """Yield ``(qs, qe, q, q_index, top)`` per query block, ``top`` holding the k best keys.

    Selection runs without autograd; callers recompute what they differentiate.
    """
    scorer, Q = spec.scorer, spec.queries
    n_q, n_k = Q.shape[0], scorer.n_keys
    item = Q.element_size()
    bq, bk = plan_blocks(
        n_q, n_k, pair_bytes=score_pair_bytes(spec),
        row_bytes=query_bytes + 3 * k * (item + 8) + 2 * item * Q.shape[1],
        budget=spec.budget, device=Q.device, what=what, hint="use a smaller n_neighbors",
    )
    for qs in track(range(0, n_q, bq), spec.progress, desc=what, unit="block"):
        qe = min(n_q, qs + bq)
        q = scorer.prepare_queries(Q[qs:qe])
        q_index = query_index(spec, qs, qe, q.device)
        with torch.no_grad():
            qd = q.detach()
            if spec.radius is not None:
                spec.radius.start_block(scorer.query_offset(qd), qs, qe)
            top = TopK(qe - qs, k, qd)
            for ks in range(0, n_k, bk):
                ke = min(n_k, ks + bk)
                s, _ = raw_scores(spec, qd, qs, qe, ks, ke, q_index, inplace=True)
                top.update(s, ks)
        yield qs, qe, q, q_index, top


def knn_attention(spec):
    """Attention restricted to each query's ``spec.n_neighbors`` best keys (the k-NN prior)."""
    scorer, Q, V, T, k = spec.scorer, spec.queries, spec.values, spec.temperature, spec.n_neighbors
    dv, n_weights = V.shape[1], spec.n_weights
    gather_bytes = k * Q.element_size() * (dv + (scorer.dim if spec.grad else 0) + 6)
    blocks = topk_blocks(spec, k, gather_bytes, f"k-NN attention with n_neighbors={k}")
    outs, weights, indices = [], [], []
    for qs, _, q, q_index, top in blocks:
        valid = top.r > NEG_INF
        idx = torch.where(valid, top.i, -1)
        safe_idx = idx.clamp(min=0)
        # Exact scores: recomputed with the graph when differentiating, else from the selection.
        s = scorer.exact(q, idx) if spec.grad else top.r - scorer.query_offset(q)[:, None]
        s = torch.where(valid, s, NEG_INF)
        prior = torch.zeros_like(s) if spec.prior_vec is None else spec.prior_vec[safe_idx]
        if spec.prior_fn is not None:
            prior = prior + call_prior_fn(spec.prior_fn, q_index, safe_idx, s)
        if T == 0.0:
            tie = valid & (s == s.amax(1, keepdim=True))
            z = torch.where(tie, prior, NEG_INF)
        elif T == math.inf:
            z = torch.where(valid, prior, NEG_INF)
        else:
            z = torch.where(valid, scaled(s, T) + prior, NEG_INF)
        m = z.amax(1, keepdim=True)
        p = torch.exp(z - torch.where(torch.isfinite(m), m, 0.0))
        total = p.sum(1)
        empty = empty_rows(total, qs, spec.on_empty, spec.radius)
        w = p / torch.where(total > 0, total, 1.0)[:, None]
        out = torch.bmm(w[:, None, :], V[safe_idx]).squeeze(1)
        outs.append(torch.where(empty[:, None], 0.0, out))
        if n_weights is not None:
            weights.append(w[:, :n_weights])
            indices.append(idx[:, :n_weights])
    return backend_result(outs, weights, indices, n_weights, V)


def nearest_keys(spec):
    """``(distances, indices)`` of each query's ``spec.n_neighbors`` nearest keys, ascending;
    ``inf`` and ``-1`` where fewer keys are unmasked."""
    k = spec.n_neighbors
    dists, indices = [], []
    with torch.no_grad():
        for _, _, q, _, top in topk_blocks(spec, k, 0, "kneighbors"):
            valid = top.r > NEG_INF
            f = spec.scorer.query_offset(q)[:, None] - top.r
            if spec.scorer.is_distance:
                f = f.clamp(min=0)
            dists.append(torch.where(valid, f, math.inf))
            indices.append(torch.where(valid, top.i, -1))
    return (
        cat_or_empty(dists, (0, k), spec.queries),
        cat_or_empty(indices, (0, k), spec.queries, torch.long),
    )
