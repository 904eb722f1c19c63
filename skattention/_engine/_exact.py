"""Exact selection: decisions on exact distances, ties broken by the lower key index.

Blocks hold fast scores (one matmul on centred coordinates, ``PreparedKeys.block``), rounded in
the compute dtype. Every selection the engine makes (top-k membership, radius membership, the
arg-max of ``T = 0``) is decided on them only where rounding cannot change it: a fast value more
than ``PreparedKeys.margin`` away from the decision threshold is clearly on its side; the others
are settled on exact values of ``f`` (float64 differences of the uncentred coordinates), and
exact ties go to the lower key index, scikit-learn's rule. Decisions therefore depend neither on
the block sizes nor on how the queries are batched.
"""

import torch


def settle(excess, margin, exact_excess):
    """Boolean mask of ``exact excess > 0`` from fast values ``excess`` whose rounding error is
    at most ``margin`` (broadcastable to ``excess``).

    Entries within ``margin`` of 0 get ``exact_excess(rows, cols)`` (float64, the exact values
    at those positions); the rest are decided on their fast values.
    """
    out = excess > margin
    near = (excess.abs() <= margin).nonzero(as_tuple=True)
    if near[0].numel():
        out[near] = exact_excess(*near) > 0
    return out


def sort_exact(f, index, k):
    """The first ``k`` columns of each row in (``f``, index) order: ``(f, index)`` sorted,
    ``inf`` / ``-1`` entries last. Stable: equal values keep the lower index first."""
    n_keys_bound = torch.iinfo(torch.long).max
    by_index = torch.sort(torch.where(index >= 0, index, n_keys_bound), dim=1).indices
    f, index = f.gather(1, by_index), index.gather(1, by_index)
    order = torch.sort(f, dim=1, stable=True).indices[:, :k]
    f, index = f.gather(1, order), index.gather(1, order)
    return f, torch.where(torch.isfinite(f), index, -1)


def merge_exact(best_f, best_i, cand_f, cand_i):
    """Merge candidates ``(cand_f, cand_i)`` (rows x n, exact values and key indices; ``inf``
    / ``-1`` for padding) into running ``(best_f, best_i)`` sorted by (f, index).

    Every candidate's index must exceed the indices already in ``best`` and increase along its
    row (keys visited in order): a stable sort of ``[best, candidates]`` then keeps exact ties
    in index order.
    """
    k = best_f.shape[1]
    cat_f = torch.cat([best_f, cand_f], 1)
    cat_i = torch.cat([best_i, cand_i], 1)
    order = torch.sort(cat_f, dim=1, stable=True).indices[:, :k]
    best_f = cat_f.gather(1, order)
    return best_f, torch.where(torch.isfinite(best_f), cat_i.gather(1, order), -1)


def row_packed(rows, n_rows, *columns, fill):
    """Entries given as ``(rows[n], columns[c][n])`` (``rows`` ascending, as ``nonzero`` gives
    them) packed into ``n_rows x width`` tensors, each row's entries first in their order and
    then ``fill[c]``; ``width`` is the largest count of a row."""
    counts = torch.bincount(rows, minlength=n_rows)
    width = int(counts.max()) if rows.numel() else 0
    slot = torch.arange(rows.numel(), device=rows.device) - (torch.cumsum(counts, 0) - counts)[rows]
    at = rows * width + slot  # flat positions: index_copy_ costs less than advanced indexing
    packed = []
    for values, value in zip(columns, fill, strict=True):
        out = values.new_full((n_rows, width), value)
        out.view(-1).index_copy_(0, at, values)
        packed.append(out)
    return packed
