"""The metric-attention estimators' shared shell: parameters, validation, fitted attributes.

An estimator holds two collaborators, chosen and made in ``fit`` (as scikit-learn's neighbour
estimators hold their fitted tree):

* its **metric strategy** (``_strategy``; ``_strategy.py``, ``_learned.py``): what ``metric``
  changes -- the inputs' encoding, the fit of the map and the temperature, the embedding of
  queries and the engine's arguments;
* its **fitted keys** (``_keys``; ``_keys.py``, or ``_dask.ShardedKeys`` for a fit on a Dask
  collection): the training points as keys, their values and log-prior, and the engine's
  operations on them (propagate, select the k nearest, weights).

The classes in ``_classification.py``, ``_regression.py`` and ``_transformer.py`` add what
their kind of estimator does with the propagated values.
"""

from functools import partial
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils import check_consistent_length
from sklearn.utils.class_weight import compute_sample_weight
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine import LEARNED_METRICS, METRICS, budget_bytes, plan_rows, resolve_device
from ..utils._device import DevicePortableMixin
from ..utils._estimator import EstimatorMixin
from ..utils._param_validation import Count, DtypeOptions, Interval, StrOptions
from ..utils._sklearn_compat import _check_sample_weight
from ..utils._threads import uses_n_jobs
from ..utils._validation import encode_classes, label_columns
from ..utils._warnings import warn_user
from . import _dask
from ._keys import FittedKeys
from ._learned import LearnedMetric
from ._queries import query_rows_in_chunks
from ._strategy import FIXED_METRICS, TORCH_DTYPES, FixedMetric, PrecomputedMetric
from ._target_statistics import target_numbers
from ._training_settings import _STATISTICS_MAX_TARGETS
from ._weights import neighbour_weighting

# The metric strategy of each value of ``metric``.
STRATEGIES = {**{name: FixedMetric for name in FIXED_METRICS}, "precomputed": PrecomputedMetric,
              **{name: LearnedMetric for name in LEARNED_METRICS}}


class _BaseMetricAttention(EstimatorMixin, DevicePortableMixin, BaseEstimator):
    """Parameters, validation and fitted attributes shared by the metric-attention estimators
    (see the module for the two collaborators they hold once fitted)."""

    _parameter_constraints: dict = {
        "metric": [StrOptions(set(METRICS) | {"precomputed"})],
        "p": [Interval(Real, 1, None, closed="left")],
        "categorical_features": ["array-like", StrOptions({"from_dtype"}), None],
        "numeric_embedding": [StrOptions({"auto", "plr", "none"})],
        "temperature": [Interval(Real, 0, None, closed="both"), StrOptions({"auto"})],
        "n_neighbors": [Count(Integral, 1, None, closed="left"), None],
        "prototypes": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left"), None],
        "radius": [Interval(Real, 0, None, closed="both"), None],  # (0 and inf as sklearn's)
        "weights": [StrOptions({"uniform", "distance"}), callable],
        "n_components": [Count(Integral, 1, None, closed="left"), None],
        "hidden_size": [Count(Integral, 1, None, closed="left")],
        "n_blocks": [Count(Integral, 0, None, closed="left")],
        "activation": [StrOptions({"relu", "tanh", "gelu"})],
        "dropout": [Interval(Real, 0, 1, closed="left")],
        "max_iter": [Count(Integral, 1, None, closed="left")],
        "batch_size": [Count(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "sample_rate": [Interval(Real, 0, 1, closed="right"), StrOptions({"auto"})],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Count(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "warm_start": ["boolean"],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "device": [str, torch.device],
        "dtype": [DtypeOptions(set(TORCH_DTYPES)), None],
        "n_jobs": [Integral, None],
    }

    def __init__(self, metric="tabular", *, temperature="auto", n_neighbors=None, radius=None,
                 weights="uniform", p=2, prototypes="auto",
                 n_components=None, numeric_embedding="auto", hidden_size=256, n_blocks=1,
                 activation="relu", dropout=0.0, max_iter=100, batch_size="auto",
                 learning_rate=1e-2, weight_decay=2e-4, sample_rate="auto", early_stopping=True,
                 validation_fraction=0.15, n_iter_no_change=3, tol=1e-4, warm_start=False,
                 random_state=None, verbose=0, device="auto", dtype=None, n_jobs=None,
                 categorical_features="from_dtype"):
        self.metric = metric
        self.temperature = temperature
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.weights = weights
        self.p = p
        self.prototypes = prototypes
        self.n_components = n_components
        self.numeric_embedding = numeric_embedding
        self.hidden_size = hidden_size
        self.n_blocks = n_blocks
        self.activation = activation
        self.dropout = dropout
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.sample_rate = sample_rate
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose
        self.device = device
        self.dtype = dtype
        self.n_jobs = n_jobs
        self.categorical_features = categorical_features


    # ------------------------------------------------------------------ fit

    def _fit_subtasks(self):
        """Subtasks of the fit for scikit-learn's callbacks: the training epochs."""
        return self.max_iter if STRATEGIES[self.metric].learned else 0

    def _validate_train(self, X, y, sample_weight=None, **y_checks):
        """``(X_encoded, y)``: scikit-learn's checks of ``X`` and ``y``, then ``X`` (numbers,
        booleans, categories, strings, missing values, sparse) as the dense float matrix the
        engine takes, by the metric strategy this fit uses (``self._strategy``). The training
        rows' target statistics (where the encoding takes them) weigh rows by
        ``sample_weight``.

        A warm start of a learned metric continues the previous fit's strategy: its encoding,
        which the map was trained on, and its map.
        """
        previous = getattr(self, "_strategy", None)
        if not (self.warm_start and isinstance(previous, LearnedMetric)
                and previous.metric == self.metric and previous.map is not None):
            previous = None
        if previous is not None:  # (before any state changes: a refusal leaves the model)
            previous.check_same_architecture(self)
        strategy = previous or STRATEGIES[self.metric](self.metric)
        strategy.p = float(self.p)
        # X first: its errors name X; a warm start checks X against the kept encoding (as
        # predict does: scikit-learn's errors, naming the estimator, for other features)
        X_checked = strategy.input.check(self, X, reset=previous is None)
        names = self.__dict__.get("feature_names_in_")
        y = validate_data(self, "no_validation", y, **y_checks)  # (which forgets X's names)
        if names is not None:
            self.feature_names_in_ = names
        check_consistent_length(X_checked, y)
        statistics = None
        if previous is None:
            classes = not y_checks.get("y_numeric", False)
            weight = (None if sample_weight is None
                      else _check_sample_weight(sample_weight, X_checked, dtype=np.float64,
                                           ensure_non_negative=True))
            statistics = strategy.input.fit(
                X_checked, self.categorical_features,
                lambda: target_numbers(y, classes, _STATISTICS_MAX_TARGETS), weight,
                self.random_state)
        elif unseen := strategy.input.encoder.unseen_columns(X_checked):
            warn_user(
                f"warm_start keeps the first fit's encoding: most values of {unseen} are levels "
                "it did not see, which it reads as one 'unseen' level; fit with "
                "warm_start=False to encode them.")
        strategy.input.check_dense_fits(X_checked)
        self._strategy = strategy
        return np.concatenate(list(strategy.input.blocks(X_checked, statistics))), y

    def _fit_labels(self, X, y, sample_weight, same_classes_on_warm_start=False,
                    multi_output=False, single_class=False):
        """Fit on class labels: the one-hot labels are the values, ``class_weight`` a key prior.

        ``same_classes_on_warm_start``: a warm start must see the classes of the previous fit.
        ``multi_output``: ``y`` may have several columns (outputs), each with its own classes;
        the values are their one-hot blocks side by side, ``classes_`` a list (as in
        :class:`~sklearn.neighbors.KNeighborsClassifier`). A learned metric then trains on the
        squared error of the blocks (the log-loss of one block does not extend to several).
        ``single_class``: an output may have a single class (then predicted everywhere).
        """
        X, y = self._validate_train(X, y, sample_weight, multi_output=multi_output)
        y = label_columns(y)
        self.outputs_2d_ = y.ndim == 2
        columns = y if self.outputs_2d_ else y[:, None]
        per_output, encoded = zip(*(encode_classes(self, column, single_class)
                                    for column in columns.T), strict=True)
        classes = list(per_output) if self.outputs_2d_ else per_output[0]
        if (same_classes_on_warm_start and self.warm_start and hasattr(self, "classes_")
                and not _same_classes(classes, self.classes_)):
            raise ValueError("warm_start needs the same classes as the previous fit: it had "
                             f"{self.classes_}, y has {classes}.")
        self.classes_ = classes
        key_weight = None
        if self.class_weight is not None:
            key_weight = compute_sample_weight(self.class_weight, y)
        # each output's labels as columns of the side-by-side one-hot blocks
        offsets = np.cumsum([0] + [c.size for c in per_output])
        self._fit_y = np.column_stack(encoded) + offsets[:-1]
        # float64 whatever X: the exact configurations average them in float64, as
        # scikit-learn counts its votes (the engine converts them to the compute dtype
        # elsewhere)
        values = np.zeros((X.shape[0], offsets[-1]))
        values[np.arange(X.shape[0])[:, None], self._fit_y] = 1
        single = self._fit_y.shape[1] == 1
        self._fit_attention(
            X, values, sample_weight, key_weight, loss="log_loss" if single else "squared_error",
            stratify=self._fit_y[:, 0] if single else None,
        )
        return self

    def _fit_attention(self, X, values, sample_weight, key_weight=None, loss="log_loss",
                       stratify=None, train_values=None):
        """Validate weights, fit the metric (map and temperature) and store the fitted keys.

        ``values`` are what attention propagates (one-hot labels or targets); ``train_values``,
        if given, replace them during training (standardised targets: attention outputs are convex
        combinations, so propagating affinely transformed values commutes with the transform).
        ``key_weight`` multiplies ``sample_weight`` (class weights); zero weight removes a key.
        """
        self._strategy.check_fit_params(self)
        device = resolve_device(self.device)  # fail early and clearly on an unavailable device
        n_samples = X.shape[0]
        sample_weight = _check_sample_weight(
            sample_weight, X, dtype=np.float64, ensure_non_negative=True
        )
        prior_weight = sample_weight if key_weight is None else sample_weight * key_weight
        if not np.any(prior_weight > 0):
            raise ValueError(
                "Sample weights must contain at least one non-zero number: all are zero."
            )
        if self.n_neighbors is not None and self.n_neighbors > n_samples:
            raise ValueError(
                f"n_neighbors={self.n_neighbors} is larger than the number of training samples "
                f"(n_samples={n_samples})."
            )
        if self.weights != "uniform":
            _check_distance_weighting(self, prior_weight)
        with np.errstate(divide="ignore"):
            log_prior = np.log(prior_weight)
        strategy = self._strategy
        dtype = strategy.compute_dtype(self.dtype, X.dtype)
        _check_values_fit_dtype(self, values, dtype)
        self.n_samples_fit_ = n_samples

        def epoch_model(fitted_strategy, temperature):
            # the model as it stands after a training epoch, for scikit-learn's callbacks
            keys = FittedKeys(X, values, log_prior, fitted_strategy.keys(X, device, dtype),
                              fitted_strategy.engine_metric)
            return {"map_": fitted_strategy.map, "temperature_": temperature,
                    "_strategy": fitted_strategy, "_keys": keys}

        fit = strategy.fit(self, X, values, train_values, sample_weight, prior_weight, loss,
                           stratify, getattr(self, "_loo_loss", None), device, epoch_model)
        self.map_ = fit.map
        self.loss_curve_ = fit.loss_curve
        self.n_iter_ = fit.n_iter
        self.validation_scores_ = fit.validation_scores
        self.validation_loss_curve_ = fit.validation_loss_curve
        self.best_validation_score_ = fit.best_validation_score
        self.temperature_ = fit.temperature
        points = strategy.keys(X, device, dtype)
        summary = strategy.summarize(points, values, log_prior, X)
        self._keys = FittedKeys(X, values, log_prior, points, strategy.engine_metric, summary)
        if "prototypes" in self._parameter_constraints:
            self.n_prototypes_ = None if summary is None else summary.n_groups
            self.prototype_error_ = strategy.prototype_error

    def _fit_sharded(self, X, y, sample_weight):
        """Fit on the Dask collection ``X``: the fitted settings on a sample drawn from its
        partitions, the keys sharded over the cluster (docs/scaling.md); returns the plan
        (:class:`~._dask.ShardedFit`)."""
        plan = _dask.ShardedFit(self, X, y, sample_weight)
        Xs, ys, ws = plan.sample(self)
        type(self).fit(self, Xs, ys, sample_weight=ws)  # the in-memory fit of the sample
        self._keys = plan.keys(self)
        self.n_samples_fit_ = plan.n
        if "prototypes" in self._parameter_constraints:
            # sharded keys attend exactly (prototypes of the sample's keys would not be theirs)
            self._strategy.prototypes = self._strategy.prototype_error = None
            self.n_prototypes_ = self.prototype_error_ = None
        return plan

    # ------------------------------------------------------------------ predict

    def _compute_dtype(self):
        """Precision of attention and of the map at prediction (see the metric strategies)."""
        return self._strategy.compute_dtype(self.dtype, self._keys.inputs.dtype)

    def _engine_kwargs(self, device, temperature=None):
        """The engine's arguments for the estimator's attention on ``device``."""
        return self._strategy.engine_kwargs(self, self._keys.log_prior, self._keys.inputs.dtype,
                                            device, temperature)

    def _query_blocks(self, X):
        """Encoded blocks of the query rows ``X``: a few rows (a web service's single row)
        encoded directly as one block, other inputs in blocks within the memory budget.
        Returns ``(blocks, few_rows)``."""
        check_is_fitted(self, "_keys")
        rows = None if self._keys.sharded else self._strategy.input.few_rows(self, X)
        if rows is not None:
            return [rows], True
        return self._encoded_blocks(X), False

    def _encoded_blocks(self, X):
        """Encoded blocks of the query rows ``X``, each within the memory budget."""
        check_is_fitted(self, "_keys")
        return self._strategy.input.blocks(self._strategy.input.check(self, X, reset=False))

    def _embedded_blocks(self, X, device):
        """``(Z, exclude_self)`` per block of queries mapped into the metric space; ``X=None``:
        the training points, each masked as its own neighbour."""
        dtype = self._compute_dtype()
        if X is None:
            check_is_fitted(self, "_keys")
            inputs = self._keys.inputs
            n = inputs.shape[0]
            rows = plan_rows(n, row_bytes=8 * inputs.shape[1], budget=budget_bytes())
            for start in range(0, n, rows):
                stop = min(n, start + rows)
                Z = self._strategy.embed(inputs[start:stop], "query", device, dtype)
                yield Z, np.arange(start, stop)
            return
        blocks, _ = self._query_blocks(X)
        for block in blocks:
            yield self._strategy.embed(block, "query", device, dtype), False

    def _propagate(self, X):
        """Attention of the rows of ``X`` over the training set, applied to the fitted values,
        and with a radius the mask of the queries that have no training point within it (their
        rows are 0; ``None`` without a radius)."""
        blocks, few_rows = self._query_blocks(X)
        device = resolve_device(self.device)
        kwargs = self._engine_kwargs(device)
        weighting = neighbour_weighting(self)
        out, no_neighbour, offsets = [], [], []
        for block in blocks:
            if weighting is not None:
                Z = self._strategy.embed(block, "query", device, kwargs["dtype"])
                block_out, block_empty = weighting.propagate(
                    self._keys, self._strategy, Z, partial(self._selection_kwargs, device))
            else:
                block_out, block_empty = self._keys.propagate(self._strategy, block, kwargs,
                                                              self.verbose, few_rows)
            out.append(block_out)
            no_neighbour.append(block_empty)
            offsets.append(self._value_offset(block))
        out = self._plus_value_offsets(np.concatenate(out), offsets)
        return out, None if self.radius is None else np.concatenate(no_neighbour)

    def _value_offset(self, block):
        """What the propagated values are added to for the encoded query rows ``block``
        (``None``: nothing; the regressor's linear trend)."""
        return None

    @staticmethod
    def _plus_value_offsets(out, offsets):
        """``out`` plus the per-block ``offsets`` (:meth:`_value_offset` of each query block,
        in order; ``None`` where there are none)."""
        if not offsets or offsets[0] is None:
            return out
        return out + np.concatenate(offsets)

    def _dask_block_tasks(self, method, blocks):
        """Delayed ``<method>`` of Dask query blocks over keys sharded on the cluster (``None``
        for an in-memory model: the caller ships the model itself)."""
        return _dask.block_tasks(self, method, blocks) if self._keys.sharded else None

    @uses_n_jobs
    def attention_weights(self, X=None, n_weights=None):
        """The largest attention weights behind each prediction and the training points they
        fall on.

        The attention analogue of :meth:`~sklearn.neighbors.KNeighborsClassifier.kneighbors`.
        The weights are those of exact attention over every training point, also where dense
        prediction runs over prototypes of them (``n_prototypes_``).

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
        check_is_fitted(self, "_keys")
        if n_weights is None:
            n_weights = (
                self.n_neighbors if self.n_neighbors is not None else min(10, self.n_samples_fit_)
            )
        if (
            X is None
            and self.n_neighbors is not None
            and self.n_neighbors >= self.n_samples_fit_
        ):
            raise ValueError(
                f"n_neighbors={self.n_neighbors} leaves no room to exclude each training point "
                f"from its own row ({self.n_samples_fit_} samples)."
            )
        # the engine's check of n_weights, against a selection's keys, comes with the first
        # chunk: before it, one against every key keeps the result's allocation sound
        if (not isinstance(n_weights, Integral) or isinstance(n_weights, bool)
                or not 0 < n_weights <= self._keys.n_samples):
            raise ValueError(f"n_weights must be a positive integer at most the "
                             f"{self._keys.n_samples} training points, got {n_weights!r}.")
        device = resolve_device(self.device)
        kwargs = self._engine_kwargs(device)

        def chunk(Z, own):
            radius = ({} if self.radius is None else
                      self._strategy.radius_kwargs(Z, self.radius, kwargs["log_prior"]))
            return self._keys.weights(Z, own, n_weights, dict(kwargs, **radius), self.verbose)

        # padding weighs 0 on index -1: n_weights columns whatever each row holds
        return tuple(query_rows_in_chunks(self, X, device, [(n_weights, np.float64),
                                                            (n_weights, np.int64)],
                                          32 * n_weights, chunk))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # the tabular encoder: missing values, sparse matrices, category and string columns
        tags.input_tags.allow_nan = True
        # sparse matrices are numeric only: columns named categorical refuse them at fit
        tags.input_tags.sparse = not _names_categorical_columns(self.categorical_features)
        tags.input_tags.categorical = True
        tags.input_tags.string = True
        strategy = STRATEGIES.get(self.metric) if isinstance(self.metric, str) else None
        # tags are read before fit validates the parameters (an unknown metric: fit's error)
        return tags if strategy is None else strategy.tags(tags, self.device)


def _names_categorical_columns(categorical_features):
    """Whether ``categorical_features`` makes some column categorical whatever the data (a
    mask with a True, indices or names), rather than reading the kinds from the dtypes."""
    if categorical_features is None or isinstance(categorical_features, str):
        return False
    selection = np.asarray(categorical_features)
    return bool(selection.any()) if selection.dtype == bool else selection.size > 0


def _check_distance_weighting(estimator, prior_weight):
    """weights other than "uniform" weigh a selection of equally weighted training points."""
    if (estimator.n_neighbors is None and estimator.radius is None
            and estimator.temperature != 0):
        raise ValueError(
            f"weights={estimator.weights!r} weighs selected neighbours: set n_neighbors or "
            "radius (or temperature=0), or use weights='uniform'."
        )
    positive = prior_weight[prior_weight > 0]
    if np.ptp(positive) > 0:
        raise ValueError(
            f"weights={estimator.weights!r} needs equal weights of the training points: "
            "sample_weight and class_weight are not supported with it."
        )


def _check_values_fit_dtype(estimator, values, dtype):
    """A clear error at fit for values (targets) that attention in ``dtype`` would overflow
    summing over the training points, rather than a failing predict."""
    if not values.size:
        return
    peak = float(np.abs(values).max())
    limit = torch.finfo(dtype).max / values.shape[0]
    if peak > limit:
        raise ValueError(
            f"{type(estimator).__name__}: y reaches {peak:.3g} in magnitude (less the trend, for "
            f"a regressor), beyond what attention in {str(dtype).split('.')[-1]} can sum over "
            f"{values.shape[0]} training points (up to {limit:.3g}); pass dtype='float64' or "
            "rescale y."
        )


def _same_classes(a, b):
    """Whether two ``classes_`` (an array, or a list of arrays per output) are equal."""
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)))
    return np.array_equal(a, b)
