"""The learned metrics' strategy (``"tabular"``, ``"mlp"``, ``"linear"``, ``"dot"``): a map
trained with the temperature by leave-one-out soft-neighbour likelihood, the training points
mapped by it as keys."""

import copy
import math

import numpy as np
import torch
from sklearn.utils import check_random_state

from .._engine import (
    ProgressReport,
    WindowRule,
    batch_rows,
    build_map,
    progress_bar,
    resolve_dtype,
    seeded_torch_rng,
    train_metric,
)
from ..utils._callbacks import EpochTasks
from ..utils._convergence import warn_if_max_iter_reached
from ..utils._device import _cuda_nondeterministic
from ._distinct_rows import distinct_row_ids
from ._input import TabularInput
from ._strategy import MetricFit, MetricStrategy
from ._summary import FitPrototypes, summarize
from ._temperature import MAX_QUERIES, neighbor_scale
from ._training_rows import TrainingRows, calibration_rows, validation_split
from ._training_settings import (
    _AUTO_BATCH,
    _AUTO_CANDIDATE_SHARE,
    _AUTO_CANDIDATES,
    _AVERAGE_DECAY,
    _DEFAULT_MAX_COMPONENTS,
    _DISTINCT_SHARE,
    _EMBED_CHUNK,
    _EPOCH_ROWS,
    _PLR_MIN_SAMPLES,
    _SCALE_BATCH,
    _SCALE_CANDIDATE_SHARE,
    _SCALE_CANDIDATES,
    _SCALE_MIN_LEVEL_COUNT,
    _SCALE_VALIDATION_KEYS,
    _SCALE_WINDOW_GAIN,
    _SCALE_WINDOW_Z,
    _STATISTICS_MIN_LEVELS,
    _TABULAR_BATCH,
    _TABULAR_CANDIDATES,
    _TABULAR_COMPONENTS,
    _VALIDATION_KEYS,
)


class LearnedMetric(MetricStrategy):
    """A learned metric: the fitted ``map`` (on the CPU in its training dtype, as ``map_``), the
    training state a warm start continues (``history``, ``optimizer_state``), and copies of the
    map ready for inference per compute device and dtype (not pickled)."""

    learned = True

    def __init__(self, metric):
        super().__init__(metric)
        self.input = TabularInput(
            scaled=True, codes=metric == "tabular", learned=True,
            rare_levels=(_EPOCH_ROWS, _SCALE_MIN_LEVEL_COUNT) if metric == "tabular" else None,
            target_statistics=((_EPOCH_ROWS, _STATISTICS_MIN_LEVELS) if metric == "tabular"
                               else None))
        self.map = None
        self.prototypes = None
        self.prototype_error = None
        self.prototype_near = None  # the prototypes' near groups (None: _summary's default)
        self.history = None
        self.architecture = None  # the parameters that built the map (_architecture)
        self.optimizer_state = None
        self._ready = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ready"] = {}
        return state

    # ------------------------------------------------------------------ fit

    def fit(self, estimator, X, values, train_values, sample_weight, prior_weight, loss,
            stratify, loo_loss, device, epoch_model=None):
        """Train the map and the temperature by leave-one-out soft-neighbour likelihood.

        A finite positive ``temperature`` is fixed during training; ``"auto"`` is learned. The
        limits 0 and inf have no gradient: the metric is then trained with a learned temperature
        and the limit is used at prediction (1-NN or k-NN in the learned metric). A fitted
        strategy continues its own map and training state on a warm start.
        ``epoch_model(strategy, temperature)``: the fitted attributes of the model after an
        epoch, for scikit-learn's callbacks.
        """
        warm = self.map is not None
        before = estimator.n_iter_ if warm else 0
        if warm and self.map.n_features != X.shape[1]:
            raise ValueError(
                f"warm_start: X has {X.shape[1]} features but the map was trained on "
                f"{self.map.n_features}."
            )
        # chosen again by every fit
        self.prototypes = self.prototype_error = self.prototype_near = None
        if not warm and self.metric == "linear" and (estimator.n_components or 0) > X.shape[1]:
            raise ValueError(f"n_components={estimator.n_components} cannot be greater than "
                             f"the {X.shape[1]} features of X (after encoding) with "
                             "metric='linear', whose W x has no more dimensions (as in NCA).")
        rng = check_random_state(estimator.random_state)
        dtype = resolve_dtype(estimator.dtype)  # training precision (None: float32)
        seed = int(rng.randint(np.iinfo(np.int32).max))
        # A private, seeded torch RNG for initialisation and dropout; the caller's is restored.
        with seeded_torch_rng(seed, device) as release_rng:
            generator = torch.Generator().manual_seed(seed)
            if not warm:
                self.map = self._build_map(estimator, X, rng)
                self.architecture = self._architecture(estimator)
            metric_map = self.map.to(device=device, dtype=dtype)
            release_rng(metric_map)  # training draws only from `generator` (unless dropout)
            if loss == "log_loss" and values.shape[1] == 1:
                # a single class: every map predicts it, there is nothing to learn
                self.map = self.map.to(device="cpu", dtype=dtype)
                self._ready = {}
                temperature = estimator.temperature
                return MetricFit(temperature=1.0 if isinstance(temperature, str)
                                 else float(temperature), map=self.map,
                                 n_iter=getattr(estimator, "n_iter_", 0) if warm else 0)
            data = TrainingRows(X, values if train_values is None else train_values,
                                prior_weight, dtype, device)
            log_t = self._initial_log_temperature(estimator, metric_map, data.X, prior_weight,
                                                  warm, dtype, device)
            validation = data.split(validation_split(estimator, X.shape[0], stratify, rng))
            row_groups = self._row_groups(data.X)
            history = self._train(estimator, metric_map, log_t, data, loss, validation,
                                  generator, warm, epoch_model, row_groups)
            prototypes = FitPrototypes(self._prototype_setting(estimator), metric_map, data.X,
                                       data.values, data.weight, loss)
            # check queries: held-out rows, or training rows without a validation split; the
            # error measured at the calibrated temperature where it is calibrated
            calibrating = validation is not None and estimator.temperature == "auto"
            prototypes.choose(log_t, data.X if validation is None else validation[0],
                              generator, _EMBED_CHUNK, row_groups, measure=not calibrating)
            if calibrating:
                prototypes.calibrate(log_t, calibration_rows(validation, generator))
            if prototypes.centres is not None:
                self.prototypes = prototypes.centres.to("cpu", dtype)
                self.prototype_error, self.prototype_near = prototypes.error, prototypes.n_near
        # in its training precision: float64 predictions of a float64 fit keep its weights
        self.map = metric_map.to(device="cpu", dtype=dtype)
        self._ready = {}
        fit = self._outcome(estimator, history, log_t, validation is not None)
        fit.map = self.map
        _warn_if_not_converged(estimator, fit.n_iter - before, validation is not None)
        return fit

    @staticmethod
    def _prototype_setting(estimator):
        """The estimator's ``prototypes``, or ``None`` unless it predicts by dense attention
        (no ``n_neighbors``, no ``radius``, a temperature other than 0 and inf)."""
        if (getattr(estimator, "n_neighbors", None) is not None
                or getattr(estimator, "radius", None) is not None
                or estimator.temperature in (0, math.inf)):
            return None
        return getattr(estimator, "prototypes", None)

    def summarize(self, points, values, log_prior, inputs):
        """The fitted keys (float32/float64 arrays as given) grouped around the prototypes'
        centres (an engine ``GroupedKeys`` on the CPU), or ``None``; the keys of equal
        ``inputs`` rows kept as one where rows repeat (as in :meth:`_row_groups`)."""
        if self.prototypes is None:
            return None
        points = torch.as_tensor(points)
        return summarize(points, torch.as_tensor(values).to(points.dtype),
                         torch.as_tensor(log_prior).to(points.dtype),
                         self.prototypes.to(points.dtype), self.map.kind,
                         getattr(self, "prototype_near", None),
                         _distinct_rows(torch.as_tensor(inputs))
                         if isinstance(inputs, np.ndarray) else None)

    def _train(self, estimator, metric_map, log_t, data, loss, validation, generator, warm,
               epoch_model, row_groups):
        """The training loop with the estimator's progress bar and callbacks; keeps the state
        a warm start continues."""
        batch_size, n_candidates = self._batch_and_candidates(
            estimator, data.X.shape[0], data.values.shape[1], data.X.element_size())
        previous = self.history if warm else None
        name = type(estimator).__name__
        with progress_bar(estimator.verbose, total=estimator.max_iter, desc=f"{name} fit",
                          unit="epoch") as bar:
            report = ProgressReport(
                bar, name, estimator.max_iter, estimator.verbose,
                validating=validation is not None, first=previous.n_iter if previous else 0,
            )
            attributes = None
            if epoch_model is not None:
                def attributes():
                    return epoch_model(self._copy_with(metric_map),
                                       _temperature(estimator, log_t))
            history, state = train_metric(
                metric_map, log_t, data.X, data.values, loss, data.weight,
                validation=validation, max_iter=estimator.max_iter, batch_size=batch_size,
                n_candidates=n_candidates, learning_rate=estimator.learning_rate,
                weight_decay=estimator.weight_decay, n_iter_no_change=estimator.n_iter_no_change,
                tol=estimator.tol, generator=generator,
                max_validation_keys=self._validation_keys(data.X.shape[0]),
                history=previous, average=_AVERAGE_DECAY, epoch_rows=_EPOCH_ROWS,
                row_groups=row_groups,
                window=(WindowRule(_SCALE_WINDOW_GAIN, _SCALE_WINDOW_Z)
                        if self._at_scale(data.X.shape[0]) else None),
                optimizer_state=self.optimizer_state if warm else None,
                callbacks=[report, EpochTasks(estimator, attributes)],
            )
        self.optimizer_state = _to_cpu(state)
        self.history = history
        return history

    @staticmethod
    def _outcome(estimator, history, log_t, validating):
        return MetricFit(
            temperature=_temperature(estimator, log_t),
            loss_curve=list(history.loss_curve),
            n_iter=history.n_iter,
            validation_scores=list(history.validation_scores) if validating else None,
            validation_loss_curve=list(history.validation_losses) if validating else None,
            best_validation_score=history.best_validation_score if validating else None,
        )

    def _copy_with(self, metric_map):
        """A copy of this strategy with a copy of ``metric_map`` (the model of an epoch)."""
        other = copy.copy(self)
        other.map = copy.deepcopy(metric_map).to(device="cpu").eval()
        other._ready = {}
        return other

    def check_fit_params(self, estimator):
        if self.metric == "dot" and (estimator.radius is not None
                                     or getattr(estimator, "weights", "uniform") != "uniform"):
            what = ("radius needs" if estimator.radius is not None
                    else "weights other than 'uniform' need")
            raise ValueError(f"{what} a distance; metric='dot' has none (its scores are "
                             "products of the images): use metric='mlp' or 'linear'.")

    def _architecture(self, estimator):
        """The parameters the map was built from, as built (``n_components`` and
        ``numeric_embedding`` resolved): what a warm start cannot change."""
        built = {"n_components": self.map.n_components}
        if self.metric == "tabular":
            built["numeric_embedding"] = self.map.numeric_embedding
        elif self.metric == "mlp":
            built.update((name, getattr(estimator, name))
                         for name in ("hidden_size", "n_blocks", "activation", "dropout"))
        return built

    def check_same_architecture(self, estimator):
        """A clear error where a warm start's parameters would build another map than the
        fitted one (``None`` and ``"auto"`` take the fitted map's choice)."""
        built = getattr(self, "architecture", None)  # (None: pickled before it was recorded)
        if built is None:
            return
        changed = {}
        for name, value in built.items():
            asked = getattr(estimator, name)
            if name == "n_components" and asked is None:
                asked = self._default_components()
            if asked != value and not (name == "numeric_embedding" and asked == "auto"):
                changed[name] = (value, getattr(estimator, name))
        if changed:
            listed = ", ".join(f"{name} ({a!r} -> {b!r})" for name, (a, b) in changed.items())
            raise ValueError(
                f"warm_start=True continues the fitted map, which these parameters built and "
                f"which they cannot change: {listed}. Set them back, or fit with "
                "warm_start=False for a new map.")

    def _default_components(self):
        """The map's dimension for ``n_components=None`` (its input's width fixed at fit)."""
        if self.metric == "tabular":
            return _TABULAR_COMPONENTS
        return min(self.map.n_features, _DEFAULT_MAX_COMPONENTS)

    def _build_map(self, estimator, X, rng):
        """The untrained map for the encoded training inputs ``X``."""
        if self.metric == "tabular":
            numeric_embedding = estimator.numeric_embedding
            if numeric_embedding == "auto":
                numeric_embedding = "plr" if X.shape[0] >= _PLR_MIN_SAMPLES else "none"
            return build_map(
                "tabular", n_components=estimator.n_components or _TABULAR_COMPONENTS,
                n_numeric=self.input.layout.n_numeric,
                cardinalities=self.input.layout.cardinalities,
                numeric_embedding=numeric_embedding,
            )
        init = _initial_projection(X, estimator.n_components, rng)
        return build_map(
            self.metric, init, hidden_size=estimator.hidden_size, n_blocks=estimator.n_blocks,
            activation=estimator.activation, dropout=estimator.dropout,
        )

    def _at_scale(self, n_train):
        """Whether a fit of ``n_train`` training points takes the settings for many rows
        (``_SCALE_*``): ``metric="tabular"`` with more points than an epoch holds."""
        return self.metric == "tabular" and n_train > _EPOCH_ROWS

    def _row_groups(self, X):
        """The distinct rows of the encoded training inputs ``X`` (``train_metric``'s
        ``row_groups``) with the settings for many rows, where rows repeat (tables of a few
        categorical columns: :func:`_distinct_rows`); else ``None``."""
        return _distinct_rows(X) if self._at_scale(X.shape[0]) else None

    def _validation_keys(self, n_train):
        """The training points the validation pass of each epoch attends to, at most."""
        return _SCALE_VALIDATION_KEYS if self._at_scale(n_train) else _VALIDATION_KEYS

    def _batch_and_candidates(self, estimator, n_train, n_values, itemsize):
        """Minibatch size and candidate keys per minibatch (the minibatch included).

        ``"auto"``: minibatches of 1,024 points (256 with ``metric="tabular"``; capped by
        ``working_memory``; a larger explicit batch is split into gradient-accumulated chunks
        by ``train_metric``), each attending to itself and to half of the other points, at
        most 1,024 of them (256 with ``metric="tabular"``; ModernNCA's sampling). With
        ``metric="tabular"`` and more than 16,384 training points: minibatches of 1,024, and
        a sixteenth of the other points, at most 8,192 of them.
        """
        auto_batch, auto_others = ((_TABULAR_BATCH, _TABULAR_CANDIDATES)
                                   if self.metric == "tabular"
                                   else (_AUTO_BATCH, _AUTO_CANDIDATES))
        if self._at_scale(n_train):
            auto_batch = _SCALE_BATCH
            auto_others = min(_SCALE_CANDIDATES, math.ceil(_SCALE_CANDIDATE_SHARE * n_train))
        batch_size = estimator.batch_size
        batch = min(n_train, auto_batch if batch_size == "auto" else batch_size)
        if estimator.sample_rate == "auto":
            others = min(math.ceil(_AUTO_CANDIDATE_SHARE * (n_train - batch)), auto_others)
            n_candidates = min(n_train, batch + others)
        else:
            n_candidates = max(1, int(math.ceil(estimator.sample_rate * n_train)))
        if batch_size == "auto":
            batch = min(batch, batch_rows(n_candidates, n_values, self.map.n_components,
                                          itemsize))
        return batch, n_candidates

    @staticmethod
    def _initial_log_temperature(estimator, metric_map, Xt, weight, warm, dtype, device):
        temperature = estimator.temperature
        if not isinstance(temperature, str) and 0 < temperature < math.inf:
            return torch.tensor(math.log(temperature), dtype=dtype, device=device)
        fitted = getattr(estimator, "temperature_", None) if warm else None
        if metric_map.kind == "euclidean":
            # ModernNCA: the map learns the scale at a fixed temperature (1, or the calibrated
            # one on a warm start), which is calibrated on the validation points afterwards
            start = fitted if fitted is not None and 0 < fitted < math.inf else 1.0
            return torch.tensor(math.log(start), dtype=dtype, device=device)
        if fitted is not None and 0 < fitted < math.inf:
            start = fitted
        elif metric_map.kind == "dot":
            start = math.sqrt(Xt.shape[1])  # the usual 1/sqrt(d) scaling of dot-product attention
        else:
            metric_map.eval()  # no dropout in the starting scale
            with torch.no_grad():
                Z = metric_map.key(Xt[: MAX_QUERIES * 4]).cpu().double().numpy()
            queries = np.arange(min(Z.shape[0], MAX_QUERIES))
            with np.errstate(divide="ignore"):
                log_w = np.log(weight[: Z.shape[0]])
            start = neighbor_scale(Z, queries, weight[: Z.shape[0]], log_w, device)
        # A starting temperature whose exp under- or overflows the training dtype would become
        # 0 or inf, the limits without a gradient: keep it well inside the dtype's range.
        info = torch.finfo(dtype)
        log_start = min(max(math.log(start), 0.5 * math.log(info.tiny)), 0.5 * math.log(info.max))
        return torch.tensor(log_start, dtype=dtype, device=device, requires_grad=True)

    def keys(self, X, device, dtype):
        return self.embed(X, "key", device, dtype)

    # ------------------------------------------------------------------ queries

    def compute_dtype(self, dtype, fit_dtype):
        """``dtype``, else float32: the precision the map is trained in (float64 would only
        double the keys' memory and the time of their products)."""
        return resolve_dtype(dtype)  # (None: float32)

    def ready_map(self, device, dtype):
        """A copy of the fitted map on ``device`` and ``dtype`` in eval mode, made once."""
        key = (device.type, device.index, dtype)
        ready = self._ready.get(key)
        if ready is None:
            ready = self._ready[key] = self.map.for_inference(device, dtype)
        return ready

    def embed(self, X, side, device, dtype):
        metric_map = self.ready_map(device, dtype)
        out = np.empty((X.shape[0], self.map.n_components),
                       dtype=np.float32 if dtype == torch.float32 else np.float64)
        # per row: its tensor and the map's activations
        rows = self.map.budget_rows(X.shape[0], torch.finfo(dtype).bits // 8, _EMBED_CHUNK)
        with torch.no_grad():
            for start in range(0, X.shape[0], rows):
                batch = slice(start, start + rows)
                xb = torch.as_tensor(X[batch], dtype=dtype, device=device)
                out[batch] = metric_map.images(xb, side).cpu().numpy()
        return out

    def embed_tensor(self, Z, device, dtype):
        # inference mode: no view or version tracking on the map's ops
        with torch.inference_mode():
            return self.ready_map(device, dtype).images(Z)

    def distances(self, f):
        if self.metric == "dot":  # -q.k itself: not a distance
            return np.asarray(f, dtype=np.float64)
        return super().distances(f)

    def exact_distances(self, Z, keys, indices):
        if self.metric == "dot":
            raise ValueError("weights other than 'uniform' need a distance; metric='dot' has "
                             "none.")
        return super().exact_distances(Z, keys, indices)

    @classmethod
    def tags(cls, tags, device):
        # Learned metrics train with CUDA float atomics (backward of gather/indexing and of
        # the fused attention kernels); fixed metrics run forward kernels only.
        tags.non_deterministic = _cuda_nondeterministic(device)
        return tags


def _distinct_rows(X):
    """The distinct row of each row of ``X`` (:func:`distinct_row_ids`) where at most
    ``_DISTINCT_SHARE`` of the rows are distinct, else ``None``."""
    return distinct_row_ids(X, _DISTINCT_SHARE)


def _temperature(estimator, log_t):
    """The fitted temperature: the learned one, or the limit 0 or inf asked for."""
    if estimator.temperature in (0, math.inf):
        return float(estimator.temperature)
    return float(torch.exp(log_t.detach()).cpu())


def _warn_if_not_converged(estimator, epochs_run, validating):
    """ConvergenceWarning when this fit ran all ``max_iter`` epochs."""
    monitored = "validation loss" if validating else "training loss"
    warn_if_max_iter_reached(
        estimator, epochs_run,
        f"the {monitored} stopped improving by tol={estimator.tol} for "
        f"n_iter_no_change={estimator.n_iter_no_change} epochs",
    )


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


def _to_cpu(state):
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_cpu(v) for v in state]
    return state
