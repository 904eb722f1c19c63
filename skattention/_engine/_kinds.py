"""The metric kinds of the engine: their names (the one table), the value of ``f`` at a
distance, and the exact float64 values of pairs for the kinds that are not a matrix product
(Minkowski's, cosine). ``PreparedKeys`` (``_scores.py``) computes their blocks."""

import numbers

import torch

from ._parallel import one_thread

# The one table of metric names. Scores the engine computes (``attention(metric=...)``;
# Minkowski's as ``("minkowski", p)``):
ENGINE_METRICS = ("sqeuclidean", "euclidean", "dot", "manhattan", "cosine")
# Engine metrics whose keys are selected on squared Euclidean distances (k-NN, radius, T = 0).
DISTANCE_KINDS = ("sqeuclidean", "euclidean")
# Engine metrics computed from the coordinates' differences, not a matrix product:
# f = sum_j |q_j - k_j|^p (no centring, no augmented keys; ``torch.cdist`` blocks).
PAIRWISE_KINDS = ("manhattan", "minkowski")
# Pseudo-metrics learned end to end (``_maps.py``; the estimators and ``skattention.nn``) ->
# the engine score between the mapped inputs:
LEARNED_METRICS = {"mlp": "sqeuclidean", "linear": "sqeuclidean", "dot": "dot",
                   "tabular": "euclidean"}
# The metric estimators' ``metric``: the fixed ones and the learned ones (``"minkowski"``:
# ``("minkowski", p)`` with the estimator's ``p``).
METRICS = {"euclidean": "sqeuclidean", "manhattan": "manhattan", "cosine": "cosine",
           "minkowski": "minkowski", **LEARNED_METRICS}


def metric_kind(metric):
    """``(kind, p)`` of an engine metric: one of ``ENGINE_METRICS``, ``("minkowski", p)``
    with ``1 <= p < inf`` (``f = sum |q_j - k_j|^p``), or a callable (squared Euclidean
    distances between its images)."""
    if callable(metric):
        return "sqeuclidean", 2.0
    if isinstance(metric, tuple) and len(metric) == 2 and metric[0] == "minkowski":
        p = metric[1]
        if (isinstance(p, bool) or not isinstance(p, numbers.Real)
                or not 1 <= float(p) < float("inf")):
            raise ValueError(f"Minkowski's p must be a finite number >= 1, got {p!r}.")
        return "minkowski", float(p)
    if isinstance(metric, str) and metric in ENGINE_METRICS:
        return metric, 1.0 if metric == "manhattan" else 2.0
    raise ValueError(
        f"metric={metric!r} is not supported; use one of {ENGINE_METRICS}, "
        f"('minkowski', p) or a callable."
    )


def f_of_distance(kind, p, r):
    """The value of ``f`` of metric ``kind`` (Minkowski's ``p``) at distance ``r``."""
    if kind in DISTANCE_KINDS:
        return r**2
    return r**p if kind == "minkowski" else r


def unit_rows(x):
    """Rows of ``x`` divided by their Euclidean norms (zero rows stay zero), as scikit-learn's
    ``normalize`` makes them for the cosine distance."""
    norms = torch.sqrt((x * x).sum(1, keepdim=True))
    return x / torch.where(norms > 0, norms, 1.0)


def cosine_distances_of_pairs(q, k):
    """``1 - cos(q, k)`` of float64 rows (broadcast over the last dimension), in [0, 2].

    The cosine's square is one quotient of products, ``(q.k)^2 / (|q|^2 |k|^2)``, before a
    single root: rows in proportion (duplicates, scaled copies) are at distance exactly 0,
    and integer rows at mathematically equal angles tie exactly (one correctly rounded quotient
    of equal integers; a root of each norm would round them apart). A zero row is at distance
    1 (scikit-learn's ``normalize`` leaves it zero)."""
    dot = (q * k).sum(-1)
    norms_sq = (q * q).sum(-1) * (k * k).sum(-1)
    cos = torch.copysign(torch.sqrt(dot * dot / torch.where(norms_sq > 0, norms_sq, 1.0)), dot)
    return (1.0 - cos).clamp_(0.0, 2.0)


def exact_f_of_pairs(kind, p, q, k):
    """The exact float64 ``f`` of rows ``q`` and ``k`` (broadcast over the last dimension) of
    a distance kind: squared Euclidean, ``sum |q_j - k_j|^p``, or ``1 - cos``."""
    if kind in DISTANCE_KINDS:
        diff = q - k
        if 0 < diff.shape[-1] <= SEQUENTIAL_DIMS:
            return sequential_squares(diff, inplace=not diff.requires_grad)
        return (diff * diff).sum(-1)
    if kind in PAIRWISE_KINDS:
        return power_sums(q - k, p)
    return cosine_distances_of_pairs(q, k)


# Dimensions up to which a squared distance is summed term by term, in order, whatever the
# layout: as scikit-learn's k-d and ball trees sum it, its neighbours' default search up to 15
# features, so that distances and the ranks of near ties are theirs to the bit (torch's sum
# over more than 3 terms adds them in vector lanes).
SEQUENTIAL_DIMS = 15


def sequential_squares(diff, dim=-1, inplace=False):
    """``((d_0^2 + d_1^2) + d_2^2) + ...`` of the differences ``diff`` along ``dim``, each
    square rounded before its addition (separate kernels: no fused multiply-add), whatever
    the layout. ``inplace``: ``diff`` is overwritten."""
    sq = diff.mul_(diff) if inplace else diff * diff
    f = sq.select(dim, 0)
    for j in range(1, sq.shape[dim]):
        f = f + sq.select(dim, j) if j == 1 else f.add_(sq.select(dim, j))
    return f


def power_sums(diff, p):
    """``sum_j |diff_j|^p`` over the last dimension."""
    diff = diff.abs()
    if p == 1.0:
        return diff.sum(-1)
    if p == 2.0:
        return (diff * diff).sum(-1)
    return _uniform_pow(diff, p).sum(-1)


# Elements of a whole number of the widest CPU vectors, twice (torch's vectorised loops take
# two vectors a step).
_WHOLE_VECTORS = 64


def _uniform_pow(x, p):
    """``x ** p`` with every element through the same code. On the CPU torch's vectorised
    ``pow`` and the scalar one of a loop's tail (of the whole tensor, or of a thread's share)
    may round the same number apart, which would make a key's exact distance depend on its
    place in a block: the elements are padded to whole vectors and taken on one thread."""
    if x.device.type != "cpu" or x.requires_grad:
        return x.pow(p)
    flat = x.reshape(-1)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % _WHOLE_VECTORS), value=1.0)
    with one_thread():
        return padded.pow_(p)[: flat.numel()].view(x.shape)
