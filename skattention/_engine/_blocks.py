"""Block primitives of the attention backends: online softmax, top-k merge, masks and priors.

A block is the scores of a block of queries (rows ``qs:qe``) against a block of keys (columns
``ks:ke``). Scores are *partial* (``||q||^2 - f``, see ``Scorer``); masks set them to ``-inf``.
"""

import math

import torch

from ._budget import cache_row_slices
from ._exact import settle
from ._scores import distance_logits, distance_logits_grads, padded_rows

NEG_INF = float("-inf")


class OnlineSoftmax:
    """Running max ``m``, sum ``l`` and weighted sum ``o`` of exp(z - m) over key blocks.

    The values are :func:`product_values` of ``n_values`` columns (``o`` has all of their
    columns): their column of ones, column ``n_values``, gives each block's weight sums in its
    product, with no pass of its own over the block."""

    def __init__(self, n_rows, n_values, values_mm, like, blocks=True):
        self.sums = n_values
        if not blocks:  # :meth:`single` sets the state from the one block
            return
        self.m = torch.full((n_rows,), NEG_INF, dtype=like.dtype, device=like.device)
        # sums in the values' dtype, which may be wider than the logits' (_rows_times)
        self.l = torch.zeros(n_rows, dtype=values_mm.dtype, device=like.device)
        self.o = torch.zeros(n_rows, values_mm.shape[1], dtype=values_mm.dtype,
                             device=like.device)

    def update(self, z, v, inplace):
        new_m = torch.maximum(self.m, z.amax(1))
        # A row whose keys are all masked so far keeps m = -inf; shift it by 0, not by -inf.
        shift = torch.where(torch.isfinite(new_m), new_m, 0.0)
        alpha = batch_exp(self.m - shift)
        if inplace and z.shape[1] % _EXP_VECTOR == 0:
            p = flushed_exp(z.sub_(shift[:, None]), inplace=True)
        else:
            p = flushed_exp(z - shift[:, None])
        block = _rows_times(p, v)
        self.l = self.l * alpha + block[:, self.sums]
        self.o = self.o * alpha[:, None] + block
        self.m = new_m

    def add_shifted(self, z, v, redo):
        """Add a block of logits given less the running shift ``m`` (``z - m``, one product:
        :func:`shifted_logit_keys`), overwritten by its exponential: no max pass, no
        subtraction pass. A row whose block sum exceeds ``_LARGE_SUM`` (an entry above the
        shift by more than ``log(_LARGE_SUM)``, up to exp's overflow) is redone by
        :meth:`update` on the logits ``redo(rows)`` gives for those rows alone (each row's
        result depends on its own data only): its weights then stay at most 1, as in the plain
        path, so a weighted sum overflows no sooner than there. A row whose running sum grows
        large over several blocks folds it into its shift."""
        p = flushed_exp(z, inplace=z.shape[1] % _EXP_VECTOR == 0)
        block = _rows_times(p, v)
        block_l = block[:, self.sums]
        ok = block_l <= _LARGE_SUM  # False for inf and NaN too
        all_ok = bool(ok.all())
        if all_ok:
            self.l = self.l + block_l
            self.o = self.o + block
        else:
            self.l = torch.where(ok, self.l + block_l, self.l)
            self.o = torch.where(ok[:, None], self.o + block, self.o)
            bad = (~ok).nonzero().squeeze(1)
            part = OnlineSoftmax.__new__(OnlineSoftmax)
            part.sums = self.sums
            part.m, part.l, part.o = self.m[bad], self.l[bad], self.o[bad]
            part.update(redo(bad), v, inplace=True)
            self.m, self.l, self.o = (t.index_copy(0, bad, u) for t, u in
                                      ((self.m, part.m), (self.l, part.l), (self.o, part.o)))
        large = self.l > _LARGE_SUM
        if bool(large.any()):
            alpha = torch.where(large, 1.0 / self.l, 1.0)
            self.m = torch.where(large, self.m + torch.log(self.l), self.m)
            self.l = self.l * alpha
            self.o = self.o * alpha[:, None]

    def single(self, z, v):
        """The whole softmax at once, when one key block holds every key (fewer ops to
        differentiate than the streaming update)."""
        self.m = z.amax(1)
        empty = torch.isneginf(self.m)
        if not bool(empty.any()):  # the common case: fewer passes over the block
            self.o = _rows_times(flushed_softmax(z, self.m), v)
            self.l = None  # every row's normaliser is 1: nothing to divide (a single-row call)
            return
        self.l = (~empty).to(z.dtype)
        # no NaN rows to differentiate
        p = flushed_softmax(torch.where(empty[:, None], 0.0, z), torch.where(empty, 0.0, self.m))
        self.o = torch.where(empty[:, None], 0.0, _rows_times(p, v))

    def result(self):
        if self.l is None:
            return self.o
        return self.o / torch.where(self.l > 0, self.l, 1.0)[:, None]


def single_block_attention(scorer, q, v, scale, log_prior, mask=None):
    """``softmax(logits) @ v`` of queries ``q`` against every key in one block, under autograd,
    or ``None`` where a row could have no unmasked key (the caller's general path handles it).

    A training step is this call plus its backward, and its time goes to passes over the
    (rows x keys) block, which is too large for the caches: :class:`_SingleBlockSoftmax`
    makes each pass over cache-sized row chunks, about a third of the memory traffic of
    autograd's chain of the same operations. ``mask(z, rows)`` masks the logits of the block's
    rows ``rows`` (a slice) in place (self-exclusion).
    """
    if log_prior is not None and bool(torch.isneginf(log_prior).any()):
        return None  # a zero-weight key: a row of such keys alone would have no softmax
    if mask is not None and scorer.n_keys < 2:
        return None
    if scorer.squared:
        z = scorer.logits(q, 0, scorer.n_keys, scale=scale, log_prior=log_prior)
        return _SingleBlockSoftmax.apply(z, None, None, None, v, mask)
    partial = scorer.block(q, 0, scorer.n_keys)
    return _SingleBlockSoftmax.apply(partial, scorer.query_offset(q), scale, log_prior, v, mask)


def self_mask(own, n_keys):
    """The ``mask`` of :func:`single_block_attention` that excludes key ``own[i]`` from the
    block's row ``i`` (``-1``: none)."""
    return lambda z, rows: mask_self(z, own[rows], slice(None), 0, n_keys, inplace=True)


def flush_below(dtype):
    """The log-weight (relative to a row's largest) under which every softmax here sets a
    weight to 0: far below the dtype's precision (such weights change no sum of a row's
    weights), far above its subnormal range (products of such weights with small gradients
    stay normal numbers)."""
    return -600.0 if dtype == torch.float64 else -60.0


def flushed_exp(z, inplace=False):
    """``exp(z)`` of logits less their row's largest (or less a running shift at most that),
    with the weights at most ``exp(flush_below)`` set to 0; in place when ``inplace`` (the
    caller knows the rows fill whole exp vectors or need not be rounded alike in any batch),
    else as :func:`batch_exp`, rounded alike in any batch (:func:`flushed_softmax` for
    ``torch.softmax``, whose exponential is fast on ``-inf``).

    torch's ``exp`` is 40 to 170 times slower on arguments below about -87 (float32; results
    subnormal or 0) and 20 to 40 times slower on ``-inf`` than on normal ones, and products
    with subnormal weights about 100 times slower (measured): a sharp temperature puts many of
    a row's keys there. So the arguments are clamped a unit below the cut (their exponentials
    stay normal numbers), and the weights at most the cut's exponential are then zeroed: three
    fast passes whatever the values."""
    low = flush_below(z.dtype)
    if inplace:
        p = z.clamp_min_(low - 1.0).exp_()
    else:
        p = batch_exp(z.clamp_min(low - 1.0))
    zero = torch.nn.functional.threshold if p.requires_grad else torch.nn.functional.threshold_
    return zero(p, math.exp(low), 0.0)


def flushed_softmax(z, row_max):
    """``softmax(z, 1)`` of logits whose rows' largest entries are ``row_max`` (finite), with
    the weights below ``exp(flush_below)`` of a row's largest set to 0: their logits become
    ``-inf``, on which softmax's exponential is fast (``torch.exp`` is not: :func:`flushed_exp`).
    Otherwise the same numbers: softmax subtracts each row's largest itself, here 0."""
    shifted = z - row_max.detach()[:, None]
    return torch.softmax(torch.nn.functional.threshold_(shifted, flush_below(z.dtype), NEG_INF), 1)


def _outer_rows(a, b, out):
    """``a @ b`` into ``out`` for ``a`` with few columns: one broadcast pass per column
    (4 times faster than BLAS's rank-2 product over 2,048 columns, measured)."""
    if a.shape[1] > 8:
        return torch.mm(a, b, out=out)
    torch.mul(a[:, :1], b[0], out=out)
    for c in range(1, a.shape[1]):
        out.addcmul_(a[:, c : c + 1], b[c])
    return out


class _SingleBlockSoftmax(torch.autograd.Function):
    """``softmax(z) @ v`` with ``z`` the given logits (``offset`` None) or, for the
    ``"euclidean"`` kind, ``-scale * sqrt(max(offset - partial, 0)) + prior``; the backward
    written out: ``dz = p * (dO v^T - rowsum(dO * out))``, then the distance's chain rule.
    Both run chunk by chunk of rows; the probabilities ``p`` and distances are kept."""

    @staticmethod
    def forward(ctx, partial, offset, scale, prior, v, mask):
        ctx.scale = None if offset is None else float(scale)
        p = torch.empty_like(partial)
        d = None if offset is None else torch.empty_like(partial)
        v_t = v.T.contiguous()
        out = partial.new_empty((partial.shape[0], v.shape[1]))
        for rows in cache_row_slices(*partial.shape, partial.device):
            z = p[rows]
            if offset is None:
                z.copy_(partial[rows])
            else:
                distance_logits(partial[rows], offset[rows], ctx.scale, prior, d_out=d[rows],
                                z_out=z)
            if mask is not None:
                mask(z, rows)
            z.sub_(z.amax(1, keepdim=True))
            # (measured: a regressor on residual targets, whose sharper attention put many
            # weights below exp(-60), ran this pass and the backward up to 4 times slower)
            flushed_exp(z, inplace=True)
            z.div_(z.sum(1, keepdim=True))
            # z @ v as v^T's rows against z's: BLAS's (rows x keys) @ (keys x few) is about
            # 8 times slower than this form for a few values (measured, float32).
            torch.nn.functional.linear(z, v_t, out=out[rows])
        ctx.save_for_backward(p, d, v_t, out, scale if isinstance(scale, torch.Tensor) else None)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out):
        p, d, v_t, out, scale = ctx.saved_tensors
        need_partial, need_offset, need_scale, need_prior, need_v, _ = ctx.needs_input_grad
        d_v = (d_out.T @ p).T if need_v else None
        # sum_j p_ij (d_out_i . v_j) = d_out_i . out_i: the softmax backward's row term
        row_term = (d_out * out).sum(1, keepdim=True)
        g = torch.empty_like(p)
        d_scale = d_prior = d_offset = None
        if d is not None:
            d_scale = p.new_zeros(()) if need_scale else None
            d_prior = p.new_zeros(p.shape[1]) if need_prior else None
            d_offset = p.new_empty(p.shape[0]) if need_offset else None
        for rows in cache_row_slices(*p.shape, p.device):
            dz = _outer_rows(d_out[rows], v_t, g[rows]).sub_(row_term[rows]).mul_(p[rows])
            if d is None:
                continue
            # dz becomes the partial scores' gradient in place (g's rows)
            _, offset_rows, scale_part, prior_part = distance_logits_grads(
                dz, d[rows], ctx.scale, (True, need_offset, need_scale, need_prior))
            if need_scale:
                d_scale += scale_part
            if need_prior:
                d_prior += prior_part
            if need_offset:
                d_offset[rows] = offset_rows
        if d is None:
            return g, None, None, None, d_v, None
        if d_scale is not None:
            d_scale = d_scale.reshape(scale.shape)
        return (g if need_partial else None), d_offset, d_scale, d_prior, d_v, None


# Entries per vector of the widest exp kernel (AVX-512, float32); a multiple of the others.
_EXP_VECTOR = 16
# A running softmax sum above this is folded into the shift (OnlineSoftmax.add_shifted).
_LARGE_SUM = 2.0**20


def batch_exp(x):
    """``exp(x)`` with every entry rounded as in any other batch: torch's vectorised ``exp``
    leaves a tensor's last ``numel % vector`` entries to a scalar loop, which rounds differently,
    and which entries those are depends on the number of rows. Rows padded to whole vectors
    never have such a tail."""
    pad = -x.shape[-1] % _EXP_VECTOR
    if pad == 0:
        return torch.exp(x)
    return torch.exp(torch.nn.functional.pad(x, (0, pad)))[..., : x.shape[-1]]


def product_values(v):
    """Values (n, d) as :func:`_rows_times` multiplies them, prepared once per call or per
    prepared keys: a column of ones appended (column ``d``: a product then also gives each
    row's weight sum, which :class:`OnlineSoftmax` reads there instead of summing its block in
    a pass of its own, measured 0.3 ms of a 1,000 x 1,024 float64 block's 2.8 ms), and in
    float64 zero columns up to a multiple of 8 (the kernel pairs rows unless the columns fill
    whole vectors of 8). Callers slice the first ``d`` columns off their results."""
    ones = v.new_ones((v.shape[0], 1))
    pad = -(v.shape[1] + 1) % 8 if v.dtype == torch.float64 else 0
    return torch.cat([v, ones, v.new_zeros((v.shape[0], pad))], 1)


def _rows_times(p, v_mm):
    """``p @ v_mm`` for :func:`product_values` ``v_mm``, each row rounded as in any other batch
    (see ``_scores.padded_rows``); every column of ``v_mm``. Weights ``p`` are taken to the
    values' dtype where it is wider (float64 values averaged at temperature inf or 0,
    ``_inputs.averaging_dtype``: weights 0 and 1, exact in either)."""
    if p.dtype != v_mm.dtype:
        p = p.to(v_mm.dtype)
    return (padded_rows(p) @ v_mm)[: p.shape[0]]


class TopK:
    """Blockwise top-k merge of a ranking ``r`` (and an optional companion ``aux``) per row."""

    def __init__(self, n_rows, k, like, with_aux=False):
        self.k = k
        self.r = torch.full((n_rows, k), NEG_INF, dtype=like.dtype, device=like.device)
        self.i = torch.full((n_rows, k), -1, dtype=torch.long, device=like.device)
        self.aux = torch.full_like(self.r, NEG_INF) if with_aux else None
        self.fresh = True

    def update(self, r, start, aux=None):
        if self.fresh and self.aux is None and r.shape[1] >= self.k:
            # the first block: its top k are the state (a merge with the empty state would
            # only repeat them; a single row's k-NN call has one block); -inf entries keep -1
            self.fresh = False
            self.r, pos = r.topk(self.k, dim=1)
            self.i = torch.where(self.r > NEG_INF, pos + start, -1)
            return
        self.fresh = False
        # Only rows whose block maximum beats their current k-th best can change; late blocks
        # rarely do, which makes the merge cheap.
        rows = (r.amax(1) > self.r[:, -1]).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        full = rows.numel() == r.shape[0]
        # index_select: half the time of advanced indexing for these row gathers
        sub = r if full else r.index_select(0, rows)
        val, pos = sub.topk(min(self.k, sub.shape[1]), dim=1)
        old_r = self.r if full else self.r.index_select(0, rows)
        old_i = self.i if full else self.i.index_select(0, rows)
        merged_r, order = torch.cat([old_r, val], 1).topk(self.k, dim=1)
        merged_i = torch.cat([old_i, pos + start], 1).gather(1, order)
        if self.aux is not None:
            sub_aux = aux if full else aux.index_select(0, rows)
            old_a = self.aux if full else self.aux.index_select(0, rows)
            merged_a = torch.cat([old_a, sub_aux.gather(1, pos)], 1).gather(1, order)
        if full:
            self.r, self.i = merged_r, merged_i
            if self.aux is not None:
                self.aux = merged_a
        else:
            self.r[rows], self.i[rows] = merged_r, merged_i
            if self.aux is not None:
                self.aux[rows] = merged_a


class Radius:
    """The radius prior: key j is kept for query i when f(q_i, k_j) <= r_ij**2, where r_ij is one
    number or ``max(query_radius[i], key_radius[j])``.

    Blocks hold partial scores ``s = ||q||^2 - f`` (see ``Scorer``), so the fast test is
    ``s >= ||q||^2 - r_ij**2`` (:meth:`threshold`). Only keys within the rounding margin of that
    threshold are settled on exact distances (``_exact.settle``), so a key at distance exactly
    ``r`` is always kept, as in scikit-learn. A ``lenient`` block keeps those keys unsettled
    (the k-NN selection settles its candidates itself, :meth:`inside`).
    """

    def __init__(self, radius=None, query_r=None, key_r=None):
        self.radius = radius
        if radius is not None:
            self.max_r2 = radius * radius
        else:
            self.query_r2, self.key_r2 = query_r * query_r, key_r * key_r
            self.query_r2_exact = query_r.double() ** 2
            self.key_r2_exact = key_r.double() ** 2
            self.max_r2 = float(torch.cat([self.query_r2_exact, self.key_r2_exact]).max())
        self._qoff = self._q_r2 = self._rows = None

    def start_block(self, scorer, q, q_raw, rows, budget, lenient=False):
        """Prepare the query rows ``rows`` (a slice or index tensor of the queries); ``q`` are
        their centred coordinates, ``q_raw`` the uncentred ones."""
        q = q.detach()
        self._scorer, self._q_raw, self._rows, self._budget = scorer, q_raw, rows, budget
        self._lenient = lenient
        eps = torch.finfo(q.dtype).eps
        self._margin = (scorer.margin(q) + 4 * eps * self.max_r2)[:, None]
        self._qoff = scorer.query_offset(q)[:, None]
        if self.radius is not None:
            self._qoff = self._qoff - self.radius**2
        else:
            self._q_r2 = self.query_r2[rows, None]

    def threshold(self, ks, ke):
        if self.radius is not None:
            return self._qoff
        return self._qoff - torch.maximum(self._q_r2, self.key_r2[None, ks:ke])

    def exact_r2(self, rows, keys):
        """``r_ij**2`` in float64 for block rows ``rows`` and key indices ``keys``."""
        if self.radius is not None:
            return self.radius**2
        q_r2 = self.query_r2_exact[self._rows][rows]
        return torch.maximum(q_r2, self.key_r2_exact[keys])

    def outside(self, s, ks, ke):
        """Boolean mask of the keys of a block of partial scores outside the radius."""
        excess = self.threshold(ks, ke) - s.detach()
        if self._lenient:
            return excess > self._margin

        def exact_excess(rows, cols):
            f = self._scorer.exact_pairs(self._q_raw, rows, cols + ks, self._budget)
            return f - self.exact_r2(rows, cols + ks)

        return settle(excess, self._margin, exact_excess)

    def inside(self, f, index):
        """Exact membership of candidates: exact ``f`` (b, m) of keys ``index`` (b, m)."""
        rows = torch.arange(f.shape[0], device=f.device)[:, None].expand_as(index)
        return f <= self.exact_r2(rows, index.clamp(min=0))

    def pair_bytes(self, item):
        """Extra scratch bytes per score entry: the excess block and its masks, and for
        per-point radii a threshold block."""
        return item + 3 + (0 if self.radius is not None else item + 1)

    def __str__(self):
        return f"radius={self.radius}" if self.radius is not None else "the per-point radii"


def score_pair_bytes(spec):
    """Scratch bytes per (query, key) entry of a score block: the block and its temporaries."""
    return pair_bytes(spec.queries.element_size(), spec.radius)


def pair_bytes(item, radius=None):
    """:func:`score_pair_bytes` of queries of ``item`` bytes per number and a ``radius``."""
    return 3 * item + 2 + (radius.pair_bytes(item) if radius else 0)


def query_index(spec, rows, device):
    """Query indices of the rows ``rows`` (a slice or an index tensor), as a column, for a
    callable prior (else ``None``)."""
    if spec.prior_fn is None:
        return None
    if isinstance(rows, slice):
        return torch.arange(rows.start, rows.stop, device=device)[:, None]
    return rows[:, None]


def mask_self(s, self_index, rows, ks, ke, inplace):
    """Set s[i, j] = -inf where key ks + j is the excluded index of query ``rows[i]``."""
    local = self_index[rows] - ks
    rows = ((local >= 0) & (local < ke - ks)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return s
    cols = local[rows]
    fill = torch.full((rows.numel(),), NEG_INF, dtype=s.dtype, device=s.device)
    return s.index_put_((rows, cols), fill) if inplace else s.index_put((rows, cols), fill)


def _masked(s, mask, inplace):
    return s.masked_fill_(mask, NEG_INF) if inplace else s.masked_fill(mask, NEG_INF)


def raw_scores(spec, q, rows, ks, ke, q_index, inplace, augmented=None):
    """Partial scores of a block (query rows ``rows``, a slice or an index tensor) with every
    mask applied (-inf), and the callable prior's bias (``augmented``: ``Scorer.block``'s)."""
    s = spec.scorer.block(q, ks, ke, augmented=augmented)
    if spec.radius is not None:
        s = _masked(s, spec.radius.outside(s, ks, ke), inplace)
    if spec.self_index is not None:
        s = mask_self(s, spec.self_index, rows, ks, ke, inplace)
    if spec.key_mask is not None:
        s = _masked(s, spec.key_mask[None, ks:ke], inplace)
    bias = None
    if spec.prior_fn is not None:
        k_index = torch.arange(ks, ke, device=s.device)[None, :]
        bias = call_prior_fn(spec.prior_fn, q_index, k_index, s)
        s = _masked(s, torch.isneginf(bias), inplace)
    return s, bias


def call_prior_fn(prior_fn, q_index, k_index, like):
    try:
        bias = prior_fn(q_index, k_index)
    except Exception as exc:
        raise ValueError(f"log_prior callable failed: {exc}") from exc
    bias = torch.as_tensor(bias, dtype=like.dtype, device=like.device)
    try:
        bias = torch.broadcast_to(bias, like.shape)
    except RuntimeError:
        raise ValueError(
            f"log_prior callable returned shape {tuple(bias.shape)}, not broadcastable to "
            f"{tuple(like.shape)}."
        ) from None
    if bool(torch.isnan(bias).any()) or bool((bias == math.inf).any()):
        raise ValueError("log_prior callable returned NaN or +inf; use -inf to mask.")
    return bias


def block_prior(prior_vec, bias, ks, ke, s):
    """Log-prior of a block as a tensor broadcastable to ``s`` (0 when there is none)."""
    prior = None if prior_vec is None else prior_vec[None, ks:ke]
    if bias is not None:
        prior = bias if prior is None else prior + bias
    if prior is None:
        prior = s.new_zeros((1, 1))
    return prior


def scaled(s, T):
    """s / T. With a learned temperature, masked (-inf) scores are kept out of the product:
    d(s/T)/dT is infinite there and 0 * inf would poison the gradient with NaN."""
    if not isinstance(T, torch.Tensor):
        return s * (1.0 / T)
    masked = torch.isneginf(s)
    return torch.where(masked, 0.0, s).div(T).masked_fill(masked, NEG_INF)


def empty_rows(normaliser, qs, on_empty, radius):
    """Rows whose softmax normaliser is 0 (every key masked): ValueError or a mask of them."""
    empty = normaliser <= 0
    if on_empty == "raise" and bool(empty.any()):
        rows = (empty.nonzero().squeeze(1) + qs).tolist()
        hint = f" within {radius}" if radius is not None else ""
        raise ValueError(
            f"{len(rows)} quer{'y has' if len(rows) == 1 else 'ies have'} no unmasked key{hint} "
            f"(first: {rows[:5]}); every key was removed by the masks or priors. Use a larger "
            "radius or fewer masks, or on_empty='zero'."
        )
    return empty


def cat_or_empty(parts, shape, like, dtype=None):
    if parts:
        return torch.cat(parts)
    return torch.zeros(shape, dtype=dtype or like.dtype, device=like.device)


def backend_result(outs, weights, indices, n_weights, values):
    """A backend's ``(out,)``, or ``(out, weights, indices)`` with ``n_weights``, from the parts
    of its query blocks."""
    out = cat_or_empty(outs, (0, values.shape[1]), values)
    if n_weights is None:
        return (out,)
    return (
        out,
        cat_or_empty(weights, (0, n_weights), out),
        cat_or_empty(indices, (0, n_weights), out, torch.long),
    )
