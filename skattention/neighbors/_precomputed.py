"""``metric="precomputed"``: attention over given query-to-training distances.

The pseudo-metric is the square of the given distance, ``f(x_i, x_j) = D_ij**2`` (so that
``temperature`` means what it means for ``"euclidean"``), and it goes through the engine's
``"dot"`` score: a query row ``d`` becomes ``-d**2`` (float64) and the training points the
identity matrix, so the score of training point ``j`` is ``-d_j**2``, exactly (one product by 1
and sums of zeros). Squaring is strictly increasing on float64 numbers between 1.5e-154 and
1.3e154, so every selection (k-NN, radius, ``temperature=0``) is the one on the distances
themselves. The engine's radius mask needs a distance metric, so a radius is a log-prior of
``-inf`` on the pairs beyond it, read from the query block. The identity keys are made when
first needed and kept out of pickles (``n**2`` numbers, as many as the distance matrix).
"""

import numpy as np
import torch
from scipy import sparse
from sklearn.utils.validation import validate_data

PRECOMPUTED = "precomputed"


class PrecomputedMixin:
    """``metric="precomputed"`` for the metric-attention estimators (see the module)."""

    def _check_X(self, X, reset):
        if self.metric != PRECOMPUTED:
            return super()._check_X(X, reset)
        if sparse.issparse(X):
            raise TypeError(
                "metric='precomputed' takes a dense distance matrix; a sparse one (a graph of "
                "some of the distances) is not supported: use X.toarray() with every distance."
            )
        X = validate_data(self, X, reset=reset, dtype=[np.float64, np.float32])
        if reset and X.shape[0] != X.shape[1]:
            raise ValueError(
                f"Precomputed matrix must be square. Input is a {X.shape[0]}x{X.shape[1]} "
                "matrix."
            )
        if np.any(X < 0):
            raise ValueError("Negative values in data passed to precomputed distance matrix.")
        return X

    def _fit_attention(self, X, values, sample_weight, *args, **kwargs):
        if self.metric == PRECOMPUTED and isinstance(self.temperature, str):
            raise ValueError(
                "temperature='auto' is not available with metric='precomputed': give a "
                "temperature (np.inf with n_neighbors or radius for scikit-learn's neighbour "
                "estimators, 0 for the nearest neighbour, 2 * h**2 for a Gaussian kernel of "
                "bandwidth h)."
            )
        super()._fit_attention(X, values, sample_weight, *args, **kwargs)
        self.__dict__.pop("_identity_keys", None)
        if self.metric != PRECOMPUTED:
            return
        weights = self._log_prior[np.isfinite(self._log_prior)]
        if self.radius is not None and self.n_neighbors is not None and np.ptp(weights) > 0:
            # the radius mask takes the log-prior's place, where k-NN counts weights as copies
            raise ValueError(
                "metric='precomputed' with both radius and n_neighbors needs equal weights of "
                "the training points (no sample_weight or class_weight)."
            )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        if self.metric == PRECOMPUTED:
            tags.input_tags.pairwise = True
            # distances: no missing values, sparse graphs, categories or strings
            tags.input_tags.allow_nan = tags.input_tags.sparse = False
            tags.input_tags.categorical = tags.input_tags.string = False
        return tags

    @property
    def _fit_Z(self):
        """The keys: the training points in the metric space (the identity for precomputed)."""
        if self.metric != PRECOMPUTED:
            try:
                return self.__dict__["_fit_Z"]
            except KeyError:  # unfitted: what getattr(estimator, "_fit_Z", None) expects
                raise AttributeError("_fit_Z") from None
        if "_identity_keys" not in self.__dict__:
            self.__dict__["_identity_keys"] = np.eye(self.n_samples_fit_)
        return self.__dict__["_identity_keys"]

    @_fit_Z.setter
    def _fit_Z(self, value):
        self.__dict__["_fit_Z"] = value

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_identity_keys", None)  # remade when needed
        return state

    def _compute_dtype(self):
        if self.metric == PRECOMPUTED and self.dtype is None:
            return torch.float64  # the squared distances of float32 input are exact in float64
        return super()._compute_dtype()

    def _embed(self, X, side="query"):
        if self.metric != PRECOMPUTED:
            return super()._embed(X, side)
        return -np.square(X, dtype=np.float64)

    def _engine_metric(self):
        return "dot" if self.metric == PRECOMPUTED else super()._engine_metric()

    def _engine_kwargs(self, temperature=None, queries=None):
        kwargs = super()._engine_kwargs(temperature, queries)
        if self.metric == PRECOMPUTED and kwargs["radius"] is not None:
            kwargs.update(self._radius_kwargs(queries, kwargs["radius"]))
        return kwargs

    def _radius_kwargs(self, Z, radius):
        if self.metric != PRECOMPUTED:
            return super()._radius_kwargs(Z, radius)
        if Z is None:
            raise ValueError("A precomputed radius mask needs the query block.")
        outside = torch.as_tensor(-Z > radius * radius)
        log_prior = torch.as_tensor(self._log_prior)

        def radius_prior(query_index, key_index):
            dev = key_index.device
            inside = ~outside.to(dev)[query_index, key_index]
            return torch.where(inside, log_prior.to(dev)[key_index], -torch.inf)

        return dict(radius=None, log_prior=radius_prior)
