"""The streaming backend: query blocks x key blocks with an online softmax (docs/theory.md,
"Computing it exactly").

A running max, sum and weighted sum per query are rescaled when the max grows, so the scratch
memory is one score block whatever the number of keys. It handles every prior and the uniform
limit (``T = inf``; ``T = 0`` is a selection, the k-NN backend's) and, with ``n_weights``, tracks
the largest weights of each query with a blockwise top-k.
"""

import math

import torch

from ._blocks import (
    NEG_INF,
    OnlineSoftmax,
    TopK,
    _rows_times,
    backend_result,
    block_prior,
    empty_rows,
    flushed_softmax,
    mask_self,
    query_index,
    raw_scores,
    scaled,
    score_pair_bytes,
    self_mask,
    single_block_attention,
)
from ._budget import CPU_WHOLE_ROW_KEYS, plan_blocks
from ._parallel import _mkl_threads, block_spec, map_blocks, parallel_plan
from ._progress import track
from ._scores import ROW_MULTIPLE


def stream_attention(spec, state_only=False):
    """``(out,)`` or, with ``spec.n_weights``, ``(out, weights, indices)``; with
    ``state_only``, the online softmax state ``(m, l, o)`` of every query instead (running max,
    sum of ``exp(z - m)`` and weighted values: what shards of the keys merge, ``_shards.py``)."""
    scorer, Q, V, T, n_weights = (
        spec.scorer,
        spec.queries,
        spec.values,
        spec.temperature,
        spec.n_weights,
    )
    n_q, n_k, dv = Q.shape[0], scorer.n_keys, V.shape[1]
    V_mm = spec.values_mm  # padded once for the products of every block
    item = Q.element_size()
    inplace = not spec.grad
    uniform = T == math.inf
    # Raw scores are needed for the uniform limit and for masks defined on distances; otherwise
    # one addmm gives the logits (scale and per-key prior folded in) and self-exclusion is masked
    # on them directly. The block is fresh, so masking it in place is safe under autograd too.
    # (T = 0 is a selection: the k-NN backend's.)
    need_raw = uniform or spec.radius is not None or spec.prior_fn is not None
    plan, bq, bk = dense_plan(n_q, n_k, Q.shape[1], dv, score_pair_bytes(spec), n_weights,
                              Q.device, inplace, spec.budget, item)
    workers, bq, bk = parallel_plan(spec, n_q, n_k, bq, bk, plan)
    # One block holds every key: one softmax (fewer ops to differentiate). Not for the uniform
    # limit, whose weights are summed unnormalised and divided once, so that equal vote counts
    # stay exactly equal.
    single_block = bk >= n_k and not n_weights and not uniform and not state_only
    if (single_block and workers == 1 and n_q <= bq and not spec.grad and not need_raw
            and spec.self_index is None and spec.key_mask is None):
        out = one_block_attention(scorer, Q, T, spec.prior_vec, V_mm, dv)
        if out is not None:
            return (out,)
    # Several key blocks of plain logits (no masks from raw scores, no weights to return):
    # after a row's first block, one product gives a block's logits less the row's running
    # shift, then exp in place (OnlineSoftmax.add_shifted): two fewer passes over each block
    # and no bias copy (measured: 3.3 -> 2.1 ms a 1000 x 1024 float64 block, one thread).
    # The augmented keys are a copy of the keys: only when they fit a quarter of the budget.
    shift_keys = None
    # (The CPU only: it is measured there, and on accelerators each block's overflow check
    # would be a device synchronisation.)
    if (inplace and not need_raw and not n_weights and not state_only and scorer.squared
            and spec.key_mask is None and not isinstance(T, torch.Tensor) and n_k > bk
            and Q.device.type == "cpu" and _shift_keys_fit(spec)):
        shift_keys = shifted_logit_keys(scorer, 1.0 / T, spec.prior_vec)

    def query_block(qs):
        qe = min(n_q, qs + bq)
        rows = slice(qs, qe)
        q_raw = scorer.map_queries(Q[qs:qe])
        q = scorer.centre(q_raw)
        q_index = query_index(spec, rows, q.device)
        block = block_spec(spec)
        if block.radius is not None:
            block.radius.start_block(scorer, q, q_raw, rows, spec.budget)
        state = OnlineSoftmax(qe - qs, dv, V_mm, q, blocks=not single_block)
        top = TopK(qe - qs, n_weights, q, with_aux=uniform) if n_weights else None
        if single_block and spec.grad and not need_raw:
            mask = None if spec.self_index is None else self_mask(spec.self_index[qs:qe], n_k)
            out = single_block_attention(scorer, q, V, 1.0 / T, spec.prior_vec, mask)
            if out is not None:
                return out, None, None
        q_shift = None
        augmented = scorer.augmented(q) if need_raw else None
        for ks in range(0, n_k, bk):
            ke = min(n_k, ks + bk)
            if q_shift is not None:
                q_shift[: qe - qs, -1] = -state.m
                z = torch.mm(q_shift, shift_keys[:, ks:ke])[: qe - qs]
                if spec.self_index is not None:
                    z = mask_self(z, spec.self_index, rows, ks, ke, inplace=True)

                def redo(bad, ks=ks, ke=ke):
                    z = scorer.logits(q[bad], ks, ke, scale=1.0 / T, log_prior=spec.prior_vec)
                    if spec.self_index is not None:
                        z = mask_self(z, spec.self_index, bad + qs, ks, ke, inplace=True)
                    return z

                state.add_shifted(z, V_mm[ks:ke], redo)
                continue
            if need_raw:
                s, bias = raw_scores(block, q, rows, ks, ke, q_index, inplace, augmented)
                prior = block_prior(spec.prior_vec, bias, ks, ke, s)
                if uniform:
                    z = aux = torch.where(s > NEG_INF, prior.expand_as(s), NEG_INF)
                    rank = s
                else:
                    z = scaled(scorer.to_scores(s, q), T) + prior
                    rank, aux = z, None
            else:
                z = scorer.logits(q, ks, ke, scale=1.0 / T, log_prior=spec.prior_vec)
                if spec.self_index is not None:
                    z = mask_self(z, spec.self_index, rows, ks, ke, inplace=True)
                rank, aux = z, None
            if top is not None:
                # Before the in-place exp below: the merge copies what it keeps.
                top.update(rank, ks, aux)
            if single_block:
                state.single(z, V_mm)
            else:
                state.update(z, V_mm[ks:ke], inplace)
                if shift_keys is not None and bool(torch.isfinite(state.m).all()):
                    q_shift = shifted_queries(q)
        if state_only:
            # Partial scores are ||q||^2 - f in the keys' centred coordinates; states of other
            # key sets (shards, centred elsewhere) compare on -f / T: remove the query term
            # ("euclidean" logits are whole scores already).
            whole = uniform or not scorer.squared
            max_z = state.m if whole else state.m - scaled(scorer.query_offset(q), T)
            return (max_z, state.l, state.o[:, :dv]), None, None
        if top is None:
            if state.l is not None:  # None: one softmax over every key, no row empty
                empty_rows(state.l, qs, spec.on_empty, spec.radius)
            return state.result()[:, :dv], None, None
        empty = empty_rows(state.l, qs, spec.on_empty, spec.radius)
        weights = _top_weights(top, state, empty, uniform)
        return state.result()[:, :dv], weights, torch.where(top.r > NEG_INF, top.i, -1)

    starts = range(0, n_q, bq)
    outs, weights, indices = [], [], []
    for out, w, i in track(
        map_blocks(query_block, starts, workers, spec.grad), spec.progress, total=len(starts),
        desc="attention", unit="block",
    ):
        outs.append(out)
        if w is not None:
            weights.append(w)
            indices.append(i)
    if state_only:
        return tuple(torch.cat(parts) for parts in zip(*outs, strict=True)) if outs else (
            V.new_zeros(0), V.new_zeros(0), V.new_zeros((0, dv))
        )
    return backend_result(outs, weights, indices, n_weights, V)


def dense_plan(n_q, n_k, dim, n_values, pair_bytes, n_weights, device, inplace, budget,
               item):
    """``(plan, bq, bk)``: the :func:`plan_blocks` arguments of dense attention of ``n_q``
    queries of ``dim`` numbers of ``item`` bytes over ``n_k`` keys with ``n_values`` values
    (``pair_bytes`` per score, the ``n_weights`` largest weights of each query tracked), and
    its query and key blocks."""
    query_bytes = item * (2 * n_values + 4 + 2 * dim) + (n_weights or 0) * 3 * (2 * item + 8)
    plan = dict(
        pair_bytes=pair_bytes, row_bytes=query_bytes, device=device, what="dense attention",
        hint="use a smaller n_neighbors", cache_sized=inplace,
        whole_rows_up_to=CPU_WHOLE_ROW_KEYS,
    )
    return (plan, *plan_blocks(n_q, n_k, budget=budget, **plan))


def one_block_attention(scorer, Q, T, prior_vec, values_mm, dv):
    """Dense attention of a few queries ``Q`` over every key in one block (a web service's
    single row), without the blockwise loop's machinery (closures, state objects, empty-row
    passes: about a fifth of a single-row call): the operations of ``OnlineSoftmax.single``,
    so each row equals the same row in any batch. ``None`` where a result is not finite (an
    empty row, an overflow): the general path then says which."""
    with _mkl_threads(1):
        z = scorer.logits(scorer.prepare_queries(Q), 0, scorer.n_keys, scale=1.0 / T,
                          log_prior=prior_vec)
        out = _rows_times(flushed_softmax(z, z.amax(1)), values_mm)[:, :dv]
    # every entry is finite when their sum is (one reduction; a sum that overflows sends the
    # call to the general path, which checks entry by entry)
    return out if math.isfinite(float(out.sum())) else None


def _top_weights(top, state, empty, uniform):
    """Normalised weights of the tracked top keys of a query block (0 for padding)."""
    if uniform:
        logw = top.aux
    else:
        logw = top.r
    shift = torch.where(torch.isfinite(state.m), state.m, 0.0)
    total = torch.where(state.l > 0, state.l, 1.0).to(logw.dtype)  # sums may be float64
    w = torch.exp(logw - shift[:, None]) / total[:, None]
    w = torch.where(empty[:, None], 0.0, w)
    return torch.where(top.r > NEG_INF, w, 0.0)


def shifted_stream_pays(spec):
    """Whether dense attention (which SDPA could compute) is faster here, by its shifted-logit
    blocks: measured on 2 cores, float64, 2,000 queries, 32 dimensions, per-key prior: 100,000
    keys 283 ms against SDPA's 366 ms, 30,000 keys 107 against 117 (float32: 152 against 170,
    but 71 against 54). Whole-row blocks (up to ``CPU_WHOLE_ROW_KEYS`` keys) are slower than
    SDPA for many queries. Not the number of queries: one query and many take one path."""
    return (spec.device.type == "cpu" and spec.dtype == torch.float64 and not spec.grad
            and spec.n_keys > CPU_WHOLE_ROW_KEYS and spec.key_mask is None
            and _shift_keys_fit(spec))


def _shift_keys_fit(spec):
    """Whether the augmented keys of the shifted path (a copy of the keys) fit a quarter of
    the budget."""
    item = spec.queries.element_size()
    return spec.n_keys * (spec.scorer.dim + 2) * item <= spec.budget // 4


def shifted_logit_keys(scorer, scale, log_prior):
    """Keys ``[coef * scale * k, scale * offset + log_prior, 1]`` (the squared kinds), so that
    the queries of :func:`shifted_queries`, ``[q, 1, -shift]``, give a block's logits less a
    per-row shift in one product; transposed, ``(d + 2, n_keys)``, as ``Scorer.keys_t``."""
    keys_t, d = scorer.keys_t, scorer.dim
    out = keys_t.new_empty((d + 2, keys_t.shape[1]))
    torch.mul(keys_t, scorer.coef * scale, out=out[:d])
    bias = out[d]
    if scorer.key_offset is None:
        bias.zero_()
    else:
        torch.mul(scorer.key_offset, scale, out=bias)
    if log_prior is not None:
        bias.add_(log_prior)
    out[d + 1] = 1.0
    return out


def shifted_queries(q):
    """``[q, 1, shift]`` with rows padded as ``padded_rows`` pads them (zeros; the caller
    writes minus the shift into the last column of the real rows)."""
    rows, d = q.shape
    out = q.new_zeros((rows + -rows % ROW_MULTIPLE, d + 2))
    out[:rows, :d] = q
    out[:rows, d] = 1.0
    return out
