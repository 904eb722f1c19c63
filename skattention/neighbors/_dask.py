"""Metric-attention estimators fitted on Dask collections: the keys sharded over the workers.

``fit`` on a Dask array or DataFrame keeps the training rows where they are. Each partition is
encoded (and, with a learned metric, mapped) on its worker into its keys, values and key
log-prior, which stay there, persisted (:class:`ShardedKeys`, the estimator's fitted keys);
the client holds only the fitted settings. What needs
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

import math

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.class_weight import compute_class_weight

from .._engine import (
    finish_partial,
    is_selection,
    merge_partials,
    partial_neighbors,
    resolve_device,
    selection_size,
    shard_attention,
    shard_lightest_weights,
)
from ..utils._dask import aligned_blocks, row_blocks
from ._keys import FittedKeys
from ._table import pd

# Rows drawn from the partitions for the column encoding, the learned map and "auto".
_SAMPLE_ROWS = 65536
# Rows drawn for the column encoding alone (the fixed metric at a numeric temperature).
_ENCODER_ROWS = 1024
# Queries per task graph of an in-memory query array.
_QUERY_ROWS = 16384
# Partial results merged per task of the merge tree.
_MERGE_FAN_IN = 8


class ShardedFit:
    """The plan of a fit on the Dask collection ``X``: the checks, the sample the in-memory
    fit sees (:meth:`sample`) and, once the estimator is fitted on it, the sharded keys
    (:meth:`keys`)."""

    def __init__(self, estimator, X, y, sample_weight):
        self.classifier = hasattr(estimator, "class_weight")
        if estimator.metric == "precomputed":
            raise ValueError("metric='precomputed' cannot be fitted on a Dask collection: pass "
                             "the features (the keys are the training rows).")
        if self.classifier and getattr(y, "ndim", 1) > 1:
            raise ValueError("A classifier fitted on a Dask collection takes one label per row "
                             "(y of shape (n_samples,)); fit several outputs in memory.")
        self.x_blocks, self.lengths = row_blocks(X)
        self.n = sum(self.lengths)
        self.y_blocks = aligned_blocks(y, self.lengths, "y")
        self.w_blocks = aligned_blocks(sample_weight, self.lengths, "sample_weight")
        if estimator.n_neighbors is not None and estimator.n_neighbors > self.n:
            raise ValueError(
                f"n_neighbors={estimator.n_neighbors} is larger than the number of training "
                f"samples (n_samples={self.n})."
            )
        self.classes = self.counts = self.weighted_counts = None

    def sample(self, estimator):
        """``(X, y, sample_weight)`` of the rows drawn for the in-memory fit: uniformly from
        the partitions, plus one row of each class."""
        import dask

        n = self.n
        rng = check_random_state(estimator.random_state)
        # the fixed metric at a given temperature fits only the column encoding on the sample
        # (and the regressor's linear trend)
        fits_on_sample = (estimator.metric != "euclidean" or estimator.temperature == "auto"
                          or getattr(estimator, "trend", None) == "linear")
        size = min(n, max(_SAMPLE_ROWS if fits_on_sample else _ENCODER_ROWS,
                          2 * (estimator.n_neighbors or 0)))
        rows = np.arange(n) if size == n else np.unique(rng.randint(0, n, size=size))
        if self.classifier:
            # every class, and one row of each in the sample: the sample fit sees all classes
            found = dask.compute([dask.delayed(_classes_in)(b, w)
                                  for b, w in zip(self.y_blocks, self.w_blocks, strict=True)])[0]
            self.classes = np.unique(np.concatenate([c for c, *_ in found]))
            self.counts = np.zeros(self.classes.size, dtype=np.int64)
            self.weighted_counts = np.zeros(self.classes.size)
            first_rows = np.full(self.classes.size, n)
            start = 0
            for (block_classes, first, block_counts, block_weights), length in zip(
                    found, self.lengths, strict=True):
                where = np.searchsorted(self.classes, block_classes)
                self.counts[where] += block_counts
                self.weighted_counts[where] += block_weights
                first_rows[where] = np.minimum(first_rows[where], start + first)
                start += length
            rows = np.union1d(rows, first_rows)
        return _take_rows(self.x_blocks, self.y_blocks, self.w_blocks, self.lengths, rows)

    def keys(self, estimator):
        """The :class:`ShardedKeys` of all rows, computed and kept on the workers by
        ``estimator`` fitted on the sample."""
        import dask
        import dask.array as da

        fitted = estimator._keys
        shell = dask.delayed(_shell(estimator), traverse=False)
        class_weight = (_class_weight(estimator, self.classes, self.counts, self.n)
                        if self.classifier else None)
        keys, values, log_prior = [], [], []
        for xb, yb, wb, length in zip(self.x_blocks, self.y_blocks, self.w_blocks, self.lengths,
                                      strict=True):
            parts = dask.delayed(_shard_state, nout=3)(shell, xb, yb, wb, self.classes,
                                                       class_weight)
            keys.append(da.from_delayed(parts[0], (length, fitted.points.shape[1]),
                                        dtype=fitted.points.dtype))
            values.append(da.from_delayed(parts[1], (length, fitted.values.shape[1]),
                                          dtype=fitted.values.dtype))
            log_prior.append(da.from_delayed(parts[2], (length,), dtype=np.float64))
        keys, values, log_prior = dask.persist(
            da.concatenate(keys), da.concatenate(values), da.concatenate(log_prior)
        )
        n_neighbors = estimator.n_neighbors
        lightest = []
        if n_neighbors is not None:
            lightest = [dask.delayed(shard_lightest_weights)(b, n_neighbors)
                        for b in log_prior.to_delayed().ravel()]
        n_positive, finite, lightest = dask.compute(
            (log_prior > -np.inf).sum(), da.isfinite(keys).all(), lightest
        )
        if not n_positive:
            raise ValueError(
                "Sample weights must contain at least one non-zero number: all are zero.")
        if not finite:
            raise ValueError("The training keys contain NaN or infinity after the encoding.")
        n_select = None if n_neighbors is None else selection_size(n_neighbors, lightest)
        return ShardedKeys(keys, values, log_prior, fitted.engine_metric, n_select,
                           estimator.device)

    def most_frequent_class(self):
        """The most frequent class over all rows, counted by sample weight (a classifier's
        ``"most_frequent"``)."""
        return self.classes[np.argmax(self.weighted_counts)]


class ShardedKeys:
    """Keys, values and log-prior of the training points persisted on a Dask cluster, one
    partition per worker task: the operations of :class:`~._keys.FittedKeys` that run there
    (propagate, select), merged exactly on the client. Pickled, they are computed and load as
    in-memory :class:`~._keys.FittedKeys`.

    ``n_select``: how many nearest keys each partition sends for a k-NN prior;
    ``worker_device``: the ``device`` each worker resolves for itself (the estimator's at fit).
    """

    sharded = True

    def __init__(self, points, values, log_prior, engine_metric, n_select, worker_device):
        self.points = points
        self.values = values
        self.log_prior = log_prior
        self.engine_metric = engine_metric
        self.n_select = n_select
        self.worker_device = worker_device

    @property
    def inputs(self):
        """The encoded training rows where they are the keys (the dtype of the fit)."""
        return self.points

    @property
    def n_samples(self):
        return self.points.shape[0]

    def __reduce__(self):
        import dask

        points, values, log_prior = dask.compute(self.points, self.values, self.log_prior)
        return FittedKeys, (points, values, log_prior, points, self.engine_metric)

    def in_memory_only(self):
        raise NotImplementedError(
            "This model's keys are sharded over a Dask cluster (it was fitted on a Dask "
            "collection): predict, predict_proba, score and kneighbors(X) run on them. "
            "Pickle and load it (an in-memory model), or refit on in-memory data, for the "
            "other methods."
        )

    def prepared(self, device, dtype):
        self.in_memory_only()

    def weights(self, *args, **kwargs):
        self.in_memory_only()

    def within(self, *args, **kwargs):  # radius_neighbors
        self.in_memory_only()

    def propagate(self, metric, block, kwargs, progress, few_rows=False):
        """``FittedKeys.propagate`` over the partitions: ``(outputs, no_neighbour)``."""
        import dask

        queries = metric.embed(block, "query", kwargs["device"], kwargs["dtype"])
        # one graph per block of queries: bounded tasks and partial results on the workers
        parts = [dask.delayed(queries[start : start + _QUERY_ROWS])
                 for start in range(0, len(queries), _QUERY_ROWS)]
        merged = dask.compute([self._merged_partial(part, kwargs) for part in parts])[0]
        outputs = [_finish(partial, kwargs) for partial in merged]
        out = np.concatenate([o for o, _ in outputs])
        if kwargs["radius"] is None:
            return out, None
        return out, np.concatenate([e for _, e in outputs])

    def select(self, Z, n_neighbors, exclude_self, kwargs):
        """``(f, indices)`` of the ``n_neighbors`` nearest keys over the partitions (global
        indices into the training rows)."""
        import dask

        if exclude_self is not False:
            self.in_memory_only()
        kwargs = dict(kwargs, n_neighbors=n_neighbors, radius=None, temperature=math.inf)
        merged = dask.compute(self._merged_partial(dask.delayed(Z), kwargs, n_neighbors))[0]
        return partial_neighbors(merged, n_neighbors)

    def _merged_partial(self, queries, kwargs, n_neighbors=None):
        """The Delayed merged partial result of ``queries`` over all key partitions
        (``n_neighbors``: a plain selection of that many nearest keys, for kneighbors)."""
        import dask

        kwargs = {name: value for name, value in kwargs.items() if name != "log_prior"}
        kwargs["device"] = self.worker_device
        n_select = self.n_select
        if n_neighbors is not None:
            lightest = dask.compute([
                dask.delayed(shard_lightest_weights)(b, n_neighbors)
                for b in self.log_prior.to_delayed().ravel()
            ])[0]
            n_select = selection_size(n_neighbors, lightest)
        elif is_selection(kwargs["temperature"], kwargs["n_neighbors"]) and n_select is None:
            n_select = selection_size(None)  # temperature=0: the nearest key
        ones = kwargs["radius"] is not None and n_neighbors is None
        offsets = np.concatenate([[0], np.cumsum(self.points.chunks[0])[:-1]])
        # unoptimised: the partitions' graphs keep their Futures, so that a lazy result holds
        # the keys on the cluster after the model is gone (an optimised graph names them only)
        parts = [
            dask.delayed(_shard_partial)(queries, keys, values, log_prior, int(offset),
                                         n_select, ones, kwargs)
            for keys, values, log_prior, offset in zip(
                *(a.to_delayed(optimize_graph=False).ravel()
                  for a in (self.points, self.values, self.log_prior)),
                offsets, strict=True,
            )
        ]
        while len(parts) > 1:
            parts = [dask.delayed(_merged)(*parts[i : i + _MERGE_FAN_IN])
                     for i in range(0, len(parts), _MERGE_FAN_IN)]
        return parts[0]


def _classes_in(y, sample_weight):
    """A partition's classes, the first row of each, their counts and their sums of
    ``sample_weight`` (the counts where it is ``None``)."""
    classes, first, inverse, counts = np.unique(
        np.asarray(y), return_index=True, return_inverse=True, return_counts=True)
    weighted = (counts.astype(np.float64) if sample_weight is None else
                np.bincount(inverse.ravel(), weights=np.asarray(sample_weight, np.float64),
                            minlength=classes.size))
    return classes, first, counts, weighted


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
    partitions and queries): its fitted keys replaced by empty ones of the same dtypes and
    widths. Built from ``__dict__`` (not ``copy``, whose pickling protocol would gather the
    keys)."""
    shell = type(estimator).__new__(type(estimator))
    shell.__dict__.update(estimator.__dict__)
    keys = estimator._keys

    def empty(array):
        return np.empty((0, *array.shape[1:]), dtype=array.dtype)

    shell._keys = FittedKeys(empty(keys.inputs), empty(keys.values), empty(keys.log_prior),
                             empty(keys.points), keys.engine_metric)
    shell.__dict__.pop("_callback_fit_data", None)
    if getattr(shell, "_fit_y", None) is not None:
        shell._fit_y = empty(shell._fit_y)
    return shell


def _shard_state(shell, X, y, sample_weight, classes, class_weight):
    """One partition's keys, values and log-prior, as the in-memory fit makes them."""
    encoded = np.concatenate(list(shell._encoded_blocks(X)))
    device = resolve_device(shell.device)
    Z = shell._strategy.keys(encoded, device, shell._compute_dtype())
    if classes is not None:
        y = np.asarray(y)
        if not np.all(np.isin(y, classes)):
            raise ValueError("y contains a label that is not one of the classes.")
        y_encoded = np.searchsorted(classes, y)
        values = np.eye(classes.size, dtype=shell._keys.values.dtype)[y_encoded]
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


# ---------------------------------------------------------------------- predict


def _queries(shell, X):
    """The Dask query block ``X`` encoded and mapped on a worker."""
    device = resolve_device(shell.device)
    dtype = shell._compute_dtype()
    return np.concatenate([shell._strategy.embed(block, "query", device, dtype)
                           for block in shell._encoded_blocks(X)])


def _shard_partial(queries, keys, values, log_prior, offset, n_select, ones, kwargs):
    if ones:  # a column of ones tells the queries with no neighbour (as propagate does)
        values = np.hstack([values, np.ones((values.shape[0], 1), dtype=values.dtype)])
    return shard_attention(queries, keys, values, key_offset=offset, n_select=n_select,
                           log_prior=log_prior, **kwargs)


def _merged(*partials):
    # positional arguments: a list of Delayed objects would be finalised into a graph that
    # drops the key partitions' Futures
    return merge_partials(list(partials))


def _finish(merged, kwargs):
    """``(outputs, no_neighbour)`` of the merged partial result, as propagate returns."""
    radius = kwargs["radius"]
    out = finish_partial(
        merged, temperature=kwargs["temperature"], n_neighbors=kwargs["n_neighbors"],
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
    kwargs = estimator._engine_kwargs(estimator._keys.worker_device)
    tasks = []
    for block in blocks:
        queries = dask.delayed(_queries)(shell, block)
        merged = estimator._keys._merged_partial(queries, kwargs)
        tasks.append(dask.delayed(_method_of_merged)(shell, method, block, merged, kwargs))
    return tasks


def _method_of_merged(shared_shell, method, X, merged, kwargs):
    # this task's own copy: the worker's shell is shared by its tasks
    shell = type(shared_shell).__new__(type(shared_shell))
    shell.__dict__.update(shared_shell.__dict__)
    out, no_neighbour = _finish(merged, kwargs)
    if getattr(shell, "trend_", None) is not None:
        out = shell._plus_value_offsets(
            out, [shell._value_offset(b) for b in shell._encoded_blocks(X)])
    # the method's own post-processing of these outputs, on this worker's copy of the model
    shell._propagate = lambda X: (out, no_neighbour)
    return getattr(shell, method)(X)
