"""Softmax numerics of the attention backends (torch only): the online softmax over key
blocks, exponentials that flush negligible weights to 0, and the products of weights with
values that round a row alike in any batch.
"""

import functools
import math
import platform

import torch

from ._device import accumulation_dtype
from ._scores import NEG_INF, padded_rows

# Entries per vector of the widest exp kernel (AVX-512, float32); a multiple of the others.
_EXP_VECTOR = 16
# A running softmax sum above this is folded into the shift (OnlineSoftmax.add_shifted).
_LARGE_SUM = 2.0**20



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
        # sums in the values' dtype, which may be wider than the logits' (rows_times)
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
        block = rows_times(p, v)
        self.l = self.l * alpha + block[:, self.sums]
        self.o = self.o * alpha[:, None] + block
        self.m = new_m

    def add_counts(self, p, v):
        """Add a block of weights ``p`` taken as they are, unshifted (the uniform limit's
        counted key weights, ``_multiplicity.counts_prior``): each row's shift is 0 once it
        has a key."""
        block = rows_times(p, v)
        self.l = self.l + block[:, self.sums]
        self.o = self.o + block
        self.m = torch.where(self.l > 0, 0.0, self.m)

    def update_rows(self, rows, z, v):
        """:meth:`update` of the state's rows ``rows`` (indices or a slice) alone, with their
        block of logits ``z`` (overwritten)."""
        part = OnlineSoftmax.__new__(OnlineSoftmax)
        part.sums, part.m, part.l, part.o = self.sums, self.m[rows], self.l[rows], self.o[rows]
        part.update(z, v, inplace=True)
        self.m[rows], self.l[rows], self.o[rows] = part.m, part.l, part.o

    def add_shifted(self, z, v, redo):
        """Add a block of logits given less the running shift ``m`` and in base 2 (``(z - m) *
        LOG2E``, one product: :func:`shifted_logit_keys`), overwritten by its exponential
        (:func:`flushed_exp` in base 2): no max pass, no subtraction pass. A row whose block sum
        exceeds ``_LARGE_SUM`` (an entry above the shift by more than ``log(_LARGE_SUM)``, up
        to exp's overflow) is redone by
        :meth:`update` on the logits ``redo(rows)`` gives for those rows alone (each row's
        result depends on its own data only): its weights then stay at most 1, as in the plain
        path, so a weighted sum overflows no sooner than there. A row whose running sum grows
        large over several blocks folds it into its shift."""
        p = flushed_exp(z, inplace=z.shape[1] % _EXP_VECTOR == 0, base2=True)
        block = rows_times(p, v)
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

    def add_partials(self, m_parts, blocks, rows=slice(None)):
        """Add each row's partial softmaxes over parts of its keys (:func:`partial_softmax`)
        to the state's rows ``rows`` (a slice): ``m_parts`` (rows x parts) their largest
        logits, ``blocks`` (rows x parts x columns) their weighted values; the parts weighted
        by ``exp(m_part - m)`` and summed in part order (a row's result depends on its own
        parts alone)."""
        if m_parts.shape[1] == 0:
            return
        m = self.m[rows]
        new_m = torch.maximum(m, m_parts.amax(1))
        shift = torch.where(torch.isfinite(new_m), new_m, 0.0)
        alpha = batch_exp(m - shift)
        w = flushed_exp(m_parts - shift[:, None]).to(blocks.dtype)  # a -inf part weighs 0
        added = (blocks * w[:, :, None]).sum(1)
        self.l[rows] = self.l[rows] * alpha + added[:, self.sums]
        self.o[rows] = self.o[rows] * alpha[:, None] + added
        self.m[rows] = new_m

    def single(self, z, v):
        """The whole softmax at once, when one key block holds every key (fewer ops to
        differentiate than the streaming update)."""
        self.m = z.amax(1)
        empty = torch.isneginf(self.m)
        if not bool(empty.any()):  # the common case: fewer passes over the block
            self.o = rows_times(flushed_softmax(z, self.m), v)
            self.l = None  # every row's normaliser is 1: nothing to divide (a single-row call)
            return
        self.l = (~empty).to(z.dtype)
        # no NaN rows to differentiate
        p = flushed_softmax(torch.where(empty[:, None], 0.0, z), torch.where(empty, 0.0, self.m))
        self.o = torch.where(empty[:, None], 0.0, rows_times(p, v))

    def result(self):
        if self.l is None:
            return self.o
        return self.o / torch.where(self.l > 0, self.l, 1.0)[:, None]


def flush_below(dtype):
    """The log-weight (relative to a row's largest) under which every softmax here sets a
    weight to 0: far below the dtype's precision (such weights change no sum of a row's
    weights), far above its subnormal range (products of such weights with small gradients
    stay normal numbers)."""
    return -600.0 if dtype == torch.float64 else -60.0


def flushed_exp(z, inplace=False, base2=False):
    """``exp(z)`` of logits less their row's largest (or less a running shift at most that),
    with the weights at most ``exp(flush_below)`` set to 0; in place when ``inplace`` (the
    caller knows the rows fill whole exp vectors or need not be rounded alike in any batch),
    else as :func:`batch_exp`, rounded alike in any batch (:func:`flushed_softmax` for
    ``torch.softmax``, whose exponential is fast on ``-inf``). ``base2``: the logits are in
    base 2 (``z * LOG2E``) and their ``exp2`` is taken, several times faster than ``exp`` on
    some CPUs (docs/performance.md, "The training step's exponential"); a caller that computes
    its logits itself folds the factor into them.

    torch's ``exp`` is many times slower on arguments whose results are subnormal or 0 and on
    ``-inf`` than on normal ones, and so are products with subnormal weights
    (docs/performance.md, "Fit"): a sharp temperature puts many of a row's keys there. So the
    arguments are clamped a unit below the cut (their exponentials stay normal numbers), and
    the weights at most the cut's exponential are then zeroed: three fast passes whatever the
    values."""
    low = flush_below(z.dtype)
    clamp = (low - 1.0) * LOG2E if base2 else low - 1.0
    if inplace:
        z = z.clamp_min_(clamp)
        p = z.exp2_() if base2 else z.exp_()
    else:
        p = batch_exp(z.clamp_min(clamp), torch.exp2 if base2 else torch.exp)
    zero = torch.nn.functional.threshold if p.requires_grad else torch.nn.functional.threshold_
    return zero(p, math.exp(low), 0.0)


LOG2E = 1.4426950408889634  # log2(e): exp(z) = exp2(z * LOG2E)


def flushed_softmax(z, row_max):
    """``softmax(z, 1)`` of logits whose rows' largest entries are ``row_max`` (finite), with
    the weights below ``exp(flush_below)`` of a row's largest set to 0: their logits become
    ``-inf``, on which softmax's exponential is fast (``torch.exp`` is not: :func:`flushed_exp`).
    Otherwise the same numbers: softmax subtracts each row's largest itself, here 0."""
    shifted = z - row_max.detach()[:, None]
    return torch.softmax(torch.nn.functional.threshold_(shifted, flush_below(z.dtype), NEG_INF), 1)


def partial_softmax(z, v):
    """``(m, block)`` of a block of logits ``z`` (overwritten) over some of its rows' keys:
    each row's largest logit (``-inf`` where every key is masked) and :func:`rows_times` of
    its weights ``exp(z - m)`` with the :func:`product_values` ``v`` (the weight sums in their
    column of ones), for :meth:`OnlineSoftmax.add_partials`."""
    m, p = partial_weights(z)
    return m, rows_times(p, v)


def partial_weights(z):
    """``(m, p)`` of :func:`partial_softmax`: each row's largest logit of the block ``z``
    (overwritten) and the row's weights ``exp(z - m)``."""
    m = z.amax(1)
    shift = torch.where(torch.isfinite(m), m, 0.0)[:, None]
    return m, flushed_exp(z.sub_(shift), inplace=z.shape[1] % _EXP_VECTOR == 0)


def merged_partials(m_a, a, m_b, b):
    """``(m, block)``: the :func:`partial_softmax` of the same rows over the keys of two parts,
    ``(m_a, a)`` and ``(m_b, b)``, each rescaled to the larger of their largest logits."""
    m = torch.maximum(m_a, m_b)
    shift = torch.where(torch.isfinite(m), m, 0.0)
    w_a = flushed_exp(m_a - shift).to(a.dtype)[:, None]
    w_b = flushed_exp(m_b - shift).to(b.dtype)[:, None]
    return m, a * w_a + b * w_b


def batch_exp(x, exp=torch.exp):
    """``exp(x)`` (or ``exp2``) with every entry rounded as in any other batch: torch's
    vectorised ``exp`` leaves a tensor's last ``numel % vector`` entries to a scalar loop, which
    rounds differently, and which entries those are depends on the number of rows. Rows padded
    to whole vectors never have such a tail."""
    pad = -x.shape[-1] % _EXP_VECTOR
    if pad == 0:
        return exp(x)
    return exp(torch.nn.functional.pad(x, (0, pad)))[..., : x.shape[-1]]


def product_values(v):
    """Values (n, d) as :func:`rows_times` multiplies them, prepared once per call or per
    prepared keys: a column of ones appended (column ``d``: a product then also gives each
    row's weight sum, which :class:`OnlineSoftmax` reads there instead of summing its block in
    a pass of its own: docs/performance.md, "float64"), and zero columns up to a multiple of
    :func:`value_columns` (the kernel rounds a row alike in any batch only with whole
    vectors). Callers slice the first ``d`` columns off their results. Half-precision values
    are taken to float32 (``accumulation_dtype``): the weights' products and running sums then
    accumulate there, and the caller rounds its result to the values' dtype."""
    v = v.to(accumulation_dtype(v.dtype))
    ones = v.new_ones((v.shape[0], 1))
    pad = -(v.shape[1] + 1) % value_columns(v.dtype, v.device)
    return torch.cat([v, ones, v.new_zeros((v.shape[0], pad))], 1)


@functools.cache
def value_columns(dtype, device):
    """The multiple of columns values of ``dtype`` are padded to for products on ``device``.
    float64: 8 (MKL's AVX-512 kernel rounds a row alike in any batch only with whole vectors
    of 8 columns). On AMD processors MKL runs its AVX2 kernel: there every multiple of 4
    columns rounds a row alike (and, in float32, 5-7 and 9-11 columns do not), and 12 float64
    or 16 float32 columns multiply two to three times faster than fewer
    (docs/performance.md, "Float64 values on AMD"). Else 1 (float32 as it is)."""
    amd = (device.type == "cpu" and platform.machine().lower() in ("x86_64", "amd64")
           and "AuthenticAMD" in _cpu_vendor())
    if dtype == torch.float64:
        return 12 if amd else 8
    return 16 if amd and dtype == torch.float32 else 1


def _cpu_vendor():
    """The CPU's vendor string (Linux's ``/proc/cpuinfo``, else the platform's), or ``""``."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def rows_times(p, v_mm):
    """``p @ v_mm`` for :func:`product_values` ``v_mm``, each row rounded as in any other batch
    (see ``_scores.padded_rows``); every column of ``v_mm``. Weights ``p`` are taken to the
    values' dtype where it is wider (float64 values averaged at temperature inf or 0,
    ``_inputs.averaging_dtype``: weights 0 and 1, exact in either)."""
    if p.dtype != v_mm.dtype:
        p = p.to(v_mm.dtype)
    return (padded_rows(p) @ v_mm)[: p.shape[0]]
