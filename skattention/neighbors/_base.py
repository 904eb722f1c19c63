"""Shared machinery of the metric-attention estimators (scikit-learn shells over the engine)."""

import copy
import math
from numbers import Integral, Real

import numpy as np
import torch
from scipy import sparse
from sklearn.base import BaseEstimator
from sklearn.model_selection import train_test_split
from sklearn.utils import check_consistent_length, check_random_state
from sklearn.utils.class_weight import compute_sample_weight
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine import (
    LEARNED_METRICS,
    METRICS,
    ProgressReport,
    attention,
    averaging_dtype,
    batch_rows,
    budget_bytes,
    build_map,
    calibrate_temperature,
    kneighbors,
    plan_rows,
    prepare_keys,
    progress_bar,
    resolve_device,
    rows_single_threaded,
    seeded_torch_rng,
    train_metric,
)
from ..utils._callbacks import EpochTasks
from ..utils._device import DevicePortableMixin, _cuda_nondeterministic
from ..utils._estimator import EstimatorMixin
from ..utils._param_validation import Count, Interval, StrOptions
from ..utils._sklearn_compat import _check_sample_weight
from ..utils._threads import uses_n_jobs
from ..utils._validation import encode_classes, label_columns
from . import _dask
from ._tabular import _CodesLayout, _DenseLayout, _TabularEncoder, pd, reject_infinity

# temperature="auto" with the fixed metric: leave-one-out choice on a geometric grid around the
# nearest-neighbour scale (weighted median squared distance from a point to its nearest distinct
# one).
_AUTO_TEMPERATURE_GRID = 2.0 ** np.arange(-3, 5)
_AUTO_TEMPERATURE_MAX_QUERIES = 2000
_AUTO_TEMPERATURE_CANDIDATES = 8

_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
# n_components=None: keep the inputs' dimension up to this many components (PCA beyond it)
_DEFAULT_MAX_COMPONENTS = 128
# n_components=None with metric="tabular" (the benchmark's DEV sets: no loss against 128, and
# a fifth less training time)
_TABULAR_COMPONENTS = 64
# numeric_embedding="auto": periodic embeddings of the numbers from this many training samples
# (smaller DEV sets of the tabular benchmark were better without)
_PLR_MIN_SAMPLES = 1500
# batch_size="auto": minibatch size (fewer points when working_memory is smaller)
_AUTO_BATCH = 1024
# sample_rate="auto": besides the minibatch, this share of the other training points, at most
# _AUTO_CANDIDATES of them, are each minibatch's candidate keys
_AUTO_CANDIDATE_SHARE = 0.5
_AUTO_CANDIDATES = 1024
# the same two with metric="tabular": minibatches of 256 and at most 256 other candidates
# (the tabular benchmark's DEV sets, 19 x 3 seeds, against 1,024 and 1,024: accuracy, AUC,
# log-loss and R^2 as good or better in every family, about half the fit time)
_TABULAR_BATCH = 256
_TABULAR_CANDIDATES = 256
# the validation pass of each epoch attends to at most this many training points
_VALIDATION_KEYS = 2048
# Validation and the kept model use an exponential moving average of the parameters (this
# decay per step, less where an epoch has fewer than 10 steps: the average spans at most an
# epoch), whose validation loss is smooth enough to stop after 3 epochs without improvement
# (the default n_iter_no_change). Chosen on the tabular benchmark's DEV sets (19 datasets, seeds
# 0-4, against the parameters themselves with patience 5): 15-31% fewer epochs, family means
# within 0.001 (accuracy, ROC-AUC, R^2) and 0.0016 (log-loss); metric="mlp" and "linear" on the
# continuous DEV sets (seeds 0-2): accuracy and ROC-AUC within 0.0005, log-loss within 0.0015.
# (A decay of 0.9 whatever the epoch's length was as good on DEV but lagged by epochs behind a
# linear map trained one step an epoch: see train_metric.)
_AVERAGE_DECAY = 0.9
# Rows mapped at once by the learned map (fewer when working_memory is smaller).
_EMBED_CHUNK = 65536
# Query arrays of at most this many rows take the few-rows path of predict (one block).
_FEW_ROWS = 16
# Queries whose candidate distances are gathered at once by the neighbour scale.
_SCALE_CHUNK = 256
# What validate_data checks of X before the tabular encoder reads it: any column types, missing
# values and sparse matrices pass; infinities, complex numbers and bad shapes do not.
_X_CHECKS = dict(dtype=None, accept_sparse=("csr", "csc"), ensure_all_finite="allow-nan")


class _BaseMetricAttention(EstimatorMixin, DevicePortableMixin, BaseEstimator):
    """Training, storage and engine calls shared by the metric-attention estimators.

    Inputs of any column types are encoded into one dense float matrix (``_validate_train``).
    The fixed metric ("euclidean") stores it as keys. Learned metrics see robust-scaled numbers,
    train a map by leave-one-out soft-neighbour likelihood, and store the training set
    mapped into the learned space as keys. Prediction is attention of the (mapped) queries over
    those keys, propagating ``self._fit_values``.
    """

    _parameter_constraints: dict = {
        "metric": [StrOptions(set(METRICS) | {"precomputed"})],
        "categorical_features": ["array-like", StrOptions({"from_dtype"}), None],
        "numeric_embedding": [StrOptions({"auto", "plr", "none"})],
        "temperature": [Interval(Real, 0, None, closed="both"), StrOptions({"auto"})],
        "n_neighbors": [Count(Integral, 1, None, closed="left"), None],
        "radius": [Interval(Real, 0, None, closed="neither"), None],
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
        "dtype": [StrOptions(set(_TORCH_DTYPES)), None],
        "n_jobs": [Integral, None],
    }

    def __init__(self, metric="tabular", *, temperature="auto", n_neighbors=None, radius=None,
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

    # ------------------------------------------------------------------ input

    def _validate_train(self, X, y, **y_checks):
        """``(X_encoded, y)``: scikit-learn's checks of ``X`` and ``y``, then ``X`` (numbers,
        booleans, categories, strings, missing values, sparse) as the dense float matrix the
        engine takes (see ``_TabularEncoder`` and ``_DenseLayout``).

        Learned metrics get robust-scaled numbers (the map learns the rest); fixed metrics get
        the numbers as they are, so that their distances stay those of the input. A warm start
        keeps the first fit's encoding, which the map was trained on.
        """
        y = validate_data(self, "no_validation", y, **y_checks)
        X_checked = self._check_X(X, reset=True)
        check_consistent_length(X_checked, y)
        if not (self.warm_start and getattr(self, "_encoder", None) is not None
                and getattr(self, "map_", None) is not None):
            self._encoder = _TabularEncoder(
                categorical_features=self.categorical_features,
                numeric_scaling="robust" if self.metric in LEARNED_METRICS else None,
                dtype=np.float64,
            ).fit(X_checked)
            # the tabular map looks category codes up; the other metrics take them one-hot
            layout = _CodesLayout if self.metric == "tabular" else _DenseLayout
            self._layout = layout(self._encoder)
        if sparse.issparse(X_checked):  # the dense training matrix must fit the budget
            plan_rows(None, row_bytes=0, budget=budget_bytes(), per="",
                      fixed_bytes=X_checked.shape[0] * self._layout.width * 8,
                      what="The dense form of the sparse training matrix",
                      hint="select or reduce columns (the engine stores the training points "
                           "densely)")
        return np.concatenate(list(self._encoded_blocks(X_checked))), y

    def _validate_queries(self, X):
        """Query rows encoded like the training rows, one bounded block at a time."""
        check_is_fitted(self)
        return self._encoded_blocks(self._check_X(X, reset=False))

    def _check_X(self, X, reset):
        """scikit-learn's checks of ``X`` (shape, feature names, infinities, complex numbers);
        returns what the encoder reads: a DataFrame as given (its column dtypes are the
        encoding's information), else the checked array or sparse matrix."""
        if (not reset and type(X) is np.ndarray and X.ndim == 2 and X.shape[0] > 0
                and X.dtype in (np.float64, np.float32)
                and X.shape[1] == getattr(self, "n_features_in_", None)
                and not hasattr(self, "feature_names_in_")):
            # What validate_data returns for a float array of the fitted width, without its
            # probes for DataFrame libraries (a third of a single-row predict's validation).
            reject_infinity(X)
            return X
        if pd is None or not isinstance(X, pd.DataFrame):
            return validate_data(self, X, reset=reset, **_X_CHECKS)
        if not reset and 0 < X.shape[0] <= _FEW_ROWS:
            rows = self._numeric_frame_rows(X)
            if rows is not None:
                return rows
        # names and width through an empty object-typed copy: converting the frame itself
        # would cast its category columns to float when another column is a nullable dtype
        validate_data(self, X.iloc[:0].astype(object), reset=reset, ensure_min_samples=0,
                      **_X_CHECKS)
        numbers = X.select_dtypes("number")
        if numbers.shape[1]:
            reject_infinity(numbers.to_numpy(np.float64, na_value=0))
        return X

    def _numeric_frame_rows(self, X):
        """A few rows of a DataFrame whose columns are NumPy numbers (integers, floats) and
        are named as at fit time, checked and as the array the encoder reads the same way
        (float32 when every column is, else float64: what the column-by-column conversion
        gives); ``None`` for any other frame. A one-row frame spent about 70% of its predict
        converting and checking column by column."""
        names = getattr(self, "feature_names_in_", None)
        columns = X.columns
        if (names is None or len(columns) != len(names)
                or not all(isinstance(c, str) for c in columns)
                or not all(a == b for a, b in zip(columns, names, strict=True))
                or not all(isinstance(d, np.dtype) and d.kind in "iuf" for d in X.dtypes)):
            return None
        rows = X.to_numpy(np.float32 if all(d == np.float32 for d in X.dtypes) else np.float64)
        reject_infinity(rows)
        return rows

    def _encoded_blocks(self, X):
        # float32 input stays float32 (as validate_data's dtype=[float64, float32] kept it)
        dtypes = X.dtypes if pd is not None and isinstance(X, pd.DataFrame) else [X.dtype]
        dtype = np.float32 if all(d == np.float32 for d in dtypes) else np.float64
        # per row: the densified input row, the encoder's numbers and codes, the dense output
        row_bytes = 8 * (2 * X.shape[1] + self._layout.width)
        rows = plan_rows(X.shape[0], row_bytes=row_bytes, budget=budget_bytes())
        for block in self._encoder.transform_blocks(X, rows):
            yield self._layout.dense(block, dtype)

    # ------------------------------------------------------------------ fit

    def _fit_labels(self, X, y, sample_weight, same_classes_on_warm_start=False,
                    multi_output=False):
        """Fit on class labels: the one-hot labels are the values, ``class_weight`` a key prior.

        ``same_classes_on_warm_start``: a warm start must see the classes of the previous fit.
        ``multi_output``: ``y`` may have several columns (outputs), each with its own classes;
        the values are their one-hot blocks side by side, ``classes_`` a list (as in
        :class:`~sklearn.neighbors.KNeighborsClassifier`). A learned metric then trains on the
        squared error of the blocks (the log-loss of one block does not extend to several).
        """
        X, y = self._validate_train(X, y, multi_output=multi_output)
        y = label_columns(y)
        self.outputs_2d_ = y.ndim == 2
        columns = y if self.outputs_2d_ else y[:, None]
        per_output, encoded = zip(*(encode_classes(self, column) for column in columns.T),
                                  strict=True)
        classes = list(per_output) if self.outputs_2d_ else per_output[0]
        if (same_classes_on_warm_start and self.warm_start and hasattr(self, "classes_")
                and not _same_classes(classes, self.classes_)):
            raise ValueError("warm_start needs the same classes as the previous fit.")
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

    def _fit_attention(
        self,
        X,
        values,
        sample_weight,
        key_weight=None,
        loss="log_loss",
        stratify=None,
        train_values=None,
    ):
        """Validate weights; store keys, values, log-prior and temperature (training if learned).

        ``values`` are what attention propagates (one-hot labels or targets); ``train_values``,
        if given, replace them during training (standardised targets: attention outputs are convex
        combinations, so propagating affinely transformed values commutes with the transform).
        ``key_weight`` multiplies ``sample_weight`` (class weights); zero weight removes a key.
        """
        resolve_device(self.device)  # fail early and clearly on an unavailable device
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
                f"({n_samples})."
            )
        self._fit_X = X
        self._fit_values = values
        with np.errstate(divide="ignore"):
            self._log_prior = np.log(prior_weight)
        self.n_samples_fit_ = n_samples
        if self.metric in LEARNED_METRICS:
            self._fit_learned(
                X, values if train_values is None else train_values, prior_weight, loss, stratify
            )
            return
        self._fit_Z = X
        self.map_, self.loss_curve_, self.n_iter_ = None, [], 0
        self.validation_scores_ = self.validation_loss_curve_ = self.best_validation_score_ = None
        if isinstance(self.temperature, str):
            self.temperature_ = self._auto_temperature(sample_weight)
        else:
            self.temperature_ = float(self.temperature)

    def _fit_learned(self, X, values, weight, loss, stratify):
        """Train the map and temperature by leave-one-out soft-neighbour likelihood.

        A finite positive ``temperature`` is fixed during training; ``"auto"`` is learned. The
        limits 0 and inf have no gradient: the metric is then trained with a learned temperature
        and the limit is used at prediction (1-NN or k-NN in the learned metric).
        """
        rng = check_random_state(self.random_state)
        device = resolve_device(self.device)
        dtype = _TORCH_DTYPES[self.dtype or "float32"]  # training precision
        warm = self.warm_start and getattr(self, "map_", None) is not None
        if warm and self.map_.n_features != X.shape[1]:
            raise ValueError(
                f"warm_start: X has {X.shape[1]} features but the map was trained on "
                f"{self.map_.n_features}."
            )
        seed = int(rng.randint(np.iinfo(np.int32).max))
        # A private, seeded torch RNG for initialisation and dropout; the caller's is restored.
        with seeded_torch_rng(seed, device) as release_rng:
            generator = torch.Generator().manual_seed(seed)
            if not warm:
                self.map_ = self._build_map(X, rng)
            metric_map = self.map_.to(device=device, dtype=dtype)
            release_rng(metric_map)  # training draws only from `generator` (unless dropout)
            Xt = torch.as_tensor(X, dtype=dtype, device=device)
            Vt = torch.as_tensor(values, dtype=dtype, device=device)
            Wt = torch.as_tensor(weight, dtype=dtype, device=device)
            log_t = self._initial_log_temperature(metric_map, Xt, weight, warm, dtype, device)
            train_idx, val_idx = self._validation_split(X.shape[0], stratify, rng)
            validation = None
            if val_idx is not None:
                validation = (Xt[val_idx], Vt[val_idx], Wt[val_idx])
                Xt, Vt, Wt = Xt[train_idx], Vt[train_idx], Wt[train_idx]
                if not bool((Wt > 0).any()):
                    raise ValueError(
                        "All training sample weights are zero after the validation split."
                    )
            batch_size, n_candidates = self._batch_and_candidates(
                Xt.shape[0], Vt.shape[1], Xt.element_size()
            )
            previous = getattr(self, "_history", None) if warm else None
            name = type(self).__name__
            with progress_bar(
                self.verbose, total=self.max_iter, desc=f"{name} fit", unit="epoch"
            ) as bar:
                report = ProgressReport(
                    bar, name, self.max_iter, self.verbose, validating=validation is not None,
                    first=previous.n_iter if previous else 0,
                )
                history, state = train_metric(
                    metric_map, log_t, Xt, Vt, loss, Wt, validation=validation,
                    max_iter=self.max_iter, batch_size=batch_size, n_candidates=n_candidates,
                    learning_rate=self.learning_rate, weight_decay=self.weight_decay,
                    n_iter_no_change=self.n_iter_no_change, tol=self.tol, generator=generator,
                    max_validation_keys=_VALIDATION_KEYS, history=previous,
                    average=_AVERAGE_DECAY,
                    optimizer_state=getattr(self, "_optimizer_state", None) if warm else None,
                    callbacks=[report, EpochTasks(self, lambda: self._epoch_attributes(
                        X, metric_map, log_t))],
                )
            if validation is not None and self.temperature == "auto":
                calibrate_temperature(metric_map, log_t, Xt, Vt, Wt, validation, loss)
        self.map_ = metric_map.to(device="cpu", dtype=torch.float32)
        self._optimizer_state = _to_cpu(state)
        self._history = history
        self.temperature_ = float(torch.exp(log_t.detach()).cpu())
        if self.temperature in (0, math.inf):
            self.temperature_ = float(self.temperature)
        self.loss_curve_ = list(history.loss_curve)
        self.validation_scores_ = (
            list(history.validation_scores) if validation is not None else None
        )
        self.validation_loss_curve_ = (
            list(history.validation_losses) if validation is not None else None
        )
        self.best_validation_score_ = (
            history.best_validation_score if validation is not None else None
        )
        self.n_iter_ = history.n_iter
        self._fit_Z = self._embed(X, side="key")

    def _epoch_attributes(self, X, metric_map, log_temperature):
        """The fitted attributes of the model as it stands after a training epoch, for
        scikit-learn's callbacks (``ScoringMonitor`` scores it): copies of the map and
        temperature being trained, and the training keys embedded by that map (``X`` the
        encoded training inputs). The attributes that training does not change are already set.
        """
        fitted = {"map_": copy.deepcopy(metric_map).to(device="cpu", dtype=torch.float32).eval()}
        fitted["temperature_"] = (
            float(self.temperature) if self.temperature in (0, math.inf)
            else float(torch.exp(log_temperature.detach()).cpu())
        )
        probe = copy.copy(self)  # embeds with the copied map, as _fit_learned does at its end
        probe.__dict__.update(fitted)
        fitted["_fit_Z"] = probe._embed(X, side="key")
        return fitted

    def _build_map(self, X, rng):
        """The untrained map of a learned metric for the encoded training inputs ``X``."""
        if self.metric == "tabular":
            numeric_embedding = self.numeric_embedding
            if numeric_embedding == "auto":
                numeric_embedding = "plr" if X.shape[0] >= _PLR_MIN_SAMPLES else "none"
            return build_map(
                "tabular", n_components=self.n_components or _TABULAR_COMPONENTS,
                n_numeric=self._layout.n_numeric, cardinalities=self._layout.cardinalities,
                numeric_embedding=numeric_embedding,
            )
        init = _initial_projection(X, self.n_components, rng)
        return build_map(
            self.metric, init, hidden_size=self.hidden_size, n_blocks=self.n_blocks,
            activation=self.activation, dropout=self.dropout,
        )

    def _batch_and_candidates(self, n_train, n_values, itemsize):
        """Minibatch size and candidate keys per minibatch (the minibatch included).

        ``"auto"``: minibatches of 1,024 points (256 with ``metric="tabular"``; capped by
        ``working_memory``; a larger explicit batch is split into gradient-accumulated chunks
        by ``train_metric``), each attending to itself and to half of the other points, at
        most 1,024 of them (256 with ``metric="tabular"``; ModernNCA's sampling).
        """
        auto_batch, auto_others = ((_TABULAR_BATCH, _TABULAR_CANDIDATES) if self.metric == "tabular"
                                   else (_AUTO_BATCH, _AUTO_CANDIDATES))
        batch = min(n_train, auto_batch if self.batch_size == "auto" else self.batch_size)
        if self.sample_rate == "auto":
            others = min(math.ceil(_AUTO_CANDIDATE_SHARE * (n_train - batch)), auto_others)
            n_candidates = min(n_train, batch + others)
        else:
            n_candidates = max(1, int(math.ceil(self.sample_rate * n_train)))
        if self.batch_size == "auto":
            batch = min(batch, batch_rows(n_candidates, n_values, self.map_.n_components,
                                          itemsize))
        return batch, n_candidates

    def _initial_log_temperature(self, metric_map, Xt, weight, warm, dtype, device):
        if not isinstance(self.temperature, str) and 0 < self.temperature < math.inf:
            return torch.tensor(math.log(self.temperature), dtype=dtype, device=device)
        if metric_map.kind == "euclidean":
            # ModernNCA: the map learns the scale at a fixed temperature (1, or the calibrated
            # one on a warm start), which is calibrated on the validation points afterwards
            start = self.temperature_ if warm and 0 < self.temperature_ < math.inf else 1.0
            return torch.tensor(math.log(start), dtype=dtype, device=device)
        if warm and 0 < self.temperature_ < math.inf:
            start = self.temperature_
        elif metric_map.kind == "dot":
            start = math.sqrt(Xt.shape[1])  # the usual 1/sqrt(d) scaling of dot-product attention
        else:
            metric_map.eval()  # no dropout in the starting scale
            with torch.no_grad():
                Z = metric_map.key(Xt[: _AUTO_TEMPERATURE_MAX_QUERIES * 4]).cpu().double().numpy()
            queries = np.arange(min(Z.shape[0], _AUTO_TEMPERATURE_MAX_QUERIES))
            with np.errstate(divide="ignore"):
                log_w = np.log(weight[: Z.shape[0]])
            start = _neighbor_scale(Z, queries, weight[: Z.shape[0]], log_w, self.device)
        # A starting temperature whose exp under- or overflows the training dtype would become
        # 0 or inf, the limits without a gradient: keep it well inside the dtype's range.
        info = torch.finfo(dtype)
        log_start = min(max(math.log(start), 0.5 * math.log(info.tiny)), 0.5 * math.log(info.max))
        return torch.tensor(log_start, dtype=dtype, device=device, requires_grad=True)

    def _validation_split(self, n, stratify, rng):
        if not self.early_stopping:
            return None, None
        n_val = int(math.ceil(self.validation_fraction * n))
        if n_val < 1 or n - n_val < 2:
            return None, None
        idx = np.arange(n)
        strat = stratify
        if strat is not None:
            counts = np.bincount(strat)
            if counts[counts > 0].min() < 2 or n_val < np.count_nonzero(counts):
                strat = None  # too small to stratify
        train_idx, val_idx = train_test_split(
            idx, test_size=n_val, random_state=rng, stratify=strat
        )
        return torch.as_tensor(np.sort(train_idx)), torch.as_tensor(np.sort(val_idx))

    # ------------------------------------------------------------------ fixed metric temperature

    def _auto_temperature(self, sample_weight):
        """Temperature with the lowest leave-one-out loss on a grid around the neighbour scale.

        Each training point (a subsample of at most ``_AUTO_TEMPERATURE_MAX_QUERIES``) is
        predicted from the others with this estimator's own masks and sample weights (class
        weights are a prior applied afterwards, not a property of the geometry), and the loss is
        weighted by sample weight. Weights act as counts: leaving a point of weight ``w`` out
        keeps ``max(w - 1, 0)`` of it, so an integer weight is exactly a repeated point.
        """
        Z = self._fit_Z
        with np.errstate(divide="ignore"):
            log_weight = np.log(sample_weight)
        positive = np.flatnonzero(sample_weight > 0)
        if positive.size < 2:
            return 1.0
        if positive.size > _AUTO_TEMPERATURE_MAX_QUERIES:
            positive = positive[
                np.linspace(0, positive.size - 1, _AUTO_TEMPERATURE_MAX_QUERIES).astype(int)
            ]
        scale = _neighbor_scale(
            Z, positive, sample_weight, log_weight, self.device, self._compute_dtype()
        )
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
            pred = attention(Z[positive], Z, self._fit_values, on_empty="zero", **kwargs)
            loss = self._loo_loss(np.asarray(pred, dtype=np.float64), positive, w)
            if loss < best_loss:
                best, best_loss = float(temperature), loss
        return best

    # ------------------------------------------------------------------ engine calls

    def _compute_dtype(self):
        """Precision of attention and of the map at prediction: ``dtype``; else float32 for
        the learned metrics (the precision their map is trained in: float64 only doubled the
        keys' memory and the time of their products), the data's for the fixed ones."""
        if self.dtype is not None:
            return _TORCH_DTYPES[self.dtype]
        if self.metric in LEARNED_METRICS:
            return torch.float32
        return torch.float32 if self._fit_X.dtype == np.float32 else torch.float64

    def _engine_metric(self):
        return METRICS[self.metric]

    def _engine_kwargs(self, temperature=None, queries=None):
        """The engine's arguments for the estimator's attention; ``queries``: the mapped query
        block of the call (a precomputed metric's radius mask is read from it)."""
        return dict(
            metric=self._engine_metric(),
            temperature=self.temperature_ if temperature is None else temperature,
            n_neighbors=self.n_neighbors,
            radius=self.radius,
            log_prior=self._log_prior,
            device=self.device,
            dtype=self._compute_dtype(),
        )

    def _engine_keys(self):
        """The fitted keys prepared for the engine once per compute device and dtype."""
        if _dask.is_sharded(self):
            raise NotImplementedError(
                "This model's keys are sharded over a Dask cluster (it was fitted on a Dask "
                "collection): predict, predict_proba, score and kneighbors(X) run on them. "
                "Pickle and load it (an in-memory model), or refit on in-memory data, for the "
                "other methods."
            )
        metric = self._engine_metric()
        return self._on_device(
            ("keys", metric), self._fit_Z, resolve_device(self.device), self._compute_dtype(),
            lambda Z, device, dtype: prepare_keys(Z, metric=metric, device=device, dtype=dtype),
        )

    def _ready_for_queries(self):
        """``(map, keys, values, log_prior)`` on the compute device and dtype, as
        :meth:`_embed`, :meth:`_engine_keys` and :meth:`_engine_per_key` give them (the map
        ``None`` for a fixed metric), looked up once per call for the few-rows path."""
        device, dtype = resolve_device(self.device), self._compute_dtype()

        def ready(fit_values, device, dtype):
            metric_map = None
            if self.metric in LEARNED_METRICS:
                metric_map = self._on_device("map", self.map_, device, dtype, _map_for_inference)
            keys = self._engine_keys()
            return (metric_map, keys, *self._engine_per_key(keys, self._log_prior))

        # every fit replaces the fitted values (and the map, keys and log-prior with them)
        return self._on_device(("ready", self.metric), self._fit_values, device, dtype, ready)

    def _engine_per_key(self, keys, log_prior):
        """``(values, log_prior)``: the fitted values and the per-key log-prior as tensors on
        the device and dtype of the prepared ``keys``, converted once per fit; the engine
        remembers them checked, so a single-row predict does not check them again. The values
        keep float64 where the engine averages them in float64 (``averaging_dtype``: the
        configurations equal to scikit-learn's neighbour estimators)."""
        device, dtype = keys.raw.device, keys.raw.dtype
        values_dtype = averaging_dtype(self._fit_values, float(self.temperature_), dtype,
                                       device)

        def to_tensor(array, device, dtype):
            if array is None or not isinstance(array, np.ndarray):
                return array
            return torch.tensor(array, device=device, dtype=dtype)

        return (self._on_device("values", self._fit_values, device, values_dtype, to_tensor),
                self._on_device("log_prior", log_prior, device, dtype, to_tensor))

    def _embed(self, X, side="query"):
        """Inputs mapped into the space where attention scores are computed (NumPy)."""
        if self.metric not in LEARNED_METRICS:
            return X
        device = resolve_device(self.device)
        dtype = self._compute_dtype()
        metric_map = self._on_device("map", self.map_, device, dtype, _map_for_inference)
        out = np.empty(
            (X.shape[0], self.map_.n_components),
            dtype=np.float32 if dtype == torch.float32 else np.float64,
        )
        # per row: its tensor and the map's activations
        item = torch.finfo(dtype).bits // 8
        row_bytes = item * (X.shape[1] + self.map_.activation_width())
        rows = plan_rows(
            X.shape[0], row_bytes=row_bytes, budget=budget_bytes(), max_rows=_EMBED_CHUNK
        )
        with torch.no_grad():
            for start in range(0, X.shape[0], rows):
                batch = slice(start, start + rows)
                xb = torch.as_tensor(X[batch], dtype=dtype, device=device)
                out[batch] = metric_map.images(xb, side).cpu().numpy()
        return out

    def _propagate(self, X):
        """Attention of the rows of ``X`` over the training set, applied to the fitted values,
        and with a radius the mask of the queries that have no training point within it (their
        rows are 0; ``None`` without a radius)."""
        few = self._propagate_few_rows(X)
        if few is not None:
            return few, None
        if _dask.is_sharded(self):
            return _dask.propagate(self, X)
        blocks = self._validate_queries(X)
        values, on_empty = self._fit_values, "raise"
        if self.radius is not None:
            # A column of ones tells the queries with no neighbour: their weights sum to 0.
            ones = np.ones((values.shape[0], 1), dtype=values.dtype)
            values, on_empty = np.hstack([values, ones]), "zero"
        out, offsets = [], []
        keys = self._engine_keys()
        for block in blocks:
            Z = self._embed(block)
            kwargs = self._engine_kwargs(queries=Z)
            if self.radius is None:
                # the same tensors on every call: the engine remembers them checked
                values, kwargs["log_prior"] = self._engine_per_key(keys, kwargs["log_prior"])
            out.append(attention(
                Z, keys, values, on_empty=on_empty, progress=self.verbose, **kwargs))
            offsets.append(self._value_offset(block))
        out = np.asarray(np.concatenate(out), dtype=np.float64)
        no_neighbour = None
        if self.radius is not None:
            out, no_neighbour = out[:, :-1], out[:, -1] == 0
        return self._plus_value_offsets(out, offsets), no_neighbour

    def _propagate_few_rows(self, X):
        """:meth:`_propagate` of a few rows (a web service's single row) of an array, or of a
        DataFrame of NumPy number columns (:meth:`_numeric_frame_rows`), in one block, with
        the fitted model's tensors ready on the device: no block planning, no
        per-call conversion, the encoder and the map called directly (the general path's
        set-up took about a third of a single-row predict). The same operations on the same
        numbers as the general path, so the rows equal those of any batch. ``None`` where it
        does not apply (another input, a radius, an unfitted or Dask-fitted model)."""
        frame = pd is not None and isinstance(X, pd.DataFrame)
        if not ((frame or (type(X) is np.ndarray and X.ndim == 2))
                and 0 < X.shape[0] <= _FEW_ROWS and self.radius is None
                and self.metric in METRICS
                and isinstance(getattr(self, "_fit_values", None), np.ndarray)):
            return None
        # a frame of other column types goes the general way (its columns' types decide)
        X = self._numeric_frame_rows(X) if frame else self._check_X(X, reset=False)
        if X is None:
            return None
        encoded = self._encoder.encode_float_rows(X)
        block = self._layout.dense(self._encoder.transform(X) if encoded is None else encoded,
                                   np.float32 if X.dtype == np.float32 else np.float64)
        metric_map, keys, values, log_prior = self._ready_for_queries()
        kwargs = self._engine_kwargs()
        kwargs["log_prior"] = log_prior
        Z = torch.as_tensor(block, dtype=keys.raw.dtype, device=keys.raw.device)
        # one thread setting around the map and the attention (each would set its own)
        with rows_single_threaded(keys, Z.shape[0], 1 if values.ndim == 1 else values.shape[1]):
            if metric_map is not None:
                # inference mode: no view or version tracking on the map's ops; the engine
                # reads the images and returns an ordinary tensor
                with torch.inference_mode():
                    Z = metric_map.images(Z)
            out = attention(Z, keys, values, on_empty="raise", progress=self.verbose, **kwargs)
        out = np.asarray(out.cpu().numpy(), dtype=np.float64)
        return self._plus_value_offsets(out, [self._value_offset(block)])

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
        return _dask.block_tasks(self, method, blocks) if _dask.is_sharded(self) else None

    @uses_n_jobs
    def attention_weights(self, X=None, n_weights=None):
        """The largest attention weights behind each prediction and the training points they
        fall on.

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
            blocks, exclude_self = [self._fit_X], True
        else:
            blocks, exclude_self = self._validate_queries(X), False
        if n_weights is None:
            n_weights = (
                self.n_neighbors if self.n_neighbors is not None else min(10, self.n_samples_fit_)
            )
        if (
            exclude_self
            and self.n_neighbors is not None
            and self.n_neighbors >= self.n_samples_fit_
        ):
            raise ValueError(
                f"n_neighbors={self.n_neighbors} leaves no room to exclude each training point "
                f"from its own row ({self.n_samples_fit_} samples)."
            )
        weights, indices = zip(*(
            attention(
                Z, self._engine_keys(), self._fit_values, exclude_self=exclude_self,
                return_weights=True, n_weights=n_weights, on_empty="zero", progress=self.verbose,
                **self._engine_kwargs(queries=Z),
            )[1:]
            for Z in map(self._embed, blocks)
        ), strict=True)
        return np.asarray(np.concatenate(weights), dtype=np.float64), np.concatenate(indices)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # the tabular encoder: missing values, sparse matrices, category and string columns
        tags.input_tags.allow_nan = True
        tags.input_tags.sparse = True
        tags.input_tags.categorical = True
        tags.input_tags.string = True
        # Learned metrics train with CUDA float atomics (backward of gather/indexing and of the
        # fused attention kernels); fixed metrics run forward kernels only, which repeat exactly.
        tags.non_deterministic = self.metric in LEARNED_METRICS and _cuda_nondeterministic(
            self.device
        )
        return tags


# ---------------------------------------------------------------------- helpers


def _initial_projection(Xs, n_components, rng):
    """(n_components, n_features) starting projection: identity when the dimension is kept, the
    leading principal axes when it shrinks, identity plus small random rows when it grows."""
    n_features = Xs.shape[1]
    if n_components is None:
        n_components = min(n_features, _DEFAULT_MAX_COMPONENTS)
    if n_components == n_features:
        return np.eye(n_features)
    if n_components < n_features:
        sub = Xs[rng.permutation(Xs.shape[0])[:5000]]
        sub = sub - sub.mean(0)
        _, _, vt = np.linalg.svd(sub, full_matrices=False)
        basis = vt[:n_components]
        if basis.shape[0] < n_components:  # fewer samples than components
            extra = rng.normal(scale=1e-2, size=(n_components - basis.shape[0], n_features))
            basis = np.vstack([basis, extra])
        return basis
    extra = rng.normal(scale=1e-2, size=(n_components - n_features, n_features))
    return np.vstack([np.eye(n_features), extra])


def _neighbor_scale(Z, queries, sample_weight, log_weight, device, dtype=torch.float64):
    """Weighted median squared distance from ``Z[queries]`` to their nearest distinct key in
    ``Z``."""
    n_candidates = min(_AUTO_TEMPERATURE_CANDIDATES, int(np.sum(sample_weight > 0)) - 1)
    if n_candidates < 1:
        return 1.0
    _, idx = kneighbors(
        Z[queries],
        Z,
        n_candidates,
        log_prior=log_weight,
        exclude_self=queries,
        device=device,
        dtype=dtype,
    )
    # Exact distances on the candidates (duplicates are exactly 0 and skipped), in chunks so the
    # gathered candidates (and their differences) stay small.
    nearest = np.full(queries.size, np.inf)
    chunk = plan_rows(
        queries.size, row_bytes=3 * 8 * n_candidates * Z.shape[1], budget=budget_bytes(),
        max_rows=_SCALE_CHUNK,
    )
    for start in range(0, queries.size, chunk):
        rows = slice(start, start + chunk)
        cand = idx[rows]
        diff = Z[queries[rows]][:, None, :].astype(np.float64) - Z[np.maximum(cand, 0)]
        d2 = np.einsum("ijk,ijk->ij", diff, diff)
        d2[(cand < 0) | (d2 <= 0)] = np.inf
        nearest[rows] = d2.min(1)
    keep = np.isfinite(nearest)
    if not np.any(keep):
        return 1.0
    median = _weighted_median(nearest[keep], sample_weight[queries][keep])
    return float(median) if median > 0 else 1.0


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


def _same_classes(a, b):
    """Whether two ``classes_`` (an array, or a list of arrays per output) are equal."""
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)))
    return np.array_equal(a, b)


def _weighted_median(values, weights):
    """Smallest value whose cumulative weight reaches half the total (repeats = weights)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return values[order][np.searchsorted(cum, 0.5 * cum[-1])]


def _map_for_inference(metric_map, device, dtype):
    """A copy of the fitted map on the compute device and dtype, in eval mode (the fitted
    ``map_`` itself stays on the CPU in its training dtype)."""
    return metric_map.for_inference(device, dtype)


def _to_cpu(state):
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_cpu(v) for v in state]
    return state


# Ridge penalties searched by generalised cross-validation for a linear trend, and the widest
# design it is fitted on (the search's eigendecomposition is cubic in the width: about 0.7 s
# at 1,000 columns, 4.5 s at 2,000, one thread).
_TREND_ALPHAS = np.logspace(-3, 3, 13)
TREND_MAX_WIDTH = 1024


def fit_linear_trend(design, values, sample_weight):
    """A ridge regression of ``values`` on ``design`` (penalty by efficient leave-one-out
    cross-validation), what the regressor's attention then corrects locally."""
    from sklearn.linear_model import RidgeCV

    return RidgeCV(alphas=_TREND_ALPHAS).fit(design, values, sample_weight=sample_weight)
