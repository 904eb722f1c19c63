"""Metric-attention estimators fitted on Dask collections: the keys sharded over the workers.

``fit`` on a Dask array or DataFrame keeps the training rows where they are. Each partition is
encoded (and, with a learned metric, mapped) on its worker into its keys, values and key
log-prior, which stay there, persisted; the client holds only the fitted settings. What needs
the rows together runs on a sample drawn uniformly from the partitions (``_SAMPLE_ROWS`` rows,
plus one row of each class): the column encoding, the learned map and ``temperature="auto"``
(the fixed metric at a numeric temperature draws only ``_ENCODER_ROWS`` rows, for the
encoding).
With the fixed metric and a numeric temperature the sample changes nothing: the keys are the
rows, and prediction equals the in-memory model's (except the regressor's ``trend="linear"``,
fitted on the sample; the workers hold the residuals).

Prediction runs the engine's shard attention (``shard_attention``) of the queries over each
partition on its worker, merges the partial results in a tree (``merge_partials``: exact, as
between the key blocks of one call) and finishes them on the client (``finish_partial``).
What moves per prediction is the queries (to every worker) and one partial result per
partition (the softmax state, or the nearest keys' distances, indices and values).
"""

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.class_weight import compute_class_weight

from .._engine import (
    LEARNED_METRICS,
    finish_partial,
    is_selection,
    merge_partials,
    partial_neighbors,
    selection_size,
    shard_attention,
    shard_lightest_weights,
)
from ..utils._dask import aligned_blocks, is_dask_collection, row_blocks
from ._tabular import pd

# Rows drawn from the partitions for the column encoding, the learned map and "auto".
_SAMPLE_ROWS = 65536
# Rows drawn for the column encoding alone (the fixed metric at a numeric temperature).
_ENCODER_ROWS = 1024
# Queries per task graph of an in-memory query array.
_QUERY_ROWS = 16384
# Partial results merged per task of the merge tree.
_MERGE_FAN_IN = 8


def is_sharded(estimator):
    """Whether the fitted keys of ``estimator`` live on a Dask cluster."""
    return is_dask_collection(getattr(estimator, "_fit_Z", None))


# ---------------------------------------------------------------------- fit


def fit(estimator, X, y, sample_weight):
    """Fit ``estimator`` (a MetricAttentionClassifier or -Regressor) on the Dask collection
    ``X``: fitted settings on a sample, keys/values/log-prior persisted per partition."""
    import dask
    import dask.array as da

    classifier = hasattr(estimator, "class_weight")
    if estimator.metric == "precomputed":
        raise ValueError("metric='precomputed' cannot be fitted on a Dask collection: pass the "
                         "features (the keys are the training rows).")
    if classifier and getattr(y, "ndim", 1) > 1:
        raise ValueError("A classifier fitted on a Dask collection takes one label per row "
                         "(y of shape (n_samples,)); fit several outputs in memory.")
    x_blocks, lengths = row_blocks(X)
    n = sum(lengths)
    y_blocks = aligned_blocks(y, lengths, "y")
    w_blocks = aligned_blocks(sample_weight, lengths, "sample_weight")
    if estimator.n_neighbors is not None and estimator.n_neighbors > n:
        raise ValueError(
            f"n_neighbors={estimator.n_neighbors} is larger than the number of training "
            f"samples ({n})."
        )
    rng = check_random_state(estimator.random_state)
    # the fixed metric at a given temperature fits only the column encoding on the sample
    # (and the regressor's linear trend)
    fits_on_sample = (estimator.metric in LEARNED_METRICS or estimator.temperature == "auto"
                      or getattr(estimator, "trend", None) == "linear")
    size = min(n, max(_SAMPLE_ROWS if fits_on_sample else _ENCODER_ROWS,
                      2 * (estimator.n_neighbors or 0)))
    rows = np.arange(n) if size == n else np.unique(rng.randint(0, n, size=size))
    counts = classes = None
    if classifier:
        # every class, and one row of each in the sample: the sample fit sees all classes
        found = dask.compute([dask.delayed(_classes_in)(b) for b in y_blocks])[0]
        classes = np.unique(np.concatenate([c for c, _, _ in found]))
        counts = np.zeros(classes.size, dtype=np.int64)
        firsts = []
        start = 0
        for (block_classes, first, block_counts), length in zip(found, lengths, strict=True):
            where = np.searchsorted(classes, block_classes)
            counts[where] += block_counts
            firsts.append(start + first)
            start += length
        first_rows = np.full(classes.size, n)
        for (block_classes, _, _), first in zip(found, firsts, strict=True):
            where = np.searchsorted(classes, block_classes)
            first_rows[where] = np.minimum(first_rows[where], first)
        rows = np.union1d(rows, first_rows)
    Xs, ys, ws = _take_rows(x_blocks, y_blocks, w_blocks, lengths, rows)
    type(estimator).fit(estimator, Xs, ys, sample_weight=ws)  # the in-memory fit of the sample

    # the sharded keys, values and log-prior, computed and kept on the workers
    shell = dask.delayed(_shell(estimator), traverse=False)
    class_weight = _class_weight(estimator, classes, counts, n) if classifier else None
    keys, values, log_prior = [], [], []
    for xb, yb, wb, length in zip(x_blocks, y_blocks, w_blocks, lengths, strict=True):
        parts = dask.delayed(_shard_state, nout=3)(shell, xb, yb, wb, classes, class_weight)
        keys.append(da.from_delayed(parts[0], (length, estimator._fit_Z.shape[1]),
                                    dtype=estimator._fit_Z.dtype))
        values.append(da.from_delayed(parts[1], (length, estimator._fit_values.shape[1]),
                                      dtype=estimator._fit_values.dtype))
        log_prior.append(da.from_delayed(parts[2], (length,), dtype=np.float64))
    keys, values, log_prior = dask.persist(
        da.concatenate(keys), da.concatenate(values), da.concatenate(log_prior)
    )
    n_select = None
    lightest = []
    if estimator.n_neighbors is not None:
        lightest = [dask.delayed(shard_lightest_weights)(b, estimator.n_neighbors)
                    for b in log_prior.to_delayed().ravel()]
    n_positive, finite, lightest = dask.compute(
        (log_prior > -np.inf).sum(), da.isfinite(keys).all(), lightest
    )
    if not n_positive:
        raise ValueError("Sample weights must contain at least one non-zero number: all are zero.")
    if not finite:
        raise ValueError("The training keys contain NaN or infinity after the encoding.")
    if estimator.n_neighbors is not None:
        n_select = selection_size(estimator.n_neighbors, lightest)
    if estimator.metric not in LEARNED_METRICS:
        estimator._fit_X = keys  # the encoded rows are the keys
    estimator._fit_Z, estimator._fit_values, estimator._log_prior = keys, values, log_prior
    estimator._shard_select = n_select
    estimator.n_samples_fit_ = n
    if classifier and isinstance(estimator.outlier_label, str) \
            and estimator.outlier_label == "most_frequent":
        estimator.outlier_label_ = estimator.classes_[np.argmax(counts)]
    return estimator


def _classes_in(y):
    """A partition's classes, the first row of each, and their counts."""
    classes, first, counts = np.unique(np.asarray(y), return_index=True, return_counts=True)
    return classes, first, counts


def _take_rows(x_blocks, y_blocks, w_blocks, lengths, rows):
    import dask

    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    taken = []
    for xb, yb, wb, start, length in zip(x_blocks, y_blocks, w_blocks, starts, lengths,
                                         strict=True):
        local = rows[(rows >= start) & (rows < start + length)] - start
        if local.size:
            taken.append(dask.delayed(_rows_of, nout=3)((xb, yb, wb), local))
    taken = dask.compute(taken)[0]
    xs, ys, ws = zip(*taken, strict=True)
    Xs = pd.concat(xs) if pd is not None and isinstance(xs[0], pd.DataFrame) \
        else np.concatenate(xs)
    return Xs, np.concatenate(ys), None if ws[0] is None else np.concatenate(ws)


def _rows_of(blocks, local):
    return tuple(None if b is None else (b.iloc[local] if hasattr(b, "iloc") else
                                         np.asarray(b)[local]) for b in blocks)


def _class_weight(estimator, classes, counts, n):
    """The class weights over all rows (the sample fit saw the sample's class counts)."""
    if estimator.class_weight is None:
        return None
    if isinstance(estimator.class_weight, str):  # "balanced", as compute_class_weight does it
        return n / (classes.size * counts.astype(np.float64))
    return compute_class_weight(estimator.class_weight, classes=classes, y=classes)


def _shell(estimator):
    """A copy of the fitted ``estimator`` without its keys (what the workers need to encode
    partitions and queries): its fitted arrays replaced by empty ones of the same dtype.

    Built from ``__dict__`` (not ``copy``, whose pickling protocol would gather the keys)."""
    shell = type(estimator).__new__(type(estimator))
    shell.__dict__.update(estimator.__dict__)
    shell.__dict__.pop("_device_cache", None)
    for name in ("_fit_X", "_fit_Z", "_fit_values", "_log_prior", "_fit_y"):
        value = shell.__dict__.get(name)
        if value is not None:
            shell.__dict__[name] = np.empty((0, *value.shape[1:]), dtype=value.dtype)
    return shell


def _shard_state(shell, X, y, sample_weight, classes, class_weight):
    """One partition's keys, values and log-prior, as the in-memory fit makes them."""
    encoded = _encoded(shell, X)
    Z = shell._embed(encoded, side="key")
    if classes is not None:
        y = np.asarray(y)
        if not np.all(np.isin(y, classes)):
            raise ValueError("y contains a label that is not one of the classes.")
        y_encoded = np.searchsorted(classes, y)
        values = np.eye(classes.size, dtype=shell._fit_values.dtype)[y_encoded]
        weight = 1.0 if class_weight is None else class_weight[y_encoded]
    else:
        values = np.asarray(y, dtype=np.float64).reshape(Z.shape[0], -1)
        if not np.all(np.isfinite(values)):
            raise ValueError("Input y contains NaN or infinity.")
        offset = shell._value_offset(encoded)  # the regressor's trend, fitted on the sample
        if offset is not None:
            values = values - offset
        weight = 1.0
    w = np.ones(Z.shape[0]) if sample_weight is None else np.asarray(sample_weight, np.float64)
    if w.shape != (Z.shape[0],) or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("sample_weight must be finite, non-negative and one per row of X.")
    with np.errstate(divide="ignore"):
        return Z, values, np.log(w * weight)


def _encoded(shell, X):
    return np.concatenate(list(shell._encoded_blocks(shell._check_X(X, reset=False))))


# ---------------------------------------------------------------------- predict


def propagate(estimator, X):
    """``_propagate`` of a sharded model for in-memory queries: the outputs and the mask of
    queries without a neighbour within ``radius`` (computed on the cluster, merged here)."""
    import dask

    encoded = list(estimator._validate_queries(X))
    queries = np.concatenate([estimator._embed(block) for block in encoded])
    # one graph per block of queries: bounded tasks and partial results on the workers
    blocks = [dask.delayed(queries[start : start + _QUERY_ROWS])
              for start in range(0, len(queries), _QUERY_ROWS)]
    merged = dask.compute([_merged_partial(estimator, block) for block in blocks])[0]
    outputs = [_finish(estimator, partial) for partial in merged]
    out = estimator._plus_value_offsets(np.concatenate([o for o, _ in outputs]),
                                        [estimator._value_offset(block) for block in encoded])
    return out, None if estimator.radius is None else np.concatenate([e for _, e in outputs])


def _queries(estimator, X):
    blocks = [estimator._embed(Q) for Q in estimator._validate_queries(X)]
    return np.concatenate(blocks)


def _merged_partial(estimator, queries, n_neighbors=None):
    """The Delayed merged partial result of ``queries`` over all key partitions
    (``n_neighbors``: a plain selection of that many nearest keys, for kneighbors)."""
    import dask

    kwargs = estimator._engine_kwargs()
    del kwargs["log_prior"]
    n_select = estimator._shard_select
    if n_neighbors is not None:
        kwargs.update(n_neighbors=n_neighbors, radius=None)
        lightest = dask.compute([
            dask.delayed(shard_lightest_weights)(b, n_neighbors)
            for b in estimator._log_prior.to_delayed().ravel()
        ])[0]
        n_select = selection_size(n_neighbors, lightest)
    elif is_selection(kwargs["temperature"], kwargs["n_neighbors"]) and n_select is None:
        n_select = selection_size(None)  # temperature=0: the nearest key
    ones = estimator.radius is not None and n_neighbors is None
    offsets = np.concatenate([[0], np.cumsum(estimator._fit_Z.chunks[0])[:-1]])
    parts = [
        dask.delayed(_shard_partial)(queries, keys, values, log_prior, int(offset), n_select,
                                     ones, kwargs)
        for keys, values, log_prior, offset in zip(
            estimator._fit_Z.to_delayed().ravel(), estimator._fit_values.to_delayed().ravel(),
            estimator._log_prior.to_delayed().ravel(), offsets, strict=True,
        )
    ]
    while len(parts) > 1:
        parts = [dask.delayed(merge_partials)(parts[i : i + _MERGE_FAN_IN])
                 for i in range(0, len(parts), _MERGE_FAN_IN)]
    return parts[0]


def _shard_partial(queries, keys, values, log_prior, offset, n_select, ones, kwargs):
    if ones:  # a column of ones tells the queries with no neighbour (as _propagate does)
        values = np.hstack([values, np.ones((values.shape[0], 1), dtype=values.dtype)])
    return shard_attention(queries, keys, values, key_offset=offset, n_select=n_select,
                           log_prior=log_prior, **kwargs)


def _finish(estimator, merged):
    """``(outputs, no_neighbour)`` of the merged partial result, as ``_propagate`` returns."""
    radius = estimator.radius
    out = finish_partial(
        merged, temperature=estimator.temperature_, n_neighbors=estimator.n_neighbors,
        on_empty="raise" if radius is None else "zero", radius=radius,
    )
    out = np.asarray(out, dtype=np.float64)
    if radius is None:
        return out, None
    return out[:, :-1], out[:, -1] == 0


def block_tasks(estimator, method, blocks):
    """Delayed ``estimator.<method>`` of each query block (Dask query collections): the
    queries encoded on a worker, attention over the key partitions, merged, and the method's
    own post-processing of the outputs."""
    import dask

    shell = dask.delayed(_shell(estimator), traverse=False)
    tasks = []
    for block in blocks:
        queries = dask.delayed(_queries)(shell, block)
        merged = _merged_partial(estimator, queries)
        tasks.append(dask.delayed(_method_of_merged)(shell, method, block, merged))
    return tasks


def _method_of_merged(shell, method, X, merged):
    shell = _shell(shell)
    out, no_neighbour = _finish(shell, merged)
    if getattr(shell, "trend_", None) is not None:
        out = shell._plus_value_offsets(
            out, [shell._value_offset(b) for b in shell._validate_queries(X)])
    # the method's own post-processing of these outputs
    shell._propagate = lambda X: (out, no_neighbour)
    return getattr(shell, method)(X)


def kneighbors(estimator, X, n_neighbors):
    """``(distances, indices)`` of the ``n_neighbors`` nearest keys of each query over the
    sharded keys, as the engine's ``kneighbors`` over all keys returns them (pseudo-metric
    values; global indices into the training rows)."""
    import dask

    merged = dask.compute(
        _merged_partial(estimator, dask.delayed(_queries(estimator, X)), n_neighbors)
    )[0]
    return partial_neighbors(merged, n_neighbors)
