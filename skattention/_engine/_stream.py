"""The streaming backend: query blocks x key blocks with an online softmax (docs/theory.md,
"Computing it exactly").

A running max, sum and weighted sum per query are rescaled when the max grows, so the scratch
memory is one score block whatever the number of keys. It handles every prior and the uniform
limit (``T = inf``; ``T = 0`` is a selection, the k-NN backend's) and, with ``n_weights``, tracks
the largest weights of each query with a blockwise top-k.
"""

import math

import torch

from ._budget import CPU_WHOLE_ROW_KEYS, dense_plan, score_pair_bytes, span_columns, span_stop
from ._masks import block_prior, mask_self, query_index, raw_scores, scaled
from ._multiplicity import counted, counts_prior
from ._one_block import one_block_attention, self_mask, single_block_attention
from ._parallel import block_spec, map_blocks, parallel_plan
from ._progress import track
from ._results import BlockRows, empty_rows
from ._scores import NEG_INF, ROW_MULTIPLE
from ._softmax import LOG2E, OnlineSoftmax, batch_exp
from ._topk import TopK


def stream_attention(spec, state_only=False):
    """``(out,)`` or, with ``spec.n_weights``, ``(out, weights, indices)``; with
    ``state_only``, the online softmax state ``(m, l, o)`` of every query instead (running max,
    sum of ``exp(z - m)`` and weighted values: what shards of the keys merge, ``_shards.py``)."""
    stream = _Stream(spec, state_only)
    if stream.one_block_fits():
        out = one_block_attention(spec.keys, spec.queries, spec.temperature, spec.prior_vec,
                                  spec.values_mm, stream.dv)
        if out is not None:
            return (out.to(spec.values.dtype),)
    starts = range(0, stream.n_q, stream.bq)
    blocks = track(
        map_blocks(stream.query_block, starts, stream.workers, spec.grad), spec.progress,
        total=len(starts), desc="attention", unit="block",
    )
    if state_only:
        outs = [out for out, _, _ in blocks]
        return tuple(torch.cat(parts) for parts in zip(*outs, strict=True)) if outs else (
            spec.values.new_zeros(0), spec.values.new_zeros(0),
            spec.values.new_zeros((0, stream.dv)),
        )
    rows = BlockRows(stream.n_q, spec.values, spec.n_weights, spec.grad)
    for out, w, i in blocks:
        rows.add(out, w, i)
    return rows.result()


class _Stream:
    """The plan of one streaming call (block sizes, workers, which kind of logits) and the
    computation of one query block over every key block (:meth:`query_block`)."""

    def __init__(self, spec, state_only):
        self.spec, self.state_only = spec, state_only
        prepared, Q, T, n_weights = spec.keys, spec.queries, spec.temperature, spec.n_weights
        self.n_q, self.n_k, self.dv = Q.shape[0], prepared.n_keys, spec.values.shape[1]
        self.V_mm = spec.values_mm  # padded once for the products of every block
        self.inplace = not spec.grad
        self.uniform = T == math.inf
        # the uniform limit's weights exp(log_prior) counted exactly, with no shift: each key's
        # once a call (a block's then one selection pass)
        self.counted = self.uniform and counts_prior(spec)
        self.key_counts = (counted(torch.exp(spec.prior_vec), spec.prior_vec.dtype)
                           if self.counted else None)
        # Raw scores are needed for the uniform limit and for masks defined on distances;
        # otherwise one addmm gives the logits (scale and per-key prior folded in) and
        # self-exclusion is masked on them directly. The block is fresh, so masking it in
        # place is safe under autograd too. (T = 0 is a selection: the k-NN backend's.)
        self.need_raw = self.uniform or spec.radius is not None or spec.prior_fn is not None
        plan, bq, bk = dense_plan(self.n_q, self.n_k, Q.shape[1], self.dv, score_pair_bytes(spec),
                                  n_weights, Q.device, self.inplace, spec.budget,
                                  Q.element_size())
        self.workers, self.bq, self.bk = parallel_plan(spec, self.n_q, self.n_k, bq, bk, plan)
        # One block holds every key: one softmax (fewer ops to differentiate). Not for the
        # uniform limit, whose weights are summed unnormalised and divided once, so that equal
        # vote counts stay exactly equal.
        self.single_block = (self.bk >= self.n_k and not n_weights and not self.uniform
                             and not state_only)
        self.shift_keys = None
        if self._shifts_logits():
            self.shift_keys = shifted_logit_keys(prepared, 1.0 / T, spec.prior_vec)

    def one_block_fits(self):
        """Whether the whole call is one block of plain logits (``one_block_attention``)."""
        spec = self.spec
        return (self.single_block and self.workers == 1 and self.n_q <= self.bq
                and not spec.grad and not self.need_raw and spec.self_index is None
                and spec.key_mask is None)

    def _shifts_logits(self):
        """Whether key blocks after a row's first take logits less the row's running shift
        in one product, then exp in place (``OnlineSoftmax.add_shifted``: two fewer passes
        over each block and no bias copy; docs/performance.md, "float64"): several key blocks
        of plain logits (no masks from raw scores, no weights to return), on the CPU (where it
        is measured; on accelerators each block's overflow check would be a device
        synchronisation), with augmented keys (a copy of the keys) that fit a quarter of the
        budget."""
        spec = self.spec
        return (self.inplace and not self.need_raw and not spec.n_weights
                and not self.state_only and spec.keys.squared and not spec.keys.pairwise
                and spec.key_mask is None
                and not isinstance(spec.temperature, torch.Tensor) and self.n_k > self.bk
                and spec.queries.device.type == "cpu" and _shift_keys_fit(spec))

    def query_block(self, qs):
        """``(out, weights, indices)`` of the query block starting at row ``qs`` (weights and
        indices ``None`` unless tracked), or its online softmax state (``state_only``)."""
        spec, prepared = self.spec, self.spec.keys
        qe = min(self.n_q, qs + self.bq)
        rows = slice(qs, qe)
        q_raw = prepared.map_queries(spec.queries[qs:qe])
        q = prepared.centre(q_raw)
        block = block_spec(spec)
        if block.radius is not None:
            block.radius.start_block(prepared, q, q_raw, rows, spec.budget)
        state = OnlineSoftmax(qe - qs, self.dv, self.V_mm, q, blocks=not self.single_block)
        top = (TopK(qe - qs, spec.n_weights, q, with_aux=self.uniform) if spec.n_weights
               else None)
        if self.single_block and spec.grad and not self.need_raw:
            mask = None if spec.self_index is None else self_mask(spec.self_index[qs:qe],
                                                                  self.n_k)
            out = single_block_attention(prepared, q, spec.values, 1.0 / spec.temperature,
                                         spec.prior_vec, mask)
            if out is not None:
                return out, None, None
        self._key_blocks(block, q, rows, state, top)
        return self._block_result(q, qs, state, top)

    def _key_blocks(self, block, q, rows, state, top):
        """Every key block into the query block's online softmax ``state`` (and ``top``)."""
        spec, prepared, T = self.spec, self.spec.keys, self.spec.temperature
        q_index = query_index(spec, rows, q.device)
        q_shift = None
        augmented = prepared.augmented(q) if self.need_raw else None
        for ks in range(0, self.n_k, self.bk):
            ke = min(self.n_k, ks + self.bk)
            if q_shift is not None:
                self._add_shifted(state, q, q_shift, rows, ks, ke)
                continue
            if self.need_raw:
                s, bias = raw_scores(block, q, rows, ks, ke, q_index, self.inplace, augmented)
                prior = block_prior(spec.prior_vec, bias, ks, ke, s)
                if self.uniform:  # (counted key weights need no logits but for the top)
                    z = aux = (None if self.counted and bias is None and top is None
                               else torch.where(s > NEG_INF, prior.expand_as(s), NEG_INF))
                    rank = s
                else:
                    z = scaled(prepared.to_scores(s, q), T) + prior
                    rank, aux = z, None
            else:
                z = prepared.logits(q, ks, ke, scale=1.0 / T, log_prior=spec.prior_vec)
                if spec.self_index is not None:
                    z = mask_self(z, spec.self_index, rows, ks, ke, inplace=True)
                rank, aux = z, None
            if top is not None:
                # Before the in-place exp below: the merge copies what it keeps.
                top.update(rank, ks, aux)
            if self.single_block:
                state.single(z, self.V_mm)
            elif self.counted:
                p = (torch.where(s > NEG_INF, self.key_counts[ks:ke], 0.0) if bias is None
                     else counted(batch_exp(z), z.dtype))  # (the own key's unit left out)
                state.add_counts(p, self.V_mm[ks:ke])
            else:
                state.update(z, self.V_mm[ks:ke], self.inplace)
                if self.shift_keys is not None and bool(torch.isfinite(state.m).all()):
                    q_shift = shifted_queries(q)

    def _add_shifted(self, state, q, q_shift, rows, ks, ke):
        """A key block's logits less the rows' running shift, in one product with the shifted
        keys, into ``state``; rows whose block sum is too large are redone on plain logits."""
        spec, prepared, T = self.spec, self.spec.keys, self.spec.temperature
        n_rows = rows.stop - rows.start
        q_shift[:n_rows, -1] = -state.m
        # over a span of whole multiples (``span_stop``), as ``PreparedKeys.block``'s
        z = torch.mm(q_shift, self.shift_keys[:, ks:span_stop(ks, ke, self.shift_keys.shape[1])])
        z = z[:n_rows, :ke - ks]
        if spec.self_index is not None:
            z = mask_self(z, spec.self_index, rows, ks, ke, inplace=True)

        def redo(bad):
            z = prepared.logits(q[bad], ks, ke, scale=1.0 / T, log_prior=spec.prior_vec)
            if spec.self_index is not None:
                z = mask_self(z, spec.self_index, bad + rows.start, ks, ke, inplace=True)
            return z

        state.add_shifted(z, self.V_mm[ks:ke], redo)

    def _block_result(self, q, qs, state, top):
        """The query block's ``(out, weights, indices)`` or state from its online softmax."""
        spec, dv = self.spec, self.dv
        if self.state_only:
            # Partial scores are ||q||^2 - f in the keys' centred coordinates; states of other
            # key sets (shards, centred elsewhere) compare on -f / T: remove the query term
            # ("euclidean" logits are whole scores already).
            whole = self.uniform or not spec.keys.squared
            max_z = (state.m if whole
                     else state.m - scaled(spec.keys.query_offset(q), spec.temperature))
            return (max_z, state.l, state.o[:, :dv]), None, None
        if top is None:
            if state.l is not None:  # None: one softmax over every key, no row empty
                empty_rows(state.l, qs, spec.on_empty, spec.radius)
            return state.result()[:, :dv], None, None
        empty = empty_rows(state.l, qs, spec.on_empty, spec.radius)
        weights = _top_weights(top, state, empty, self.uniform, self.counted)
        return state.result()[:, :dv], weights, torch.where(top.r > NEG_INF, top.i, -1)


def _top_weights(top, state, empty, uniform, counts=False):
    """Normalised weights of the tracked top keys of a query block (0 for padding);
    ``counts``: the state's sums are of :func:`counted` weights, unshifted."""
    if uniform:
        logw = top.aux
    else:
        logw = top.r
    shift = torch.where(torch.isfinite(state.m), state.m, 0.0)
    # sums may be float64 (averaged values) or float32 (half-precision ones)
    total = torch.where(state.l > 0, state.l, 1.0)
    p = counted(torch.exp(logw), logw.dtype) if counts else torch.exp(logw - shift[:, None])
    w = (p / total[:, None]).to(logw.dtype)
    w = torch.where(empty[:, None], 0.0, w)
    return torch.where(top.r > NEG_INF, w, 0.0)


def shifted_stream_pays(spec):
    """Whether dense attention (which SDPA could compute) is faster here, by its shifted-logit
    blocks: in float64 on the CPU over more keys than one block holds (in float32 SDPA wins
    over some of those sizes; docs/performance.md, "float64"). Whole-row blocks (up to
    ``CPU_WHOLE_ROW_KEYS`` keys) are slower than SDPA for many queries. Not the number of
    queries: one query and many take one path."""
    return (spec.device.type == "cpu" and spec.dtype == torch.float64 and not spec.grad
            and spec.n_keys > CPU_WHOLE_ROW_KEYS and spec.key_mask is None
            and _shift_keys_fit(spec))


def _shift_keys_fit(spec):
    """Whether the augmented keys of the shifted path (a copy of the keys) fit a quarter of
    the budget."""
    item = spec.queries.element_size()
    return spec.n_keys * (spec.keys.dim + 2) * item <= spec.budget // 4


def shifted_logit_keys(prepared, scale, log_prior):
    """Keys ``LOG2E * [coef * scale * k, scale * offset + log_prior, 1]`` (the squared kinds),
    so that the queries of :func:`shifted_queries`, ``[q, 1, -shift]``, give a block's logits
    less a per-row shift, in base 2 (``OnlineSoftmax.add_shifted``'s ``exp2``), in one product;
    transposed, ``(d + 2, n_keys)`` and zero columns up to ``span_columns(n_keys)``, as
    ``PreparedKeys.wide_t``."""
    keys_t, d = prepared.keys_t, prepared.dim
    n = keys_t.shape[1]
    out = keys_t.new_zeros((d + 2, span_columns(n)))  # zero columns for ``span_stop``
    torch.mul(keys_t, prepared.coef * scale, out=out[:d, :n])
    bias = out[d, :n]
    if prepared.key_offset is not None:
        torch.mul(prepared.key_offset, scale, out=bias)
    if log_prior is not None:
        bias.add_(log_prior)
    out[d + 1, :n] = 1.0
    return out.mul_(LOG2E)


def shifted_queries(q):
    """``[q, 1, shift]`` with rows padded as ``padded_rows`` pads them (zeros; the caller
    writes minus the shift into the last column of the real rows)."""
    rows, d = q.shape
    out = q.new_zeros((rows + -rows % ROW_MULTIPLE, d + 2))
    out[:rows, :d] = q
    out[:rows, d] = 1.0
    return out
