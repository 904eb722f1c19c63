"""The top-k backend: blockwise selection of each query's k best keys, then a softmax over them.

Selection streams over key blocks with a top-k merge of a few more than k candidates on the fast
scores (no autograd), then settles them on exact distances in (distance, index) order
(``_exact.py``); the rare rows whose candidates could miss a key get a second, exact pass. The
softmax over the k selected keys uses their exact scores, recomputed with autograd when
differentiating. The selection alone is :func:`skattention.kneighbors`.
"""

import contextlib
import math

import torch

from ._budget import CPU_BLOCK_ENTRIES, cpu_block_rows, plan_blocks, plan_rows, score_pair_bytes
from ._cells import key_cells
from ._device import accumulation_dtype
from ._exact import merge_exact, row_packed, sort_exact
from ._masks import call_prior_fn, query_index, raw_scores, scaled
from ._multiplicity import (
    COUNTED_DTYPES,
    COUNTED_MAX_LOG,
    counted,
    multiplicity,
    selection_count,
    without_own_unit,
)
from ._parallel import block_spec, map_blocks, parallel_plan
from ._progress import track
from ._results import BlockRows, cat_or_empty, empty_rows
from ._scores import NEG_INF
from ._scratch import reused_buffers
from ._softmax import batch_exp
from ._topk import TopK
from ._tree_calls import tree_blocks, tree_for


# Candidates kept on the fast scores: k and two more (a few more for large k), so that a row whose
# k-th exact distance is clearly closer than every key left out is settled without a second pass
# over the keys (docs/performance.md, "The k-NN selection"); the top-k merge is the hot loop, so
# few extra candidates keep it fast.
def _n_candidates(k, n_keys):
    return min(n_keys, k + 2 + k // 8)


# Keys per CPU block of the selection: each block's merge is a few dozen small kernels, so
# over many keys (_CPU_MANY_KEYS) blocks of twice as many pay, and with fewer queries than a
# cache-sized block's rows wider ones still, up to _CPU_FEW_QUERY_KEYS (docs/performance.md,
# "The k-NN selection"); over key cells (whose blocks of queries share nearby keys) 512.
# Exact whatever the width.
_CPU_SELECTION_KEYS = 512
_CPU_MANY_KEYS = 1 << 16
_CPU_FEW_QUERY_KEYS = 4096


def _selection_keys(n_queries, n_keys):
    """Keys per CPU block of the selection of ``n_queries`` queries over ``n_keys`` keys."""
    base = _CPU_SELECTION_KEYS * (2 if n_keys >= _CPU_MANY_KEYS else 1)
    return max(base, min(_CPU_FEW_QUERY_KEYS, CPU_BLOCK_ENTRIES // max(1, n_queries)))


# Scratch bytes of one candidate key of the second pass: its index pair from nonzero (16), its
# exact value and key index (16), their packing per row (24) and the merge's concatenations,
# sort and gathers (about 64).
_CANDIDATE_BYTES = 128


def nearest_blocks(spec, k, query_bytes, what):
    """Yield ``(qs, qe, q, q_index, f, index)`` per query block: the ``k`` nearest unmasked keys
    of each query in exact (distance, index) order (``_exact.py``), their exact ``f`` (float64,
    ``inf`` for padding) and indices (``-1`` for padding). ``q`` are the block's centred queries
    (with autograd when differentiating; the selection itself runs without).
    """
    prepared, Q = spec.keys, spec.queries
    n_q, n_k = Q.shape[0], prepared.n_keys
    m = _n_candidates(k, n_k)
    item = Q.element_size()
    # top-k buffers and their merge; exact values, indices and their two sorts
    row_bytes = query_bytes + 3 * m * (item + 8) + 2 * item * Q.shape[1] + 6 * 8 * m
    plan = dict(
        pair_bytes=score_pair_bytes(spec), row_bytes=row_bytes, device=Q.device, what=what,
        hint="use a smaller n_neighbors",
    )
    tree = tree_for(spec, k)
    if tree is not None:
        yield from tree_blocks(spec, tree, k, query_bytes, what)
        return
    cells = _cells_for(spec, k)
    if cells is not None:
        # the lower bounds of every key block for each row (and their temporaries); cell
        # blocks take whole cell blocks of keys: a budget too small for either leaves the cells
        cell_plan = dict(plan, row_bytes=row_bytes + _BOUND_BYTES * cells.n_blocks)
        try:
            bq, bk = plan_blocks(n_q, n_k, budget=spec.budget, cpu_cols=_CPU_SELECTION_KEYS,
                                 **cell_plan)
        except MemoryError:
            bq = bk = 0
        if bk >= cells.block_keys:
            workers, bq, bk = parallel_plan(spec, n_q, n_k, bq, bk, cell_plan)
            yield from _blocks_in_cells(spec, cells, k, m, bq, bk, workers, what)
            return
    bq, bk = plan_blocks(n_q, n_k, budget=spec.budget, cpu_cols=_selection_keys(n_q, n_k), **plan)
    workers, bq, bk = parallel_plan(spec, n_q, n_k, bq, bk, plan)
    if n_q * n_k <= CPU_BLOCK_ENTRIES and bk < n_k:
        # A few queries (a single row): all keys in one cache-sized block, one top-k instead of
        # one per 1,024 keys. Selections are exact whatever the blocks, so this changes no
        # result; the budget still decides.
        with contextlib.suppress(MemoryError):
            bq, bk = plan_blocks(n_q, n_k, budget=spec.budget, whole_rows=True, **plan)

    def select(qs):
        qe = min(n_q, qs + bq)
        q_raw = prepared.map_queries(Q[qs:qe])
        q = prepared.centre(q_raw)
        q_index = query_index(spec, slice(qs, qe), q.device)
        with torch.no_grad():
            f, idx = _select(
                block_spec(spec), q.detach(), q_raw.detach(), slice(qs, qe), q_index, k, m, bk,
                spec.budget // workers,
            )
        return qs, qe, q, q_index, f, idx

    starts = range(0, n_q, bq)
    yield from track(
        map_blocks(select, starts, workers, spec.grad), spec.progress, total=len(starts), desc=what,
        unit="block",
    )


def _cells_for(spec, k):
    """The key cells of the selection (``_cells.py``) where they apply and are expected to pay:
    exact k nearest of many queries on the CPU, with no mask or prior, over prepared keys (the
    cells are built once for them) of a distance kind."""
    if (not spec.prepared or spec.device.type != "cpu" or spec.grad or spec.radius is not None
            or spec.self_index is not None or spec.prior_fn is not None
            or spec.prior_vec is not None or spec.key_mask is not None):
        return None
    cells = key_cells(spec.keys, spec.n_queries, spec.budget / 2**20)
    if cells is None or not cells.pays(spec.keys.map_queries(spec.queries), k, spec.budget):
        return None
    return cells


def _blocks_in_cells(spec, cells, k, m, bq, bk, workers, what):
    """:func:`nearest_blocks` over key cells: the queries grouped by cell (a block of queries
    then has nearby keys in common, and far key blocks to skip), selected block by block
    (:func:`_select_in_cells`), and yielded in their own order. A query's selection is exact
    whatever its block, so the grouping changes no result. Where the first block skips too few
    keys to pay (keys without cluster structure), the others take :func:`_select`."""
    prepared, Q, pruning = spec.keys, spec.queries, [True]
    n_q = Q.shape[0]
    # Queries are grouped within chunks of the call (the chunk's selections are held until
    # they are back in order: at most a quarter of the budget, and at least one block).
    chunk = max(bq, (spec.budget // 4) // (16 * k) // bq * bq)

    def select(start, order):
        rows = order[start : start + bq]
        q_raw = Q.index_select(0, rows)
        with torch.no_grad():
            if pruning[0]:
                f, idx, computed = _select_in_cells(spec, cells, q_raw, k, m, bk,
                                                    spec.budget // workers)
                if computed > _CELLS_PAY_BELOW:
                    pruning[0] = False
            else:
                f, idx = _select(block_spec(spec), prepared.centre(q_raw), q_raw,
                                 slice(start, start + rows.numel()), None, k, m, bk,
                                 spec.budget // workers)
        return rows, f, idx

    starts = range(0, n_q, bq)
    progress = iter(track(range(len(starts)), spec.progress, total=len(starts), desc=what,
                          unit="block"))
    for cs in range(0, n_q, chunk):
        ce = min(n_q, cs + chunk)
        order = cs + torch.argsort(
            cells.cell_of(prepared.map_queries(Q[cs:ce]), spec.budget / 2**20), stable=True)
        f_chunk = torch.empty((ce - cs, k), dtype=torch.float64, device=Q.device)
        idx_chunk = torch.empty((ce - cs, k), dtype=torch.long, device=Q.device)
        for rows, f, idx in map_blocks(lambda start, order=order: select(start, order),
                                       range(0, ce - cs, bq), workers, spec.grad):
            f_chunk[rows - cs], idx_chunk[rows - cs] = f, idx
            next(progress, None)
        for qs in range(cs, ce, bq):
            qe = min(ce, qs + bq)
            q = prepared.prepare_queries(Q[qs:qe])
            yield (qs, qe, q, query_index(spec, slice(qs, qe), q.device),
                   f_chunk[qs - cs : qe - cs], idx_chunk[qs - cs : qe - cs])
    for _ in progress:  # closes the bar
        pass


# A query block over key cells that computes more than this fraction of the keys: the cells do
# not pay (keys without cluster structure; docs/performance.md, "Key cells").
_CELLS_PAY_BELOW = 0.6
# Scratch bytes per row and key block of the blocks' lower bounds (``KeyCells.lower_bounds``:
# four float64 temporaries alive at once, and the block order).
_BOUND_BYTES = 40


def _select_in_cells(spec, cells, q_raw, k, m, bk, budget):
    """:func:`_select` of a block of raw queries over key cells: ``(f, idx, computed)``, the
    exact k nearest (original key indices) and the fraction of the keys whose scores were
    computed.

    Key blocks go nearest first (by their smallest lower bound over the rows); one is skipped
    when every row's lower bound for it exceeds the row's bound on its final k-th nearest: the
    fast ``f`` of its ``m``-th candidate so far plus twice the rounding margin (each of its
    final ``m`` candidates has an exact ``f`` at most that). A skipped key is then farther
    than the k-th nearest, never tied with it, and the settling below (whose bound covers the
    computed keys) stays exact; a row whose candidates could miss a computed key gets the
    exact pass over all keys."""
    ps = cells.keys
    q = ps.centre(q_raw)
    top = TopK(q.shape[0], m, q)
    augmented = ps.augmented(q)
    offset, margin = ps.query_offset(q), ps.margin(q)
    offset64, slack = offset.double(), 2 * margin.double()
    lower = cells.lower_bounds(q_raw)
    nearest = lower.amin(0)
    computed = 0
    with reused_buffers():  # (every key block's scores in one buffer)
        for j in torch.argsort(nearest).tolist():
            bound = offset64 - top.r[:, -1].double() + slack
            if float(nearest[j]) > float(bound.max()):
                break  # every later block is at least as far from every row
            if not bool((lower[:, j] <= bound).any()):
                continue
            ks, ke = cells.bounds[j], cells.bounds[j + 1]
            top.update(ps.block(q, ks, ke, augmented=augmented, scratch_key="selection"), ks)
            computed += ke - ks
    index = torch.where(top.r > NEG_INF, cells.perm[top.i.clamp(min=0)], -1)
    f, idx = _settled(spec, top, index, q_raw, offset, margin, 0, k, bk, budget)
    return f, idx, computed / ps.n_keys


def _select(spec, q, q_raw, rows, q_index, k, m, bk, budget):
    """Exact k nearest of a query block: ``m`` candidates on the fast scores, settled exactly;
    rows whose candidates may miss a key go through :func:`_exact_pass` (within ``budget``
    bytes: the worker's share)."""
    prepared = spec.keys
    if spec.radius is not None:
        spec.radius.start_block(prepared, q, q_raw, rows, spec.budget, lenient=True)
    top = TopK(q.shape[0], m, q)
    augmented = prepared.augmented(q)
    with reused_buffers():  # (every key block's scores in one buffer: TopK copies what it keeps)
        for ks in range(0, prepared.n_keys, bk):
            ke = min(prepared.n_keys, ks + bk)
            s, _ = raw_scores(spec, q, rows, ks, ke, q_index, inplace=True, augmented=augmented,
                              scratch_key="selection")
            top.update(s, ks)
    if m == prepared.n_keys:  # every key a candidate: nothing left out
        return _settled(spec, top, top.i, q_raw, None, None, rows.start, k, bk, budget)
    return _settled(spec, top, top.i, q_raw, prepared.query_offset(q), prepared.margin(q),
                    rows.start, k, bk, budget)


def _settled(spec, top, index, q_raw, offset, margin, row_start, k, bk, budget):
    """``(f, idx)``: the fast candidates of a block of raw queries (``top``; ``index`` their
    key indices in ``spec.keys``) settled on exact values, the k first in (distance, index)
    order. ``offset`` and ``margin``: the query offsets and rounding margins of the prepared keys
    the fast scores came from (``None``: every key was a candidate). A key left out has a fast f at
    least the last candidate's, so an exact f at least that minus the margin: a row is settled
    when this is beyond its k-th exact f (or when its last candidate is masked: then every
    unmasked key is a candidate); the others go through :func:`_exact_pass` (``row_start``:
    the block's first query row, for the masks)."""
    valid = top.r > NEG_INF
    f = spec.keys.exact_f(q_raw, index, spec.budget)
    if spec.radius is not None:
        valid &= spec.radius.inside(f, index)
    f, idx = sort_exact(torch.where(valid, f, math.inf), index, k)
    if offset is None:
        return f, idx
    last = offset - top.r[:, -1]
    unsettled = (top.r[:, -1] > NEG_INF) & ~(last - margin > f[:, k - 1])
    local = unsettled.nonzero().squeeze(1)
    if local.numel():
        f[local], idx[local] = _exact_pass(
            spec, spec.keys.centre(q_raw[local]), q_raw[local], local + row_start,
            f[local, k - 1], k, bk, budget
        )
    return f, idx


def _exact_pass(spec, q, q_raw, rows, bound, k, bk, budget):
    """The k nearest of query rows ``rows`` (an index tensor) by a second pass over every key:
    keys whose fast f is within the margin of ``bound`` (an upper bound on the k-th exact f) are
    computed exactly and merged in (distance, index) order, within ``budget`` bytes."""
    prepared, n_k = spec.keys, spec.keys.n_keys
    # per entry: the fast block and its candidate mask, and as a candidate (every key of a
    # block can be one: tied keys) its exact value and its part in the packing and the merge
    pair_bytes = score_pair_bytes(spec) + 2 + _CANDIDATE_BYTES
    # These are few rows (near ties): on the CPU their key blocks hold a cache-sized block's
    # entries, not bk keys a row (a block's dozen ops per 1,024 keys would cost more than its
    # scores). The selection is exact whatever the widths.
    fits = max(1, budget // pair_bytes)
    width = min(bk, fits)
    if q.device.type == "cpu":
        width = max(width, min(n_k, CPU_BLOCK_ENTRIES // q.shape[0], fits))
    chunk = plan_rows(
        q.shape[0], row_bytes=width * pair_bytes, budget=budget, max_rows=cpu_block_rows(width),
    )
    parts_f, parts_i = [], []
    for start in range(0, q.shape[0], chunk):
        sl = slice(start, start + chunk)
        qc, qrc, rc = q[sl], q_raw[sl], rows[sl]
        n_c = qc.shape[0]
        q_index = query_index(spec, rc, q.device)
        if spec.radius is not None:
            spec.radius.start_block(prepared, qc, qrc, rc, spec.budget, lenient=True)
        qoff_margin = (prepared.query_offset(qc) - prepared.margin(qc))[:, None]
        best_f = torch.full((n_c, k), math.inf, dtype=torch.float64, device=q.device)
        best_i = torch.full((n_c, k), -1, dtype=torch.long, device=q.device)
        limit = bound[sl].clone()
        augmented = prepared.augmented(qc)
        for ks in range(0, n_k, width):
            ke = min(n_k, ks + width)
            s, _ = raw_scores(spec, qc, rc, ks, ke, q_index, inplace=True, augmented=augmented)
            # exact f >= fast f - margin: only these can be among the k nearest
            possible = (qoff_margin - s <= limit.to(s.dtype)[:, None]) & (s > NEG_INF)
            r, c = possible.nonzero(as_tuple=True)
            if r.numel() == 0:
                continue
            fe = prepared.exact_pairs(qrc, r, c + ks, spec.budget)
            if spec.radius is not None:
                fe = torch.where(fe <= spec.radius.exact_r2(r, c + ks), fe, math.inf)
            cand_f, cand_i = row_packed(r, n_c, fe, c + ks, fill=(math.inf, -1))
            best_f, best_i = merge_exact(best_f, best_i, cand_f, cand_i)
            limit = torch.minimum(limit, best_f[:, -1])
        parts_f.append(best_f)
        parts_i.append(best_i)
    return torch.cat(parts_f), torch.cat(parts_i)


def knn_attention(spec):
    """Attention restricted to each query's ``spec.n_neighbors`` nearest keys (the k-NN prior;
    a per-key prior counts as multiplicity there); at ``T = 0`` the nearest key alone (the
    lowest index among exact ties, like 1-NN)."""
    prepared, Q, V, T = spec.keys, spec.queries, spec.values, spec.temperature
    n_weights = spec.n_weights
    k = spec.n_neighbors if spec.n_neighbors is not None else (n_weights or 1)
    n_select = selection_count(spec, k)
    dv = V.shape[1]
    gather_bytes = n_select * (V.element_size() * dv
                               + Q.element_size() * ((prepared.dim if spec.grad else 0) + 6))
    what = f"k-NN attention with n_neighbors={k}" if spec.n_neighbors else "1-NN attention"
    rows = BlockRows(Q.shape[0], V, n_weights, spec.grad)
    for qs, _, q, q_index, f, idx in nearest_blocks(spec, n_select, gather_bytes, what):
        safe_idx = idx.clamp(min=0)
        # Scores recomputed with the graph when differentiating, else the exact ones.
        s = prepared.exact(q, idx) if spec.grad else prepared.scores_of_f(f).to(q.dtype)
        log_weight = None if spec.prior_vec is None else spec.prior_vec[safe_idx]
        bias = None
        if spec.unit_out is not None:  # (its prior_fn is the dense paths' form of this)
            log_weight = without_own_unit(log_weight, idx, spec.unit_out[q_index])
        elif spec.prior_fn is not None:
            bias = call_prior_fn(spec.prior_fn, q_index, safe_idx, s)
        out, p, selected = softmax_over_selected(
            s, idx, V[safe_idx], log_weight, bias, T, spec.n_neighbors,
            lambda total, qs=qs: empty_rows(total, qs, spec.on_empty, spec.radius),
        )
        if n_weights is not None:
            pad = n_weights - p.shape[1]
            if pad > 0:
                p = torch.nn.functional.pad(p, (0, pad))
                selected = torch.nn.functional.pad(selected, (0, pad), value=-1)
            p, selected = p[:, :n_weights], selected[:, :n_weights]
        rows.add(out, p, selected)
    return rows.result()


def softmax_over_selected(s, idx, values, log_weight, bias, T, k_units, empty_rows_of):
    """Attention over each query's selected keys (``idx``, ``-1`` for padding; ``s`` their
    scores, ``values`` their value rows (q, n, dv)): the k-NN prior's softmax, or at ``T = 0``
    the first (nearest) key alone.

    ``log_weight``: the selected keys' per-key log-prior (``None``: none), a multiplicity when
    ``k_units`` (the k-NN prior's ``n_neighbors``) is given; ``bias``: a further log-bias;
    ``empty_rows_of(total)``: the rows with no weight (or an error). Returns the outputs, the
    normalised weights and the indices of the keys that got weight (``-1`` past the k units).
    """
    valid = idx >= 0
    if log_weight is None and bias is None and T in (0.0, math.inf) and not s.requires_grad:
        # weights 1 on the selected keys (at T = 0 the nearest alone) and 0 elsewhere, as the
        # softmax below gives them (exp(0) = 1), in two ops instead of a dozen (a single row's
        # k-NN predict is dispatch-bound)
        p = valid.to(s.dtype)
        if T == 0.0:
            p[:, 1:] = 0.0
        selected = idx
    else:
        s = torch.where(valid, s, NEG_INF)
        prior = torch.zeros_like(s)
        if log_weight is not None:
            prior = log_weight if k_units is None else multiplicity(log_weight, valid, k_units)
        if bias is not None:
            prior = prior + bias
        if T == 0.0:
            nearest = torch.zeros_like(valid)
            nearest[:, 0] = valid[:, 0]
            z = torch.where(nearest, 0.0, NEG_INF).to(s.dtype)
        elif T == math.inf:
            z = torch.where(valid, prior, NEG_INF)
        else:
            z = torch.where(valid, scaled(s, T) + prior, NEG_INF)
        m = z.amax(1, keepdim=True)
        p = batch_exp(z - torch.where(torch.isfinite(m), m, 0.0))
        if (T == math.inf and log_weight is not None and bias is None and k_units is not None
                and z.dtype in COUNTED_DTYPES and not z.requires_grad):
            # a row whose selected shares of the k units are all in the counted range: the
            # shares unshifted (at most k each) and counted exactly, so that integer weights
            # sum to the repeated keys' votes (decided by the row's own keys: in any batch,
            # and over merged shards)
            rows = ((z >= -COUNTED_MAX_LOG) | torch.isneginf(z)).all(1, keepdim=True)
            p = torch.where(rows, counted(batch_exp(z), z.dtype), p)  # (exp(-inf) is 0)
        # keys past the k units of a weighted selection are not selected
        selected = torch.where(torch.isneginf(prior), -1, idx)
    # Sum first, divide once: equal vote counts stay exactly equal. The values' dtype may be
    # wider than the scores' (``_inputs.averaging_dtype``): the sum and the division in it;
    # half-precision ones accumulate in float32 (``accumulation_dtype``).
    acc = accumulation_dtype(values.dtype)
    total = p.sum(1, dtype=accumulation_dtype(p.dtype))
    empty = empty_rows_of(total)
    total = torch.where(total > 0, total, 1.0)[:, None]
    out = (torch.bmm(p[:, None, :].to(acc), values.to(acc)).squeeze(1) / total.to(acc))
    weights = (p / total).to(p.dtype)
    return torch.where(empty[:, None], 0.0, out).to(values.dtype), weights, selected


def nearest_keys(spec):
    """``(distances, indices)`` of each query's ``spec.n_neighbors`` nearest keys, in exact
    (distance, index) order; ``inf`` and ``-1`` where fewer keys are unmasked. Distances are
    the values of ``f``: squared for ``"sqeuclidean"``, not for ``"euclidean"``."""
    k = spec.n_neighbors
    dists, indices = [], []
    with torch.no_grad():
        for _, _, _, _, f, idx in nearest_blocks(spec, k, 0, "kneighbors"):
            f = f if spec.keys.squared else f.sqrt()
            dists.append(f.to(spec.queries.dtype))
            indices.append(idx)
    return (
        cat_or_empty(dists, (0, k), spec.queries),
        cat_or_empty(indices, (0, k), spec.queries, torch.long),
    )
