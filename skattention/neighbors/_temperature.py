"""``temperature="auto"`` of the fixed metric: the leave-one-out choice on a geometric grid
around the nearest-neighbour scale, and that scale (also the learned metrics' starting
temperature)."""

import numpy as np
import torch

from .._engine import (
    ComputeOverflowError,
    attention,
    budget_bytes,
    dtype_name,
    kneighbors,
    overflow_message,
    plan_rows,
)

# a geometric grid around the nearest-neighbour scale (weighted median squared distance from a
# point to its nearest distinct one)
_GRID = 2.0 ** np.arange(-3, 5)
MAX_QUERIES = 2000
_CANDIDATES = 8
# Queries whose candidate distances are gathered at once by the neighbour scale.
_SCALE_CHUNK = 256


def auto_temperature(keys, values, sample_weight, loo_loss, engine_kwargs):
    """Temperature with the lowest leave-one-out loss on a grid around the neighbour scale.

    Each training point (a subsample of at most ``MAX_QUERIES``) is predicted from the others
    with the estimator's own masks and sample weights (class weights are a prior applied
    afterwards, not a property of the geometry), and ``loo_loss(pred, rows, weight, values)`` is
    weighted by sample weight. Weights act as counts: leaving a point of weight ``w`` out
    keeps ``max(w - 1, 0)`` of it, so an integer weight is exactly a repeated point.
    ``engine_kwargs``: the estimator's attention arguments (metric, masks, device, dtype).
    """
    with np.errstate(divide="ignore"):
        log_weight = np.log(sample_weight)
    positive = np.flatnonzero(sample_weight > 0)
    if positive.size < 2:
        return 1.0
    if positive.size > MAX_QUERIES:
        positive = positive[np.linspace(0, positive.size - 1, MAX_QUERIES).astype(int)]
    scale = neighbor_scale(keys, positive, sample_weight, log_weight, engine_kwargs["device"],
                           engine_kwargs["dtype"], engine_kwargs["metric"])
    w = sample_weight[positive]
    # a point of weight w leaves one unit out (w - 1 of it stays; the whole point for w <= 1),
    # as repeating it w times and leaving one copy out would, in the k-NN prior's units too
    kwargs = dict(engine_kwargs, temperature=scale, log_prior=log_weight,
                  exclude_self=positive, leave_out="unit")
    best, best_loss = float(scale), np.inf
    for temperature in scale * _GRID:
        kwargs["temperature"] = float(temperature)
        try:
            pred = attention(keys[positive], keys, values, on_empty="zero", **kwargs)
        except ComputeOverflowError as exc:
            if not exc.by_temperature:
                raise
            raise _scale_overflow(scale, engine_kwargs["dtype"]).with_traceback(
                exc.__traceback__) from None
        loss = loo_loss(np.asarray(pred, dtype=np.float64), positive, w, values)
        if loss < best_loss:
            best, best_loss = float(temperature), loss
    return best


def _scale_overflow(scale, dtype):
    """The engine's overflow at the temperatures the neighbour ``scale`` calls for, in the
    estimator's terms: the engine's advice to raise the temperature misleads where the
    estimator chose it."""
    cause = (f"temperature='auto': attention in {dtype_name(dtype)} overflows at the "
             f"temperatures that the squared distances between neighbouring training points "
             f"(about {scale:.3g}) call for")
    advice = ["rescale the data (e.g. StandardScaler)"]
    if dtype != torch.float64:
        advice.append("pass dtype='float64'")
    return ValueError(overflow_message(cause, advice))


def neighbor_scale(Z, queries, sample_weight, log_weight, device, dtype=torch.float64,
                   metric="sqeuclidean"):
    """Weighted median of the pseudo-metric ``metric`` (the engine's name; by default the
    squared Euclidean distance) from ``Z[queries]`` to their nearest distinct key in ``Z``."""
    n_candidates = min(_CANDIDATES, int(np.sum(sample_weight > 0)) - 1)
    if n_candidates < 1:
        return 1.0
    f, idx = kneighbors(Z[queries], Z, n_candidates, metric=metric, log_prior=log_weight,
                        exclude_self=queries, device=device, dtype=dtype)
    if metric != "sqeuclidean":
        # the temperature is in units of f: the engine's exact f of the candidates (Manhattan,
        # Minkowski, cosine), not squared Euclidean distances; duplicates (0) are skipped
        f = np.asarray(f, dtype=np.float64)
        nearest = np.where((idx >= 0) & (f > 0), f, np.inf).min(1)
        return _median_of_finite(nearest, sample_weight[queries])
    # Exact distances on the candidates (duplicates are exactly 0 and skipped), in chunks so the
    # gathered candidates (and their differences) stay small.
    nearest = np.full(queries.size, np.inf)
    underflow = False
    chunk = plan_rows(queries.size, row_bytes=3 * 8 * n_candidates * Z.shape[1],
                      budget=budget_bytes(), max_rows=_SCALE_CHUNK)
    for start in range(0, queries.size, chunk):
        rows = slice(start, start + chunk)
        cand = idx[rows]
        diff = Z[queries[rows]][:, None, :].astype(np.float64) - Z[np.maximum(cand, 0)]
        d2 = np.einsum("ijk,ijk->ij", diff, diff)
        underflow |= bool(((d2 <= 0) & (cand >= 0) & (diff != 0).any(2)).any())
        d2[(cand < 0) | (d2 <= 0)] = np.inf
        nearest[rows] = d2.min(1)
    keep = np.isfinite(nearest)
    if underflow and not np.any(keep):
        # distinct points, yet every nearest distance 0: every weight would be equal, the
        # predictions the prior's, silently
        raise ValueError(
            "The squared distances between distinct points underflow float64 (coordinates "
            "of about 1e-160 or less): rescale the data (e.g. StandardScaler)."
        )
    return _median_of_finite(nearest, sample_weight[queries])


def _median_of_finite(nearest, weight):
    """Weighted median of the finite nearest values (1 where there are none)."""
    keep = np.isfinite(nearest)
    if not np.any(keep):
        return 1.0
    median = _weighted_median(nearest[keep], weight[keep])
    return float(median) if median > 0 else 1.0


def _weighted_median(values, weights):
    """Smallest value whose cumulative weight reaches half the total (repeats = weights)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return values[order][np.searchsorted(cum, 0.5 * cum[-1])]
