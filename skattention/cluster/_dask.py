"""AttentionKMeans.fit on a Dask array: the E and M steps as per-partition sums.

Each iteration runs the engine's ``kmeans_step`` on every partition on its worker (the points
centred by the data mean, as the in-memory fit centres them), sends back the per-centroid sums
and masses (k x d numbers) and how many labels changed, and the client adds them up and moves
the centroids, as ``lloyd`` (``temperature=0``) or ``soft_kmeans`` (``temperature > 0``) do
over all points at once, in the engine's iteration loop, and the runs are those of the
in-memory fit (``_runs.py``). The points and their labels stay on the workers. Initial centroids
from ``"k-means++"``, ``"random"`` or a callable are drawn from a sample of the partitions;
``temperature="auto"`` (annealing) needs all points at once and is not run on Dask arrays.
"""


import numpy as np
import torch
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, validate_data

from .._engine import heaviest_fill, iterate_centers, kmeans_inertia, kmeans_step
from ..utils._dask import aligned_blocks, row_blocks
from ._init import checked_init, initial_centers, resolve_n_init
from ._inputs import (
    check_distance_range,
    check_soft_temperature,
    scaled_weights,
    weight_exponents,
)
from ._runs import Run, best_run, warn_if_fewer_clusters

# Rows drawn from the partitions for the initial centroids.
_SAMPLE_ROWS = 65536


def fit(estimator, X, sample_weight):
    """Fit ``estimator`` (an AttentionKMeans) on the Dask array ``X``."""
    import dask

    if isinstance(estimator.temperature, str):
        raise ValueError(
            "AttentionKMeans on a Dask array needs a numeric temperature (0 for Lloyd's "
            "k-means): temperature='auto' (annealing) needs all points at once."
        )
    columns = None
    if hasattr(X, "to_dask_array"):
        columns = X.columns
        X = X.to_dask_array(lengths=True)
    dtype = X.dtype if X.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    template = np.empty((0, X.shape[1]), dtype=dtype)
    if columns is not None:  # a DataFrame's column names: feature_names_in_, as in memory
        import pandas as pd

        template = pd.DataFrame(template, columns=columns)
    validate_data(estimator, template, ensure_min_samples=0)
    blocks, lengths = row_blocks(X)
    n = sum(lengths)
    if n < estimator.n_clusters:
        raise ValueError(f"n_samples={n} should be >= n_clusters={estimator.n_clusters}.")
    w_blocks = aligned_blocks(sample_weight, lengths, "sample_weight")
    parts = dask.persist(*[dask.delayed(_checked, nout=2)(b, w, dtype)
                           for b, w in zip(blocks, w_blocks, strict=True)])
    stats = dask.compute([dask.delayed(_moments)(p) for p in parts])[0]
    total_weight = sum(s[0] for s in stats)
    if not total_weight > 0:
        raise ValueError("Sample weights must contain at least one non-zero number: all are zero.")
    parts, weight_exponent = _weights_in_range(parts, total_weight, max(s[2] for s in stats))
    mean = (sum(s[1] for s in stats) / n).astype(dtype)
    T = float(estimator.temperature)
    if T:  # the in-memory fit's check, from the partitions' column ranges
        extremes = [e for e in dask.compute([dask.delayed(_extremes)(p) for p in parts])[0]
                    if e is not None]
        with np.errstate(over="ignore"):
            ranges = np.max([e[0] for e in extremes], 0) - np.min([e[1] for e in extremes], 0)
        check_soft_temperature(T, ranges, dtype)
    tol = 0.0
    if estimator.tol > 0:
        squares = dask.compute([dask.delayed(_squares)(p, mean) for p in parts])[0]
        tol = float(np.mean(sum(squares) / n) * estimator.tol)

    init = checked_init(estimator.init, estimator.n_clusters, X.shape[1], dtype)
    if isinstance(init, np.ndarray):
        init = init - mean
    rng = check_random_state(estimator.random_state)
    sample = None

    def run_once(on_iteration):
        nonlocal sample
        if isinstance(init, np.ndarray):
            centers = init
        else:
            if sample is None:
                sample = _sample(parts, lengths, rng, mean)
            centers = initial_centers(init, estimator.n_clusters, sample[0], rng, sample[1])
        return _run(parts, np.ascontiguousarray(centers, dtype=dtype), mean, T,
                    estimator.max_iter, tol, on_iteration)

    best, stopped = best_run(estimator, resolve_n_init(estimator.n_init, init, T), run_once,
                             fitted_centers=lambda centers: centers + mean,
                             kind="Lloyd" if not T else "soft",
                             weight_exponent=weight_exponent)
    warn_if_fewer_clusters(int(np.count_nonzero(best.counts)), estimator.n_clusters)
    estimator.cluster_centers_ = np.ascontiguousarray(best.centers + mean)
    estimator.labels_ = best.labels
    with np.errstate(over="ignore"):  # in units of the weights': 2**weight_exponent
        estimator.inertia_ = float(np.ldexp(float(best.inertia), weight_exponent))
    estimator.n_iter_ = int(best.n_iter)
    estimator.stopped_by_callback_ = stopped
    estimator.temperature_ = T
    return estimator


def _checked(X, sample_weight, dtype):
    """A partition as the in-memory fit validates it, and its weights."""
    # a partition may be empty (a filter); the fit checked the total number of rows
    X = check_distance_range(check_array(X, dtype=dtype, order="C", ensure_min_samples=0))
    if sample_weight is None:
        return X, np.ones(X.shape[0], dtype=dtype)
    w = check_array(sample_weight, ensure_2d=False, dtype=dtype, ensure_min_samples=0)
    if w.shape != (X.shape[0],) or np.any(w < 0):
        raise ValueError("sample_weight must be non-negative, one per row of X.")
    return X, w


def _moments(part):
    X, w = part
    with np.errstate(over="ignore"):
        total = float(w.sum(dtype=np.float64))
    return total, X.sum(0, dtype=np.float64), float(w.max()) if w.size else 0.0


def _weights_in_range(parts, total, largest):
    """``(parts, exponent)``: the partitions with their weights in units of ``2**exponent``,
    as the in-memory fit scales them (``_inputs.checked_sample_weight``): 0 unless they sum
    beyond ``2**32``, then (exactly) to a sum below 1."""
    import dask

    exponents = weight_exponents(total, largest, lambda first: sum(dask.compute(
        [dask.delayed(_scaled_sum)(p, first) for p in parts])[0]))
    if exponents is None:
        return parts, 0
    return dask.persist(*[dask.delayed(_scaled)(p, exponents) for p in parts]), sum(exponents)


def _scaled_sum(part, first):
    return float(scaled_weights(part[1], first).sum(dtype=np.float64))


def _scaled(part, exponents):
    X, w = part
    return X, scaled_weights(w, *exponents).astype(w.dtype, copy=False)


def _extremes(part):
    """A partition's columns' largest and smallest values (float64), ``None`` if empty."""
    X = part[0]
    return (X.max(0).astype(np.float64), X.min(0).astype(np.float64)) if X.shape[0] else None


def _squares(part, mean):
    X = part[0]
    return ((X - mean) ** 2).sum(0, dtype=np.float64)


def _sample(parts, lengths, rng, mean):
    """Centred rows and weights drawn uniformly from the partitions (for the initialisation)."""
    import dask

    n = sum(lengths)
    rows = np.arange(n) if n <= _SAMPLE_ROWS else np.unique(rng.randint(0, n, _SAMPLE_ROWS))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    taken = dask.compute([
        dask.delayed(_rows)(part, rows[(rows >= s) & (rows < s + m)] - s)
        for part, s, m in zip(parts, starts, lengths, strict=True)
    ])[0]
    X = np.concatenate([t[0] for t in taken]) - mean
    return X, np.concatenate([t[1] for t in taken])


def _rows(part, local):
    return part[0][local], part[1][local]


def _run(parts, centers, mean, T, max_iter, tol, on_iteration=None):
    """One run: Lloyd's (T = 0) or soft k-means (T > 0) steps over the partitions in the
    engine's iteration loop, as ``lloyd`` / ``soft_kmeans`` make them over all points; then the
    final labels and inertia."""
    import dask
    import dask.array as da

    labels = None  # each partition's hard labels at the previous step

    def em_step(centers):
        nonlocal labels
        steps = dask.persist(*[
            dask.delayed(_step, nout=2)(part, mean, centers, T, old)
            for part, old in zip(parts, labels or [None] * len(parts), strict=True)
        ])
        sums, mass, changed = _merged(dask.compute([s[1] for s in steps])[0])
        if T == 0 and np.any(mass == 0):
            sums, mass = _relocate(parts, [s[0] for s in steps], mean, centers, sums, mass)
        converged = T == 0 and labels is not None and changed == 0  # strict convergence
        labels = [s[0] for s in steps]
        return _weighted_means(sums, mass, centers, heaviest=T == 0), converged

    centers, n_iter = iterate_centers(em_step, centers, max_iter, tol, on_iteration)
    final = dask.persist(*[dask.delayed(_assign, nout=2)(part, mean, centers) for part in parts])
    summaries = dask.compute([f[1] for f in final])[0]
    inertia = sum(s[0] for s in summaries)
    counts = sum(s[1] for s in summaries)
    label_array = da.concatenate([
        da.from_delayed(f[0], (len_,), dtype=np.int32)
        for f, len_ in zip(final, [s[2] for s in summaries], strict=True)
    ])
    return Run(centers, label_array, inertia, n_iter, counts=counts)


def _tensors(part, mean, centers):
    X, w = part
    return torch.from_numpy(X - mean), torch.from_numpy(w), torch.from_numpy(centers)


def _step(part, mean, centers, T, labels_old):
    """One partition's E-step and M-step sums (and, hard, its labels and how many changed)."""
    Xt, wt, ct = _tensors(part, mean, centers)
    step = kmeans_step(Xt, ct, wt, temperature=T)
    labels = step["labels"].numpy() if T == 0 else None
    changed = 0 if labels_old is None or labels is None else int((labels != labels_old).sum())
    return labels, (step["sums"].numpy(), step["mass"].numpy(), changed)


def _merged(summaries):
    sums = summaries[0][0].copy()
    mass = summaries[0][1].copy()
    for s in summaries[1:]:
        sums += s[0]
        mass += s[1]
    return sums, mass, sum(s[2] for s in summaries)


def _relocate(parts, labels, mean, centers_old, sums, mass):
    """scikit-learn's relocation of empty clusters: each goes to one of the points farthest
    from their (old) centre, taken out of its cluster (farthest first; the in-memory fit takes
    them in ``argpartition`` order)."""
    import dask

    empty = np.flatnonzero(mass == 0)
    found = dask.compute([
        dask.delayed(_farthest)(part, block_labels, mean, centers_old, empty.size)
        for part, block_labels in zip(parts, labels, strict=True)
    ])[0]
    d2 = np.concatenate([f[0] for f in found])
    if d2.size == 0 or d2.max() <= 0:
        return sums, mass
    x = np.concatenate([f[1] for f in found])
    w = np.concatenate([f[2] for f in found])
    owner = np.concatenate([f[3] for f in found])
    sums, mass = sums.copy(), mass.copy()
    for j, idx in zip(empty, np.argsort(-d2, kind="stable")[: empty.size], strict=False):
        sums[owner[idx]] -= x[idx] * w[idx]
        sums[j] = x[idx] * w[idx]
        mass[j] = w[idx]
        mass[owner[idx]] -= w[idx]
    return sums, mass


def _farthest(part, labels, mean, centers, m):
    """A partition's ``m`` points farthest from their centre: distances, centred rows,
    weights and labels."""
    X = part[0] - mean
    d2 = ((X - centers[labels]) ** 2).sum(1)
    far = np.argsort(-d2, kind="stable")[:m]
    return d2[far], X[far], part[1][far], labels[far]


def _weighted_means(sums, mass, centers_old, heaviest):
    """The M-step on the merged sums (the engine's ``weighted_means``; hard steps put a
    cluster still empty where the heaviest one is, as its ``lloyd`` does)."""
    keep = mass > 0
    centers = np.where(keep[:, None], sums / np.where(keep, mass, 1)[:, None], centers_old)
    if heaviest:
        centers = np.where(keep[:, None], centers, heaviest_fill(sums, mass, centers))
    return centers.astype(centers_old.dtype, copy=False)


def _assign(part, mean, centers):
    """A partition's final labels, and its weighted inertia, cluster counts and size."""
    Xt, wt, ct = _tensors(part, mean, centers)
    step = kmeans_step(Xt, ct, None, update=False)
    labels = step["labels"].numpy().astype(np.int32)  # KMeans' label dtype, as in memory
    inertia = kmeans_inertia(Xt, wt, ct, step["labels"])
    return labels, (inertia, np.bincount(labels, minlength=centers.shape[0]), labels.size)
