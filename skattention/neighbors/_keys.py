"""Fitted keys: the training points as the engine attends to them, with their values and
log-prior, and the operations the estimators run on them.

:class:`FittedKeys` holds them in memory (``_dask.ShardedKeys`` on a Dask cluster, with the same
operations). What the engine needs on a compute device (the prepared keys, the values and the
log-prior as tensors) is made once per device and dtype and kept with the keys, out of pickles.
This is where pruned, low-precision or sharded keys live.
"""

import math

import numpy as np
import torch

from .._engine import (
    attention,
    averaging_dtype,
    budget_bytes,
    grouped_rows_single_threaded,
    kneighbors,
    near_far_attention,
    plan_rows,
    prepare_keys,
    rows_single_threaded,
)

# radius selections: neighbours gathered per query row at first (doubled for the rows that have
# more within the radius)
_FIRST_RADIUS_NEIGHBORS = 32


class FittedKeys:
    """Keys, values and log-prior of the training points, in memory.

    Parameters
    ----------
    inputs : ndarray of shape (n_samples, n_encoded)
        The encoded training inputs (queries of ``kneighbors(X=None)`` and the like).
    values : ndarray of shape (n_samples, n_values)
        What attention propagates (one-hot labels, targets or residuals), float64.
    log_prior : ndarray of shape (n_samples,)
        Log of each point's prior weight; ``-inf`` removes it.
    points : ndarray of shape (n_samples, n_components) or None
        The keys in the metric space; ``None``: the identity (``metric="precomputed"``), made
        when first needed.
    engine_metric : str
        The engine's pseudo-metric of the keys.
    summary : GroupedKeys or None
        The keys grouped around prototypes (``_summary.py``, on the CPU) that dense attention
        runs over (exact over each query's nearest groups) instead of every key; selections
        (``n_neighbors``, a radius, ``kneighbors``) use the keys.
    """

    sharded = False

    def __init__(self, inputs, values, log_prior, points, engine_metric, summary=None):
        self.inputs = inputs
        self.summary = summary
        self.values = values
        self.log_prior = log_prior
        self._points = points
        self.engine_metric = engine_metric
        self._ready = {}

    def __getstate__(self):
        return {**self.__dict__, "_ready": {}}

    @property
    def n_samples(self):
        return self.values.shape[0]

    @property
    def points(self):
        """The keys in the metric space (the identity for precomputed distances)."""
        if self._points is not None:
            return self._points
        identity = self._ready.get("identity")
        if identity is None:
            identity = self._ready["identity"] = np.eye(self.n_samples)
        return identity

    def _on_device(self, name, device, dtype, build):
        key = (name, device.type, device.index, dtype)
        ready = self._ready.get(key)
        if ready is None:
            ready = self._ready[key] = build()
        return ready

    def prepared(self, device, dtype):
        """The keys prepared for the engine on ``device`` and ``dtype``, made once."""
        return self._on_device("keys", device, dtype, lambda: prepare_keys(
            self.points, metric=self.engine_metric, device=device, dtype=dtype))

    def dense(self, device, dtype, temperature):
        """``(prepared keys, values, log_prior)`` of attention over every key."""
        keys = self.prepared(device, dtype)
        return (keys, *self.per_key(keys, temperature))

    def per_key(self, prepared, temperature):
        """``(values, log_prior)`` as tensors on the device and dtype of ``prepared``, made once;
        the values keep float64 where the engine averages them in float64
        (``averaging_dtype``: the configurations equal to scikit-learn's neighbour estimators).
        The engine remembers them checked, so a single row's predict does not check them
        again."""
        device, dtype = prepared.raw.device, prepared.raw.dtype
        values_dtype = averaging_dtype(self.values, float(temperature), dtype, device)
        values = self._on_device("values", device, values_dtype, lambda: torch.tensor(
            self.values, device=device, dtype=values_dtype))
        return values, self._on_device("log_prior", device, dtype, lambda: torch.tensor(
            self.log_prior, device=device, dtype=dtype))

    # ------------------------------------------------------------------ operations

    def propagate(self, metric, block, kwargs, progress, few_rows=False):
        """Attention of the encoded query rows ``block`` over the keys, applied to the values:
        ``(outputs, no_neighbour)``, the second the mask of the queries with no key within
        ``kwargs["radius"]`` (``None`` without a radius).

        ``metric``: the estimator's metric strategy (embeds the queries); ``kwargs``: its
        engine arguments. ``few_rows``: a few rows (a web service's single row) mapped and
        attended to as tensors in one thread setting (each would set its own).
        """
        device, dtype = kwargs["device"], kwargs["dtype"]
        radius, temperature = kwargs["radius"], kwargs["temperature"]
        if (self.summary is not None and radius is None and kwargs["n_neighbors"] is None
                and 0 < temperature < math.inf):
            return self._near_far(metric, block, device, dtype, temperature, few_rows), None
        if radius is None:
            keys, values, log_prior = self.dense(device, dtype, temperature)
            kwargs = dict(kwargs, log_prior=log_prior)
            on_empty = "raise"
        else:
            keys = self.prepared(device, dtype)
        if few_rows:
            Z = torch.as_tensor(block, dtype=keys.raw.dtype, device=keys.raw.device)
        else:
            Z = metric.embed(block, "query", device, dtype)
        if radius is not None:
            kwargs = dict(kwargs, **metric.radius_kwargs(Z, radius, kwargs["log_prior"]))
            # A column of ones tells the queries with no neighbour: their weights sum to 0.
            values = np.hstack([self.values, np.ones((self.n_samples, 1), self.values.dtype)])
            on_empty = "zero"
        if few_rows:
            width = 1 if values.ndim == 1 else values.shape[1]
            with rows_single_threaded(keys, Z.shape[0], width):
                Z = metric.embed_tensor(Z, device, dtype)
                out = attention(Z, keys, values, on_empty=on_empty, progress=progress, **kwargs)
            out = out.cpu().numpy()
        else:
            out = attention(Z, keys, values, on_empty=on_empty, progress=progress, **kwargs)
        out = np.asarray(out, dtype=np.float64)
        if radius is None:
            return out, None
        return out[:, :-1], out[:, -1] == 0

    def _near_far(self, metric, block, device, dtype, temperature, few_rows):
        """Attention of the encoded query rows ``block`` over the keys grouped around their
        prototypes (exact over each query's nearest groups)."""
        grouped = self._on_device("summary", device, dtype,
                                  lambda: self.summary.to(device, dtype))
        if few_rows:  # a few rows' kernels are too small to be split over threads
            with grouped_rows_single_threaded(grouped, block.shape[0]):
                Z = metric.embed_tensor(torch.as_tensor(block, dtype=dtype, device=device),
                                        device, dtype)
                out = near_far_attention(Z, grouped, temperature)
        else:
            Z = torch.as_tensor(metric.embed(block, "query", device, dtype), device=device,
                                dtype=dtype)
            out = near_far_attention(Z, grouped, temperature)
        return np.asarray(out.cpu(), dtype=np.float64)

    def select(self, Z, n_neighbors, exclude_self, kwargs):
        """``(f, indices)`` of the ``n_neighbors`` nearest keys of the mapped queries ``Z``
        (the engine's ``kneighbors``; ``kwargs``: metric, masks, device and dtype)."""
        keys = self.prepared(kwargs["device"], kwargs["dtype"])
        return kneighbors(Z, keys, n_neighbors, exclude_self=exclude_self, **kwargs)

    def within(self, Z, radius, exclude_self, selection_kwargs):
        """Yield ``(rows, f, idx)`` per chunk of the mapped queries ``Z`` (``rows`` the
        indices of the chunk's rows in ``Z``; chunks come in no particular order): every
        unmasked key within ``radius`` in (distance, index) order, padded with ``inf`` and
        ``-1``. Rows are selected with room for ``k`` neighbours, ``k`` doubled for the rows
        that fill it (their k-th neighbour is within the radius, so more may be), in chunks of
        as many rows as the budget holds at their width. ``selection_kwargs(Z, radius)``: the
        engine's selection arguments of a block of queries (a precomputed metric's radius mask
        is read from it)."""
        k = min(self.n_samples, _FIRST_RADIUS_NEIGHBORS)
        rows = plan_rows(Z.shape[0], row_bytes=32 * k, budget=budget_bytes())
        for start in range(0, Z.shape[0], rows):
            stop = min(Z.shape[0], start + rows)
            own = exclude_self
            if isinstance(own, np.ndarray):
                own = own[start:stop]
            yield from self._within(Z[start:stop], own, np.arange(start, stop), k, radius,
                                    selection_kwargs)

    def _within(self, Z, own, rows, width, radius, selection_kwargs):
        """:meth:`within`'s chunks of the rows ``rows`` (mapped: ``Z``) selected at ``width``:
        the rows that fill it again at twice the width, in chunks that hold the wider rows
        within the budget, and only after the others are yielded (a radius that takes every key
        would otherwise widen a chunk planned for ``k`` to every key, and keep it while the
        wider ones are selected)."""
        f, idx = self.select(Z, width, own, selection_kwargs(Z, radius))
        full = idx[:, -1] >= 0 if width < self.n_samples else np.zeros(len(rows), bool)
        more = np.flatnonzero(full)
        if not more.size:
            yield rows, f, idx
            return
        yield rows[~full], f[~full], idx[~full]
        del f, idx
        width = min(self.n_samples, 2 * width)
        step = plan_rows(more.size, row_bytes=32 * width, budget=budget_bytes())
        for start in range(0, more.size, step):
            chunk = more[start:start + step]
            yield from self._within(Z[chunk], own[chunk] if isinstance(own, np.ndarray) else own,
                                    rows[chunk], width, radius, selection_kwargs)

    def weights(self, Z, exclude_self, n_weights, kwargs, progress):
        """``(weights, indices)``: the ``n_weights`` largest attention weights of each mapped
        query in ``Z`` and the keys they fall on."""
        keys = self.prepared(kwargs["device"], kwargs["dtype"])
        _, weights, indices = attention(
            Z, keys, self.values, exclude_self=exclude_self, return_weights=True,
            n_weights=n_weights, on_empty="zero", progress=progress, **kwargs)
        return weights, indices


def _widen(a, width, fill=math.inf):
    out = np.full((a.shape[0], width), fill, dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out
