"""AttentionKMeans' points as the engine takes them: dense arrays, and CSR matrices never
densified beyond the working-memory budget.

A CSR matrix goes to the engine as its :class:`RowBlocks`, which the k-means loops read in dense
blocks sized by the engine's planner, with the data mean subtracted from each block (as the
dense fit subtracts it from a centred copy). Its column means and variances are summed here
block by block in the order NumPy sums the dense array's, so that a fit on a CSR matrix
computes, bit for bit, what the fit on the same matrix held dense computes.
"""

import numpy as np
import torch
from scipy import sparse

from .._engine import RowBlocks, budget_bytes, plan_rows
from ..utils._sklearn_compat import _check_sample_weight


def check_distance_range(X):
    """Reject values whose squared Euclidean distances overflow X's dtype (inf distances)."""
    if X.size:  # a sparse matrix: its stored values (the others are zeros)
        limit = np.sqrt(np.finfo(X.dtype).max / X.shape[1]) / 2
        largest = max(float(X.max()), -float(X.min()))  # no |X| copy (working_memory)
        if largest > limit:
            raise ValueError(
                f"X contains values too large for squared Euclidean distances in {X.dtype} "
                f"(largest magnitude {largest:.3g}, limit {limit:.3g}): they overflow to "
                "infinity; rescale the data."
            )
    return X


def column_ranges(X):
    """Each column's largest value less its smallest, in float64 (dense or CSR ``X``; ``None``
    for no row)."""
    if not X.shape[0]:
        return None
    if sparse.issparse(X):
        top, bottom = X.max(axis=0).toarray().ravel(), X.min(axis=0).toarray().ravel()
    else:
        top, bottom = X.max(0), X.min(0)
    with np.errstate(over="ignore"):  # inf: beyond float64, as the distances would be
        return top.astype(np.float64) - bottom.astype(np.float64)


def check_soft_temperature(T, ranges, dtype):
    """Reject a fixed temperature ``T`` at which the soft steps' scores overflow ``dtype``
    (garbage centroids in float64, an error inside torch in float32): on the centred points
    they reach ``3 max ||x - mean||^2 / T``, at most ``3 sum_j range_j^2 / T`` (the columns'
    ``ranges``, :func:`column_ranges`: points far from the origin with a modest spread are
    fine), and the steps multiply by ``2 / T``. ``T``: ``None`` (annealing) or 0 (Lloyd) need
    no check, nor ``ranges=None`` (no point)."""
    if not T or ranges is None:
        return
    with np.errstate(over="ignore"):
        bound = max(3.0 * float(np.sum(ranges * ranges)) / T, 2.0 / np.float64(T))
    if bound > float(np.finfo(dtype).max):
        widen = ", pass X as float64" if dtype != np.float64 else ""
        reach = f", up to about {bound:.3g}" if np.isfinite(bound) else ""
        raise ValueError(
            f"temperature={T:.3g} is too small for X's scale in {np.dtype(dtype)}: the soft "
            f"assignments' scores (squared distances / temperature{reach}) overflow it; use "
            f"temperature=0 (Lloyd's hard assignments, the limit of small temperatures){widen} "
            "or rescale the data."
        )


def soft_assignment_advice(dtype):
    """What to do about an overflow of the soft assignments in ``dtype`` (for
    :func:`~skattention.utils._validation.overflow_advice`), in AttentionKMeans' terms (the
    engine's advice names a ``dtype`` option)."""

    def advise(exc):
        advice = ["rescale the data"]
        if exc.by_temperature:
            advice.append("pass a larger temperature to soft_assignments")
        if dtype != torch.float64:
            advice.append("pass X as float64 (the attention computes in float64 when X is)")
        return advice

    return advise


def checked_sample_weight(sample_weight, X):
    """``(weights, exponent)``: ``sample_weight`` as KMeans checks it (one non-negative number
    per point, in ``X``'s dtype, ``None``: ones; not all zero), in units of ``2**exponent``: 0
    unless the weights sum beyond ``2**32``, when they are scaled (exactly) to a sum below 1.
    The centroids depend on their ratios only, and weights that large made the weighted sums
    overflow (garbage centroids; k-means++ failed inside NumPy on an infinite sum)."""
    sample_weight = _check_sample_weight(sample_weight, X, dtype=X.dtype, ensure_non_negative=True)
    if not np.any(sample_weight > 0):
        raise ValueError("Sample weights must contain at least one non-zero number: all are zero.")
    with np.errstate(over="ignore"):
        total = float(sample_weight.sum(dtype=np.float64))
    exponents = weight_exponents(total, sample_weight.max(),
                                 lambda first: scaled_weights(sample_weight, first).sum(
                                     dtype=np.float64))
    if exponents is None:
        return sample_weight, 0
    return scaled_weights(sample_weight, *exponents).astype(X.dtype, copy=False), sum(exponents)


def weight_exponents(total, largest, scaled_sum):
    """``(first, shift)``, the exact steps of :func:`checked_sample_weight`'s scaling of
    weights summing to ``total``, or ``None`` within ``2**32``: ``2**-first`` takes the
    ``largest`` weight below 1, then ``2**-shift`` their sum (which may have overflowed
    before), ``scaled_sum(first)`` (the weights' sum after the first step)."""
    if total <= 2.0**32:
        return None
    first = int(np.frexp(largest)[1])
    return first, int(np.frexp(scaled_sum(first))[1])


def scaled_weights(w, first, shift=0):
    """Weights ``w`` times ``2**-(first + shift)``, in the two exact steps."""
    return np.ldexp(np.ldexp(w, -first), -shift)


def as_tensor(X, device, dtype=None):
    """A dense array as a tensor, a CSR matrix as the engine's :class:`RowBlocks`, on
    ``device``."""
    if not sparse.issparse(X):
        return torch.from_numpy(np.ascontiguousarray(X)).to(device, dtype)
    indptr, indices = (torch.from_numpy(a).to(device) for a in (X.indptr, X.indices))
    values = torch.from_numpy(X.data).to(device, dtype)
    return RowBlocks.from_csr(indptr, indices, values, X.shape[1])


def dense_blocks(X, row_bytes=0):
    """The rows of the sparse matrix ``X`` as dense arrays, each block with ``row_bytes`` of
    scratch per row besides itself within the working-memory budget."""
    n, d = X.shape
    rows = plan_rows(n, row_bytes=row_bytes + d * X.dtype.itemsize, budget=budget_bytes())
    for start in range(0, n, rows):
        yield X[start : start + rows].toarray()


def column_moments(X, variance=True):
    """``(mean, mean_variance)``: the column means of ``X`` and the mean of its column variances
    (``None`` without ``variance``), bit for bit ``X.mean(axis=0)`` and
    ``np.mean(np.var(X, axis=0))`` of the dense array, also for a sparse ``X``."""
    if not sparse.issparse(X) or X.shape[1] == 1:
        # one column: NumPy sums it pairwise, which needs it whole (n numbers, as the weights)
        dense = X.toarray() if sparse.issparse(X) else X
        return dense.mean(axis=0), np.mean(np.var(dense, axis=0)) if variance else None
    n = np.intp(X.shape[0])
    mean = _column_sums(X)
    np.true_divide(mean, n, out=mean, casting="unsafe")  # as NumPy's mean divides
    if not variance:
        return mean, None
    squares = _column_sums(X, mean)
    return mean, np.mean(np.true_divide(squares, n, out=squares, casting="unsafe"))


def _column_sums(X, mean=None):
    """Column sums over the dense row blocks of ``X`` (with ``mean``: of the squared
    deviations, computed in place as ``np.var`` computes them). NumPy sums the rows of a
    C-ordered matrix one after the other along axis 0; continuing the running sum as the first
    row of the next block gives the same sum, to the bit."""
    total = None
    # scratch per row besides the block: its copy under the running sum
    for block in dense_blocks(X, row_bytes=X.shape[1] * X.dtype.itemsize):
        if mean is not None:
            np.multiply(np.subtract(block, mean, out=block), block, out=block)
        total = block.sum(axis=0) if total is None else np.concatenate([total[None], block]).sum(0)
    return total
