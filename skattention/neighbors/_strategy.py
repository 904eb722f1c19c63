"""Metric strategies: everything the ``metric`` parameter changes, in one object.

The estimator chooses its strategy in ``fit`` from ``metric`` (``strategy_for``) and holds it,
fitted, as scikit-learn's neighbour estimators hold their fitted tree. A strategy owns

* the inputs: their checks and encoding (``input``, a :class:`~._input.TabularInput`);
* the fit of the metric: the map and the temperature (``fit``, returning a
  :class:`MetricFit` of the public fitted attributes) and the keys of the training points;
* what the engine needs: the embedding of query blocks in the metric space, the engine's
  metric name, the compute dtype, the radius mask and the distances of the selection.

:class:`FixedMetric` (``"euclidean"``) and :class:`PrecomputedMetric` are here; the learned
metrics' strategy (``"tabular"``, ``"mlp"``, ``"linear"``, ``"dot"``) is in ``_learned.py``.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from .._engine import (
    METRICS,
    budget_bytes,
    exact_f_of_pairs,
    metric_kind,
    plan_rows,
    resolve_dtype,
)
from ._input import PrecomputedInput, TabularInput
from ._temperature import auto_temperature

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
# The estimators' fixed metrics (:class:`FixedMetric`): distances of the inputs as given.
FIXED_METRICS = ("euclidean", "manhattan", "cosine", "minkowski")


@dataclass
class MetricFit:
    """The public fitted attributes a metric's fit sets (``map_``, ``temperature_``, ...)."""

    temperature: float
    map: object = None
    loss_curve: list = field(default_factory=list)
    n_iter: int = 0
    validation_scores: list = None
    validation_loss_curve: list = None
    best_validation_score: float = None


def check_in_range(X, dtype):
    """A clear error for encoded inputs ``X`` beyond float32 when attention computes in it (the
    engine's cast made them infinite: "keys contains NaN or infinity", of inputs that hold
    none)."""
    if dtype != torch.float32 or not isinstance(X, np.ndarray) or not X.size:
        return
    peak = float(np.abs(X).max())
    if peak > np.finfo(np.float32).max:
        raise _out_of_range(peak)


def _out_of_range(peak):
    reaches = "holds values" if peak is None else f"reaches {peak:.3g} in magnitude,"
    return ValueError(
        f"X {reaches} beyond float32 (up to {np.finfo(np.float32).max:.3g}), the precision "
        "this estimator's attention computes in; pass dtype='float64' or rescale X."
    )


class MetricStrategy:
    """The fixed metric ``"euclidean"``: the encoded inputs are the keys, nothing is learned.

    Subclasses change what a metric changes; every method here is what ``"euclidean"`` does.
    """

    learned = False
    # the estimator's ``p`` (Minkowski's power), set with the strategy in fit
    p = 2.0
    # prototypes of the keys for dense attention (a learned metric's, _summary.py), and their
    # measured error
    prototypes = None
    prototype_error = None

    def __init__(self, metric):
        self.metric = metric
        self.input = TabularInput(scaled=False, codes=False)

    def summarize(self, points, values, log_prior, inputs):
        """The fitted keys grouped around prototypes (an engine ``GroupedKeys``), or ``None``:
        attention over every key. ``inputs``: the encoded training inputs of the keys."""
        return None

    # ------------------------------------------------------------------ fit

    def check_fit_params(self, estimator):
        """Raise for parameters this metric cannot take, before any work."""

    def fit(self, estimator, X, values, train_values, sample_weight, prior_weight, loss,
            stratify, loo_loss, device, epoch_model=None):
        """Fit the metric on the encoded training inputs ``X``; return its :class:`MetricFit`.

        ``values``: what attention propagates, ``train_values`` what a learned metric is
        trained on instead when given (standardised targets); ``sample_weight`` and
        ``prior_weight`` (sample times class weight); ``loss`` and ``stratify``: the learned
        metrics' training loss and validation strata; ``loo_loss(pred, rows, weight, values)``:
        the estimator's leave-one-out loss (``temperature="auto"`` of the fixed metric);
        ``epoch_model``: see the learned metrics.
        """
        check_in_range(X, self.compute_dtype(estimator.dtype, X.dtype))
        if not isinstance(estimator.temperature, str):
            return MetricFit(temperature=float(estimator.temperature))
        with np.errstate(divide="ignore"):
            log_prior = np.log(prior_weight)
        # (the temperature is the search's to set)
        kwargs = self.engine_kwargs(estimator, log_prior, X.dtype, device, temperature=1.0)
        return MetricFit(temperature=auto_temperature(X, values, sample_weight, loo_loss,
                                                      kwargs))

    def keys(self, X, device, dtype):
        """The training points as keys, from their encoded inputs ``X``."""
        return X

    # ------------------------------------------------------------------ queries

    @property
    def engine_metric(self):
        """The engine's name of the pseudo-metric (Minkowski's: the engine's Manhattan or
        squared Euclidean kind where ``p`` is 1 or 2, else ``("minkowski", p)``)."""
        if self.metric == "minkowski":
            return {1.0: "manhattan", 2.0: "sqeuclidean"}.get(self.p, ("minkowski", self.p))
        return METRICS[self.metric]

    def compute_dtype(self, dtype, fit_dtype):
        """Precision of attention and of the map: ``dtype`` (the parameter); else the
        training data's (float32 data stays float32)."""
        if dtype is not None:
            return resolve_dtype(dtype)
        return torch.float32 if fit_dtype == np.float32 else torch.float64

    def embed(self, X, side, device, dtype):
        """Encoded rows ``X`` in the space where scores are computed (NumPy)."""
        check_in_range(X, dtype)
        return X

    def embed_tensor(self, Z, device, dtype):
        """Encoded query rows already a tensor on ``device`` (the few-rows path)."""
        if Z.dtype == torch.float32 and not bool(torch.isfinite(Z).all()):
            # the inputs were checked finite: the cast to float32 overflowed
            raise _out_of_range(None)
        return Z

    def engine_kwargs(self, estimator, log_prior, fit_dtype, device, temperature=None):
        """The engine's arguments for the estimator's attention."""
        return dict(
            metric=self.engine_metric,
            temperature=estimator.temperature_ if temperature is None else temperature,
            n_neighbors=estimator.n_neighbors,
            radius=estimator.radius,
            log_prior=log_prior,
            device=device,
            dtype=self.compute_dtype(estimator.dtype, fit_dtype),
        )

    def radius_kwargs(self, Z, radius, log_prior):
        """The engine's arguments of a radius mask for the query block ``Z``."""
        return dict(radius=radius)

    def distances(self, f):
        """Distances from the engine's values of the pseudo-metric ``f``."""
        f = np.maximum(np.asarray(f, dtype=np.float64), 0.0)
        kind, p = metric_kind(self.engine_metric)
        if kind in ("euclidean", "manhattan", "cosine"):  # values that are distances already
            return f + 0.0  # + 0.0: no -0.0
        if kind == "minkowski":
            return np.power(f, 1.0 / p) + 0.0  # scikit-learn's pow(rdist, 1 / p)
        return np.sqrt(f) + 0.0

    def exact_distances(self, Z, keys, indices):
        """Distances (float64) from the mapped queries ``Z`` to the keys ``indices`` (one row of
        them per query) computed from the coordinates' differences, as scikit-learn computes
        the distances its weights are made of."""
        out = np.empty(indices.shape)
        rows = plan_rows(Z.shape[0], row_bytes=16 * indices.shape[1] * Z.shape[1],
                         budget=budget_bytes())
        kind, p = metric_kind(self.engine_metric)
        for start in range(0, Z.shape[0], rows):
            block = slice(start, start + rows)
            q = np.asarray(Z[block], np.float64)[:, None, :]
            k = np.asarray(keys[indices[block]], np.float64)
            # the engine's exact values, as its selection ranks them
            f = exact_f_of_pairs(kind, p, torch.from_numpy(q), torch.from_numpy(k)).numpy()
            out[block] = (np.sqrt(f) if kind in ("sqeuclidean", "euclidean")
                          else self.distances(f))
        return out

    @classmethod
    def tags(cls, tags, device):
        """The estimator's tags as this metric changes them (a class method: tags are asked of
        unfitted estimators too)."""
        return tags


class FixedMetric(MetricStrategy):
    """The fixed metrics (``FIXED_METRICS``): the inputs as given, nothing learned."""


class PrecomputedMetric(MetricStrategy):
    """``metric="precomputed"``: attention over given query-to-training distances.

    The pseudo-metric is the square of the given distance, ``f(x_i, x_j) = D_ij**2`` (so that
    ``temperature`` means what it means for ``"euclidean"``), and it goes through the engine's
    ``"dot"`` score: a query row ``d`` becomes ``-d**2`` (float64) and the training points the
    identity matrix, so the score of training point ``j`` is ``-d_j**2``, exactly (one product
    by 1 and sums of zeros). Squaring is strictly increasing on float64 numbers between 1.5e-154
    and 1.3e154, so every selection (k-NN, radius, ``temperature=0``) is the one on the
    distances themselves. The engine's radius mask needs a distance metric, so a radius is a
    log-prior of ``-inf`` on the pairs beyond it, read from the query block. The identity keys
    are made when first needed and kept out of pickles (``n**2`` numbers, as many as the
    distance matrix).
    """

    def __init__(self, metric="precomputed"):
        super().__init__(metric)
        self.input = PrecomputedInput()

    def check_fit_params(self, estimator):
        if isinstance(estimator.temperature, str):
            raise ValueError(
                "temperature='auto' is not available with metric='precomputed': give a "
                "temperature (np.inf with n_neighbors or radius for scikit-learn's neighbour "
                "estimators, 0 for the nearest neighbour, 2 * h**2 for a Gaussian kernel of "
                "bandwidth h)."
            )

    def fit(self, estimator, X, values, train_values, sample_weight, prior_weight, *args,
            **kwargs):
        with np.errstate(divide="ignore"):
            log_prior = np.log(prior_weight)
        weights = log_prior[np.isfinite(log_prior)]
        if (estimator.radius is not None and estimator.n_neighbors is not None
                and np.ptp(weights) > 0):
            # the radius mask takes the log-prior's place, where k-NN counts weights as copies
            raise ValueError(
                "metric='precomputed' with both radius and n_neighbors needs equal weights of "
                "the training points (no sample_weight or class_weight)."
            )
        return MetricFit(temperature=float(estimator.temperature))

    def keys(self, X, device, dtype):
        return None  # the identity, made by the fitted keys when first needed

    @property
    def engine_metric(self):
        return "dot"

    def compute_dtype(self, dtype, fit_dtype):
        if dtype is None:
            return torch.float64  # the squared distances of float32 input are exact in float64
        return resolve_dtype(dtype)

    def embed(self, X, side, device, dtype):
        return -np.square(X, dtype=np.float64)

    def radius_kwargs(self, Z, radius, log_prior):
        outside = torch.as_tensor(-Z > radius * radius)
        log_prior = torch.as_tensor(log_prior)

        def radius_prior(query_index, key_index):
            dev = key_index.device
            inside = ~outside.to(dev)[query_index, key_index]
            return torch.where(inside, log_prior.to(dev)[key_index], -torch.inf)

        return dict(radius=None, log_prior=radius_prior)

    def exact_distances(self, Z, keys, indices):
        # the queries' rows are -D**2 (float64): the square root gives the distances back
        return np.sqrt(-np.take_along_axis(Z, indices, axis=1))

    @classmethod
    def tags(cls, tags, device):
        tags.input_tags.pairwise = True
        # distances: non-negative (negative ones are refused), no missing values, sparse
        # graphs, categories or strings
        tags.input_tags.positive_only = True
        tags.input_tags.allow_nan = tags.input_tags.sparse = False
        tags.input_tags.categorical = tags.input_tags.string = False
        return tags
