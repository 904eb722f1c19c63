"""Dask collections as inputs: recognising them, splitting them into row blocks, and fitted
estimators' predictions over a Dask query array as a lazy Dask array.

dask is an optional dependency (``pip install skattention[dask]``): nothing here imports it
unless the input already is a Dask collection (so dask is already imported).
"""

import sys

import numpy as np
from sklearn.base import is_classifier
from sklearn.utils.validation import check_is_fitted


def is_dask_collection(obj):
    """Whether ``obj`` is a Dask collection (array, DataFrame, Series, delayed)."""
    dask = sys.modules.get("dask")
    return dask is not None and dask.is_dask_collection(obj)


def row_blocks(X):
    """``(blocks, lengths)``: a Dask array's row chunks (all columns in each) or a Dask
    DataFrame's / Series' partitions, as Delayed objects, and how many rows each has."""
    if hasattr(X, "map_partitions"):  # DataFrame or Series
        import dask

        lengths = dask.compute(X.map_partitions(len))[0]
        return list(X.to_delayed()), [int(n) for n in np.asarray(lengths).ravel()]
    if X.ndim > 1 and X.numblocks[1:] != (1,) * (X.ndim - 1):
        X = X.rechunk({axis: -1 for axis in range(1, X.ndim)})
    if np.isnan(X.shape[0]):
        X = X.compute_chunk_sizes()
    return list(X.to_delayed().ravel()), [int(n) for n in X.chunks[0]]


def aligned_blocks(v, lengths, name):
    """``v`` (a Dask collection, an array-like or ``None``) cut into blocks of ``lengths`` rows,
    the row blocks of ``X``: Delayed objects, NumPy arrays or ``None`` s."""
    n = sum(lengths)
    if v is None:
        return [None] * len(lengths)
    if is_dask_collection(v):
        if hasattr(v, "to_dask_array"):
            v = v.to_dask_array(lengths=True)
        if np.isnan(v.shape[0]):
            v = v.compute_chunk_sizes()
        if v.shape[0] != n:
            raise ValueError(f"X has {n} rows but {name} has {v.shape[0]}.")
        v = v.rechunk({0: tuple(lengths), **{axis: -1 for axis in range(1, v.ndim)}})
        return list(v.to_delayed().ravel())
    v = np.asarray(v)
    if v.ndim == 0 or v.shape[0] != n:
        raise ValueError(f"X has {n} rows but {name} has {v.shape[0] if v.ndim else 0}.")
    return np.split(v, np.cumsum(lengths)[:-1])


def lazy_predict(estimator, method, X):
    """``estimator.<method>`` over the row blocks of the Dask collection ``X``, as a lazy Dask
    array (computed block by block on the workers when the result is computed).

    An estimator with keys sharded over the cluster supplies each block's task graph
    (``_dask_block_tasks``); any other fitted estimator is shipped to the workers as it is.
    """
    import dask
    import dask.array as da

    check_is_fitted(estimator)
    blocks, lengths = row_blocks(X)
    tail, dtype = _output_layout(estimator, method, X)
    block_tasks = getattr(estimator, "_dask_block_tasks", None)
    tasks = None if block_tasks is None else block_tasks(method, blocks)
    if tasks is None:
        est = dask.delayed(estimator, traverse=False)
        tasks = [dask.delayed(_call)(est, method, block) for block in blocks]
    # an empty block (a filtered partition) is never handed to the estimator, which refuses
    # no rows as scikit-learn's estimators do
    arrays = [
        da.from_delayed(task, shape=(n, *tail), dtype=dtype) if n else
        da.empty((0, *tail), dtype=dtype)
        for task, n in zip(tasks, lengths, strict=True)
    ]
    return da.concatenate(arrays) if len(arrays) > 1 else arrays[0]


def _call(estimator, method, X):
    return getattr(estimator, method)(X)


def _output_layout(estimator, method, X):
    """The shape after the rows and the dtype of ``estimator.<method>``'s output for the Dask
    collection ``X``."""
    centres = getattr(estimator, "cluster_centers_", None)
    if centres is not None:  # a clusterer: labels, or one number per cluster
        if method == "predict":  # the labels' dtype (int32, as KMeans')
            return (), np.dtype(getattr(getattr(estimator, "labels_", None), "dtype", np.int32))
        # distances in the queries' precision (float32 stays float32), probabilities in float64
        same = method == "transform" and getattr(X, "dtype", None) == np.float32
        return (centres.shape[0],), np.float32 if same else np.float64
    if method in ("predict_proba", "predict_log_proba"):
        return (len(estimator.classes_),), np.float64
    if is_classifier(estimator):
        dtype = estimator.classes_.dtype
        outlier = getattr(estimator, "outlier_label_", None)
        if outlier is not None and outlier not in estimator.classes_:
            dtype = np.result_type(dtype, np.asarray(outlier))
        return (), dtype
    n_outputs = estimator._keys.values.shape[1]
    return ((), np.float64) if estimator._y_1d else ((n_outputs,), np.float64)


def computed_state(state):
    """A pickled estimator's ``__dict__`` with its Dask collections computed (NumPy arrays), so
    that the pickle holds the whole model and loads without the cluster."""
    names = [name for name, value in state.items() if is_dask_collection(value)]
    if names:
        import dask

        state = dict(state)
        state.update(zip(names, dask.compute(*(state[name] for name in names)), strict=True))
    return state
