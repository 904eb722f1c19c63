"""The Nyström extension of the k-NN operator: attention of new points to the training points
adjacent to them in the symmetric k-NN graph, in memory-bounded blocks of queries.

A new point ``x`` is adjacent to the training point ``x_j`` when ``||x - x_j|| <= max(r(x),
r_j)`` (``r``: distance to the k-th nearest training point, with a relative slack). The engine's
radius-masked attention decides this exactly but scores every training point for every query;
here each query's candidates are its ``m`` nearest training points (the engine's exact
selection) and those of the 1% of training points with the widest balls whose balls hold it
(found by ball queries at low dimension, all of them above), which hold every adjacent point as
soon as the ``m``-th distance exceeds both radii left to check: ``m`` doubles for the rows where
it does not. The work is then about ``n_queries * m`` instead of ``n_queries * n_train``.
"""

import itertools

import numpy as np
from scipy.spatial import cKDTree

from .._engine import budget_bytes, kneighbors, plan_rows, prepare_keys, track

# Training points whose k-NN balls are the widest, checked for every query: 1% of them, at least
# 1,024 (without them a single outlier's wide ball would send every query's candidate search to
# the whole training set; with them, the other radii are at most the 99th percentile's, which
# a few k nearest exceed where the density varies little).
_WIDE_FRACTION = 0.01
_MIN_WIDE_KEYS = 1024
# First candidate count, in multiples of n_neighbors, and bytes per candidate and row (distances,
# indices, logits, mask, weights) besides the gathered values.
_FIRST_CANDIDATES = 3
_CANDIDATE_BYTES = 48
# Dimensions up to which the wide points adjacent to a query are found by ball queries on a
# k-d tree of the queries (above, pruning fades: every wide point is scored), and the relative
# widening of those balls (above the tree's rounding; the adjacency is decided on the exact
# distances).
_TREE_DIMS = 8
_BALL_SLACK = 1e-9


def knn_nystrom(Z, fit_Z, values, *, n_neighbors, epsilon, log_prior, radius, slack, device,
                progress=False):
    """``sum_j S(x, x_j) values_j`` for each row ``x`` of ``Z`` under the k-NN operator.

    ``radius``: each training point's distance to its k-th nearest; ``log_prior``: the
    attention's ``-alpha log q_j``; ``slack``: the relative widening of both radii (so that
    ``Z = fit_Z`` reproduces the fitted graph despite rounding).
    """
    n_train = fit_Z.shape[0]
    keys = prepare_keys(fit_Z, device=device, dtype="float64")
    key_radius = radius * (1 + slack)
    order = np.argsort(key_radius, kind="stable")
    n_wide = max(_MIN_WIDE_KEYS, int(_WIDE_FRACTION * n_train))
    wide = order[max(0, n_train - n_wide):]
    wide_position = np.full(n_train, -1)  # each training point's place among the wide ones
    wide_position[wide] = np.arange(len(wide))
    # every training point not among the wide ones has a radius of at most cut
    cut = key_radius[order[n_train - len(wide) - 1]] if len(wide) < n_train else 0.0
    first = min(n_train, _FIRST_CANDIDATES * n_neighbors)
    width = _CANDIDATE_BYTES + 8 * values.shape[1]
    row_bytes = (first + len(wide)) * width + 8 * Z.shape[1] * (len(wide) + 1)
    rows = plan_rows(Z.shape[0], row_bytes=row_bytes, budget=budget_bytes())
    context = dict(fit_Z=fit_Z, keys=keys, values=values, n_neighbors=n_neighbors,
                   epsilon=epsilon, log_prior=log_prior, key_radius=key_radius, wide=wide,
                   wide_position=wide_position, cut=cut, first=first, slack=slack, device=device)
    out = np.empty((Z.shape[0], values.shape[1]))
    starts = range(0, Z.shape[0], rows)
    for start in track(starts, progress, desc="Nystrom", unit="block"):
        out[start : start + rows] = _block(Z[start : start + rows], **context)
    return out


def _block(Zb, *, fit_Z, keys, values, n_neighbors, epsilon, log_prior, key_radius, wide,
           wide_position, cut, first, slack, device):
    """The extension of one block of queries, ``m`` doubling for the rows that need it."""
    n_train = fit_Z.shape[0]
    out = np.empty((Zb.shape[0], values.shape[1]))
    todo, m = np.arange(Zb.shape[0]), first
    while todo.size:
        d2, idx = kneighbors(Zb[todo], keys, m, device=device, dtype="float64")
        query_radius = np.sqrt(d2[:, n_neighbors - 1]) * (1 + slack)
        # keys beyond the m nearest are at least the m-th distance away: farther than both
        # the query's own radius and that of every training point but the wide ones
        complete = (m >= n_train) | (d2[:, -1] > np.maximum(query_radius, cut) ** 2)
        done = todo[complete]
        out[done] = _average(Zb[done], d2[complete], idx[complete], query_radius[complete],
                             fit_Z, values, epsilon, log_prior, key_radius, wide, wide_position)
        todo, m = todo[~complete], min(n_train, 2 * m)
    return out


def _average(Zq, d2, idx, query_radius, fit_Z, values, epsilon, log_prior, key_radius, wide,
             wide_position):
    """Softmax-weighted average of ``values`` over each query's adjacent candidates: its nearest
    (``d2``, ``idx``, less the wide keys) and the wide keys that can be adjacent to it (exact
    distances by differences)."""
    wide_d2, wide_idx = _wide_candidates(Zq, idx, fit_Z, key_radius, wide, wide_position)
    d2 = np.concatenate([np.where(wide_position[idx] >= 0, np.inf, d2), wide_d2], axis=1)
    idx = np.concatenate([idx, wide_idx], axis=1)
    adjacent = d2 <= np.maximum(query_radius[:, None], key_radius[idx]) ** 2
    logits = np.where(adjacent, -d2 / epsilon + log_prior[idx], -np.inf)
    logits -= logits.max(1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(1, keepdims=True)
    return np.einsum("ij,ijc->ic", weights, values[idx])


def _wide_candidates(Zq, idx, fit_Z, key_radius, wide, wide_position):
    """``(d2, idx)``, rows padded with ``inf`` / 0: the squared distances and indices of the
    wide training points that can be adjacent to each query, those among its nearest ``idx``
    (within its own radius) and those whose ball holds it. At up to ``_TREE_DIMS`` dimensions a
    k-d tree of the queries finds the latter (a ball query per wide point); above, every wide
    point is a candidate."""
    n_q, n_wide = Zq.shape[0], len(wide)
    if Zq.shape[1] <= _TREE_DIMS and n_q:
        among_nearest = wide_position[idx]
        rows, cols = np.nonzero(among_nearest >= 0)
        balls = cKDTree(Zq).query_ball_point(fit_Z[wide], key_radius[wide] * (1 + _BALL_SLACK))
        lengths = np.fromiter(map(len, balls), dtype=np.int64, count=n_wide)
        in_ball = np.fromiter(itertools.chain.from_iterable(balls), dtype=np.int64,
                              count=int(lengths.sum()))
        pairs = np.unique(np.concatenate([
            rows * n_wide + among_nearest[rows, cols],
            in_ball * n_wide + np.repeat(np.arange(n_wide), lengths)]))
        rows, cols = pairs // n_wide, pairs % n_wide
    else:
        rows, cols = np.repeat(np.arange(n_q), n_wide), np.tile(np.arange(n_wide), n_q)
    diff = Zq[rows] - fit_Z[wide[cols]]
    found_d2 = np.einsum("ij,ij->i", diff, diff)
    counts = np.bincount(rows, minlength=n_q)
    width = int(counts.max()) if rows.size else 0
    slot = np.arange(rows.size) - (np.cumsum(counts) - counts)[rows]
    d2 = np.full((n_q, width), np.inf)
    out_idx = np.zeros((n_q, width), dtype=np.int64)
    d2[rows, slot], out_idx[rows, slot] = found_d2, wide[cols]
    return d2, out_idx
