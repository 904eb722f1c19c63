"""Shared machinery of the metric-attention estimators (thin scikit-learn shells over the engine)."""

from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from .._engine import attention, kneighbors, resolve_device

# temperature="auto": leave-one-out choice on a geometric grid around the nearest-neighbour scale
# (the weighted median squared distance from a training point to its nearest distinct one).
_AUTO_TEMPERATURE_GRID = 2.0 ** np.arange(-3, 5)
_AUTO_TEMPERATURE_MAX_QUERIES = 2000
_AUTO_TEMPERATURE_CANDIDATES = 8

_METRIC_TO_ENGINE = {"euclidean": "sqeuclidean"}
_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class _BaseMetricAttention(BaseEstimator):
    """Fit storage, temperature and engine calls shared by the metric-attention estimators.

    Subclasses set ``self._fit_values`` (the values propagated to queries) in ``fit`` after
    calling :meth:`_fit_keys`.
    """

    _parameter_constraints: dict = {
        "metric": [StrOptions(set(_METRIC_TO_ENGINE))],
        "temperature": [Interval(Real, 0, None, closed="both"), StrOptions({"auto"})],
        "n_neighbors": [Interval(Integral, 1, None, closed="left"), None],
        "radius": [Interval(Real, 0, None, closed="neither"), None],
        "device": [str, torch.device],
        "dtype": [StrOptions(set(_TORCH_DTYPES)), None],
    }

    # ------------------------------------------------------------------ fit helpers

    def _fit_keys(self, X, values, sample_weight, key_weight=None):
        """Validate and store the training set: keys ``X``, ``values``, log-prior and temperature.

        ``key_weight`` multiplies ``sample_weight`` (class weights). Zero weight masks a key.
        """
        resolve_device(self.device)  # fail early and clearly on an unavailable device
        n_samples = X.shape[0]
        sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        prior_weight = sample_weight if key_weight is None else sample_weight * key_weight
        if not np.any(prior_weight > 0):
            raise ValueError("All sample weights are zero: at least one training sample needs positive weight.")
        if self.n_neighbors is not None and self.n_neighbors > n_samples:
            raise ValueError(
                f"n_neighbors={self.n_neighbors} is larger than the number of training samples "
                f"({n_samples})."
            )
        self._fit_X = X
        self._fit_values = values
        with np.errstate(divide="ignore"):
            self._log_prior = np.log(prior_weight)
        self.n_samples_fit_ = n_samples
        if isinstance(self.temperature, str):
            self.temperature_ = self._auto_temperature(sample_weight)
        else:
            self.temperature_ = float(self.temperature)

    def _auto_temperature(self, sample_weight):
        """Temperature with the lowest leave-one-out loss on a grid around the neighbour scale.

        Each training point (a subsample of at most ``_AUTO_TEMPERATURE_MAX_QUERIES``) is
        predicted from the others with this estimator's own masks and sample weights (class
        weights are a prior applied afterwards, not a property of the geometry), and the loss is
        weighted by sample weight. Weights act as counts: leaving a point of weight ``w`` out
        keeps ``max(w - 1, 0)`` of it, so an integer weight is exactly a repeated point.
        """
        X = self._fit_X
        with np.errstate(divide="ignore"):
            log_weight = np.log(sample_weight)
        positive = np.flatnonzero(sample_weight > 0)
        if positive.size < 2:
            return 1.0
        if positive.size > _AUTO_TEMPERATURE_MAX_QUERIES:
            positive = positive[np.linspace(0, positive.size - 1, _AUTO_TEMPERATURE_MAX_QUERIES).astype(int)]
        scale = self._neighbor_scale(positive, sample_weight, log_weight)
        w = sample_weight[positive]
        kwargs = self._engine_kwargs(temperature=scale)
        kwargs["log_prior"] = log_weight
        if np.all(w <= 1):
            kwargs["exclude_self"] = positive  # leaving one unit out leaves the whole point out
        else:
            kwargs["log_prior"] = _leave_one_unit_out_prior(log_weight, positive, w)
        best, best_loss = float(scale), np.inf
        for temperature in scale * _AUTO_TEMPERATURE_GRID:
            kwargs["temperature"] = float(temperature)
            pred = attention(X[positive], X, self._fit_values, on_empty="zero", **kwargs)
            loss = self._loo_loss(np.asarray(pred, dtype=np.float64), positive, w)
            if loss < best_loss:
                best, best_loss = float(temperature), loss
        return best

    def _neighbor_scale(self, queries, sample_weight, log_weight):
        """Weighted median squared distance from ``queries`` to their nearest distinct key."""
        X = self._fit_X
        n_candidates = min(_AUTO_TEMPERATURE_CANDIDATES, int(np.sum(sample_weight > 0)) - 1)
        _, idx = kneighbors(
            X[queries], X, n_candidates, log_prior=log_weight, exclude_self=queries,
            device=self.device, dtype=self._compute_dtype(),
        )
        # Exact distances on the candidates (duplicates are exactly 0 and skipped), in chunks
        # so the gathered candidates stay small.
        nearest = np.full(queries.size, np.inf)
        for start in range(0, queries.size, 256):
            rows = slice(start, start + 256)
            cand = idx[rows]
            diff = X[queries[rows]][:, None, :] - X[np.maximum(cand, 0)]
            d2 = np.einsum("ijk,ijk->ij", diff, diff)
            d2[(cand < 0) | (d2 <= 0)] = np.inf
            nearest[rows] = d2.min(1)
        keep = np.isfinite(nearest)
        if not np.any(keep):
            return 1.0
        median = _weighted_median(nearest[keep], sample_weight[queries][keep])
        return float(median) if median > 0 else 1.0

    # ------------------------------------------------------------------ engine calls

    def _compute_dtype(self):
        if self.dtype is not None:
            return _TORCH_DTYPES[self.dtype]
        return torch.float32 if self._fit_X.dtype == np.float32 else torch.float64

    def _engine_kwargs(self, temperature=None):
        return dict(
            metric=_METRIC_TO_ENGINE[self.metric],
            temperature=self.temperature_ if temperature is None else temperature,
            n_neighbors=self.n_neighbors,
            radius=self.radius,
            log_prior=self._log_prior,
            device=self.device,
            dtype=self._compute_dtype(),
        )

    def _validate_queries(self, X):
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=[np.float64, np.float32])

    def _propagate(self, X):
        """Attention of the rows of ``X`` over the training set, applied to the fitted values."""
        X = self._validate_queries(X)
        out = attention(X, self._fit_X, self._fit_values, **self._engine_kwargs())
        return np.asarray(out, dtype=np.float64)

    def attention_weights(self, X=None, n_weights=None):
        """The largest attention weights behind each prediction and the training points they fall on.

        The attention analogue of :meth:`~sklearn.neighbors.KNeighborsClassifier.kneighbors`.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), default=None
            Query points. ``None`` uses the training points, each excluded from its own row.
        n_weights : int, default=None
            Number of weights per row; by default ``n_neighbors`` when set, else
            ``min(10, n_samples_fit_)``.

        Returns
        -------
        weights : ndarray of shape (n_queries, n_weights)
            Attention weights, largest first (nearest first with a k-NN prior or at
            ``temperature=inf``); zero-padded.
        indices : ndarray of shape (n_queries, n_weights)
            Indices into the training set; ``-1`` for padding.
        """
        if X is None:
            check_is_fitted(self)
            X, exclude_self = self._fit_X, True
        else:
            X, exclude_self = self._validate_queries(X), False
        kwargs = self._engine_kwargs()
        if n_weights is None:
            n_weights = self.n_neighbors if self.n_neighbors is not None else min(10, self.n_samples_fit_)
        if exclude_self and self.n_neighbors is not None and self.n_neighbors >= self.n_samples_fit_:
            raise ValueError(
                f"n_neighbors={self.n_neighbors} leaves no room to exclude each training point "
                f"from its own row ({self.n_samples_fit_} samples)."
            )
        _, weights, indices = attention(
            X, self._fit_X, self._fit_values, exclude_self=exclude_self, return_weights=True,
            n_weights=n_weights, on_empty="zero", **kwargs,
        )
        return np.asarray(weights, dtype=np.float64), indices

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


def _leave_one_unit_out_prior(log_prior, queries, weights):
    """Callable log-prior: the key priors, except that query i's own key ``queries[i]`` keeps
    ``max(w_i - 1, 0)`` of its weight ``w_i``."""
    prior = torch.as_tensor(log_prior)
    own = torch.as_tensor(queries)
    with np.errstate(divide="ignore"):
        keep = torch.as_tensor(np.log(np.maximum(weights - 1.0, 0.0) / weights))

    def log_prior_fn(query_index, key_index):
        dev = key_index.device
        is_own = key_index == own.to(dev)[query_index]
        return prior.to(dev)[key_index] + torch.where(is_own, keep.to(dev)[query_index], 0.0)

    return log_prior_fn


def _weighted_median(values, weights):
    """Smallest value whose cumulative weight reaches half the total (repeats = weights)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return values[order][np.searchsorted(cum, 0.5 * cum[-1])]
