"""Training of a pseudo-metric by leave-one-out soft-neighbour likelihood (torch only).

The recipe of NCA and ModernNCA in the notation of docs/theory.md: each minibatch of training
points attends, through :func:`attention`, to a random sample of candidate training points with
itself excluded, and the propagated labels are scored against the true ones (log-loss for
classes, squared error for targets). The map and a log-temperature are optimised with AdamW in
the one training loop (``_training.run_training``), early stopping on held-out points;
``_calibration.calibrate_temperature`` then re-fits the temperature alone on them. Every
tensor lives on the device of the training inputs (the estimator's ``device``); every
:func:`attention` call of training is told that device.
"""

import copy
import math

import torch

from ._attention import attention
from ._budget import CPU_WHOLE_ROW_KEYS, batch_rows
from ._inputs import clamp_log_temperature
from ._near_far import distinct_rows
from ._one_block import recomputed_step, self_mask, single_block_attention
from ._optimizers import Adam, AveragingOptimizer
from ._parallel import SMALL_STEP_WORK, chunk_workers, one_thread, small_work_single_threaded
from ._scores import PreparedKeys
from ._training import Callback, EarlyStopping, EpochBatches, TrainingHistory, run_training

_LOG_EPS = 1e-7  # floor of a propagated class probability inside the log-loss
# above this many training points a step's other candidates are a uniform draw (its distinct
# points), not the head of a permutation of every point
_PERMUTED_CANDIDATES = 16384


def train_metric(
    metric_map,
    log_temperature,
    X,
    values,
    loss,
    weight,
    *,
    validation=None,
    max_iter,
    batch_size,
    n_candidates,
    learning_rate,
    weight_decay,
    n_iter_no_change,
    tol,
    generator,
    max_validation_keys=None,
    history=None,
    optimizer_state=None,
    callbacks=(),
    average=None,
    epoch_rows=None,
    row_groups=None,
    window=None,
):
    """Train ``metric_map`` (and ``log_temperature`` if it requires grad) in place.

    Parameters
    ----------
    metric_map : MetricMap
    log_temperature : Tensor (0-d)
        Learned when it requires grad, else fixed.
    X : Tensor (n, d)
        Training inputs, on the compute device (every attention call runs there).
    values : Tensor (n, n_values)
        What attention propagates: one-hot labels (``loss="log_loss"``) or standardised targets
        (``loss="squared_error"``).
    loss : {"log_loss", "squared_error"}
    weight : Tensor (n,)
        Sample weights: the loss weight of a point and, as a log-prior, its weight as a key.
    validation : tuple (X_val, values_val, weight_val) or None
        With a validation set, training stops when the validation loss (the training objective on
        held-out points, smoother than accuracy on small sets) has not improved by ``tol`` for
        ``n_iter_no_change`` epochs, and the state of the best epoch is restored; its score
        (accuracy or R^2) is recorded too. Without one, the rule applies to the training loss.
    max_validation_keys : int or None
        The validation points of each epoch attend to a fixed random sample of at most this
        many training points (``None``: all of them): the stopping rule needs a comparable loss
        from epoch to epoch, not the final one, and this pass costs as much as an epoch.
    n_candidates : int
        Candidate keys sampled for each minibatch (all points when >= n): the minibatch and
        a random sample of the other points (beyond 16,384 points, the distinct points of a
        uniform draw of that many, so occasionally a few fewer).
    generator : torch.Generator
        Drives batches and candidate samples (on the CPU, for reproducibility).
    callbacks : sequence of Callback
        Run after the early-stopping rule each epoch (e.g. :class:`ProgressReport`).
    average : float in (0, 1) or None
        With a validation set: the largest decay per step of an exponential moving average of
        the parameters (the map's and a learned temperature), which is what each epoch
        validates and what the best epoch keeps; training itself steps the parameters as
        usual. The decay is at most ``1 - 1 / steps_per_epoch`` (the average spans at most an
        epoch; none with one step an epoch). The average's validation loss
        is smoother from epoch to epoch than the parameters' own, so a shorter
        ``n_iter_no_change`` stops as well. ``None``: the parameters themselves.
    epoch_rows : int or None
        The training points of an epoch: all of them (``None`` or at least ``n``), else this
        many, the next ones of a random order of every point that carries over from epoch to
        epoch (a new order once each point has had its turn). Validation, early stopping and
        progress then come every ``epoch_rows`` points, so that their spacing and a fit's
        steps do not grow with ``n``.
    row_groups : LongTensor (n,) or None
        The group of each training point's inputs (equal inputs, equal group; e.g. the inverse
        of the distinct rows): a step's candidates other than the minibatch that share a group
        are one key, with their summed weight (a log-prior) and weighted mean values. The
        same attention (equal inputs have equal keys), the same loss and gradients, up to
        rounding, over fewer keys (for maps without dropout, whose copies of a row would each
        draw their own mask): tables of a few categorical columns repeat their rows.
    window : WindowRule or None
        :class:`EarlyStopping`'s rule for a window of epochs (per-row validation losses given).

    Returns
    -------
    history : TrainingHistory
    optimizer_state : dict
        To continue training (``warm_start``).
    """
    history = history or TrainingHistory()
    n = X.shape[0]
    log_prior = key_log_prior(weight)
    optimizer = _optimizer(metric_map, log_temperature, learning_rate, weight_decay,
                           optimizer_state)
    images = metric_map.training_images(
        [X] if validation is None else [X, validation[0]], min(n, n_candidates))
    step = _MinibatchStep(metric_map, log_temperature, X, values, loss, weight, log_prior,
                          n_candidates, generator, optimizer, row_groups, images)
    parameters = _Parameters(metric_map, log_temperature)
    validate = None
    if validation is not None:
        keys = _validation_keys(n, max_validation_keys, generator, X.device)
        validate = _Validation(metric_map, log_temperature, images, values, log_prior, keys,
                               validation, loss, step.on_workers(batch_size))
    batches = EpochBatches(n, epoch_rows, batch_size, generator)
    stepper, validate, swap_back = _averaged(optimizer, validate, average, batches.rows,
                                             batch_size)
    stopping = EarlyStopping(n_iter_no_change, tol, history, validate, parameters.snapshot,
                             parameters.restore, window)
    # the caller's callbacks see the epoch's validated (averaged) parameters, then the live
    # ones are put back for the next epoch
    updates = _OneThreadUpdates(stepper) if step.on_workers(batch_size) else stepper
    step_work = batch_size * min(n, n_candidates) * (metric_map.n_components + values.shape[1])
    with small_work_single_threaded(step_work, X.device, limit=SMALL_STEP_WORK):
        run_training(
            metric_map, updates, max_iter=max_iter, step=step, history=history,
            batches=batches,
            callbacks=[stopping, *callbacks, *swap_back],
        )
    if swap_back and stopping.best_state is None:
        # no epoch of this fit beat the best of an earlier one (warm start): keep the last
        # validated parameters, the average, rather than live ones no epoch validated
        stepper.keep_average()
    return history, optimizer.state_dict()


class _OneThreadUpdates:
    """The optimizer of steps on workers, its updates on the calling thread's one core, as the
    steps' own kernels: a parallel region between steps left torch's OpenMP thread spinning on
    the cores the next step's workers needed (docs/performance.md, "Shared machines")."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        with one_thread():
            self.optimizer.step()


def _optimizer(metric_map, log_temperature, learning_rate, weight_decay, state):
    """AdamW over the map's parameters (with ``weight_decay``) and a learned log-temperature
    (without), continuing from ``state`` when given (a warm start)."""
    groups = [{"params": list(metric_map.parameters()), "weight_decay": weight_decay}]
    if log_temperature.requires_grad:
        groups.append({"params": [log_temperature], "weight_decay": 0.0})
    optimizer = Adam(groups, lr=learning_rate)
    if state is not None:
        optimizer.load_state_dict(state)
    return optimizer


_DIVERGED = ("Training diverged: {} (the map's images overflow the compute dtype); lower "
             "learning_rate, rescale the data or use float64.")


class _MinibatchStep:
    """The training step of one minibatch (the ``step`` of ``run_training``): its points
    attend to candidate points with themselves excluded; the gradients of their weighted
    loss are computed. Returns ``(loss, weight)``, or ``None`` for a minibatch without
    weight. ``images(i, rows)``: the key images of ``X[rows]`` (``i = 0``) and of the
    validation points (``i = 1``), ``metric_map.training_images``."""

    def __init__(self, metric_map, log_temperature, X, values, loss, weight, log_prior,
                 n_candidates, generator, optimizer, row_groups, images):
        self.metric_map, self.log_temperature, self.X, self.values = (
            metric_map, log_temperature, X, values)
        self.images = images
        self.loss, self.weight, self.log_prior = loss, weight, log_prior
        self.n_candidates, self.generator, self.optimizer = n_candidates, generator, optimizer
        self.in_batch = torch.zeros(X.shape[0], dtype=torch.bool)
        self.row_groups = None if row_groups is None else row_groups.to(X.device)

    def candidates(self, batch):
        """``(candidates, own)``: the batch itself plus a random sample of the other points,
        and the position of each batch point among them (excluded from its own candidates)."""
        n = self.X.shape[0]
        if self.n_candidates >= n:
            return torch.arange(n), batch
        n_others = max(self.n_candidates - batch.numel(), 0)
        self.in_batch[batch] = True
        if n > _PERMUTED_CANDIDATES:
            # distinct points of a uniform draw, less the batch's own: a permutation of every
            # point per step would cost a pass over all of them
            draw = torch.randint(n, (n_others,), generator=self.generator).unique()
            others = draw[~self.in_batch[draw]]
        else:
            perm = torch.randperm(n, generator=self.generator)
            others = perm[~self.in_batch[perm]][:n_others]
        self.in_batch[batch] = False
        return torch.cat([batch, others]), torch.arange(batch.numel())

    def on_workers(self, n_rows):
        """Whether a step of ``n_rows`` rows runs its attention's chunks on workers and the
        rest on one core (no barrier per kernel): the recomputed softmax on the CPU."""
        pairs = n_rows * min(self.X.shape[0], self.n_candidates)
        return self.X.device.type == "cpu" and recomputed_step(self.metric_map.kind, pairs)

    def __call__(self, batch):
        if not self.on_workers(batch.numel()):
            return self._step(batch)
        with chunk_workers(torch.get_num_threads()):
            return self._step(batch)

    def _step(self, batch):
        candidates, own = self.candidates(batch)
        device = self.X.device
        batch_d, cand_d, own_d = batch.to(device), candidates.to(device), own.to(device)
        w = self.weight[batch_d]
        if not bool((w > 0).any()):
            return None  # a batch of zero-weight points carries no loss
        cand_d, cand_values, prior = self._merged(cand_d, batch.numel(),
                                                  self.n_candidates < self.X.shape[0])
        keys = self.images(0, cand_d)
        queries = (keys[own_d] if self.metric_map.symmetric
                   else self.metric_map.query(self.X[batch_d]))
        temperature = exp_in_range(self.log_temperature)
        if not self.log_temperature.requires_grad:
            temperature = float(temperature)  # a fixed temperature: a float, as attention() has it
        prepared = PreparedKeys(keys, self.metric_map.kind, check_finite=False)
        self.optimizer.zero_grad(set_to_none=True)
        batch_loss = self._backward(queries, prepared, cand_values, temperature, prior,
                                    own_d, self.values[batch_d], w)
        if not math.isfinite(batch_loss):
            raise ValueError(_DIVERGED.format("the minibatch loss is not finite"))
        return batch_loss, float(w.sum())

    def _merged(self, cand, n_batch, batch_first=True):
        """``(rows, values, log_prior)`` of the step's keys: the candidates ``cand``, or, with
        ``row_groups`` and the minibatch's ``n_batch`` points first (``batch_first``), the
        minibatch and one row per group of the other candidates, carrying the group's summed
        weight and weighted mean values (the minibatch's points stay apart: each is excluded
        from its own keys, its duplicates are not); groups of zero weight are left out."""
        prior = None if self.log_prior is None else self.log_prior.index_select(0, cand)
        if self.row_groups is None or not batch_first or cand.numel() <= n_batch:
            return cand, self.values.index_select(0, cand), prior
        others = cand[n_batch:]
        groups, inverse = torch.unique(self.row_groups[others], return_inverse=True)
        if groups.numel() == others.numel():
            return cand, self.values.index_select(0, cand), prior
        if prior is None:  # unit weights: log-priors of 0
            prior = self.values.new_zeros(cand.numel())
        first, values, log_mass = distinct_rows(self.values[others], prior[n_batch:], inverse)
        batch = cand[:n_batch]
        return (torch.cat([batch, others[first]]), torch.cat([self.values[batch], values]),
                torch.cat([prior[:n_batch], log_mass]))

    def _backward(self, queries, prepared, cand_values, temperature, prior, own, targets, w):
        """The gradients of the minibatch's weighted mean loss; returns the loss. Under
        autograd a step's scores stay alive until backward: a batch too large for
        working_memory is split into chunks whose gradients are accumulated (the same sum)."""
        n_rows = queries.shape[0]
        rows = batch_rows(prepared.n_keys, cand_values.shape[1], prepared.dim,
                          self.X.element_size())
        batch_loss, w_sum = 0.0, w.sum()
        for s in range(0, n_rows, rows):
            e = min(n_rows, s + rows)
            out = _minibatch_attention(queries[s:e], prepared, cand_values, temperature, prior,
                                       own[s:e])
            part = (w[s:e] * soft_neighbour_loss(out, targets[s:e], self.loss)).sum() / w_sum
            part.backward(retain_graph=e < n_rows)
            batch_loss += float(part.detach())
            del out, part  # free this chunk's scores before the next chunk's
        return batch_loss


class _Parameters:
    """Snapshots of the map's parameters and the log-temperature, and their restoration (the
    best epoch's, at the end of early stopping)."""

    def __init__(self, metric_map, log_temperature):
        self.metric_map, self.log_temperature = metric_map, log_temperature

    def snapshot(self):
        return copy.deepcopy(self.metric_map.state_dict()), self.log_temperature.detach().clone()

    def restore(self, state):
        self.metric_map.load_state_dict(state[0])
        with torch.no_grad():
            self.log_temperature.copy_(state[1])


def _validation_keys(n, max_validation_keys, generator, device):
    """The training points the validation points attend to in every epoch: all of them, or a
    fixed random sample of ``max_validation_keys`` (sorted)."""
    keys = torch.arange(n)
    if max_validation_keys is not None and max_validation_keys < n:
        keys = torch.randperm(n, generator=generator)[:max_validation_keys].sort().values
    return keys.to(device)


class _Validation:
    """The ``validate`` of early stopping: ``(score, loss)`` of the validation points attending
    to the training points ``keys`` (:func:`validation_score`); ``images``: as the step's.
    ``on_workers``: the attention computed as a step's on workers (``_MinibatchStep``), not by
    :func:`attention` (the same outputs up to rounding, in fewer passes)."""

    def __init__(self, metric_map, log_temperature, images, values, log_prior, keys,
                 validation, loss, on_workers):
        self.metric_map, self.log_temperature = metric_map, log_temperature
        self.images, self.values, self.log_prior, self.keys = images, values, log_prior, keys
        self.validation, self.loss, self.on_workers = validation, loss, on_workers

    @torch.no_grad()
    def __call__(self):
        keys, metric_map = self.keys, self.metric_map
        metric_map.eval()
        queries = (self.images(1) if metric_map.symmetric
                   else metric_map.query(self.validation[0]))
        images, values = self.images(0, keys), self.values.index_select(0, keys)
        prior = None if self.log_prior is None else self.log_prior.index_select(0, keys)
        temperature = float(torch.exp(self.log_temperature))
        if self.on_workers:
            with chunk_workers(torch.get_num_threads()):
                prepared = PreparedKeys(images, metric_map.kind, check_finite=False)
                pred = _minibatch_attention(queries, prepared, values, temperature, prior, None)
        else:
            try:
                pred = attention(queries, images, values, metric=metric_map.kind,
                                 temperature=temperature, log_prior=prior, on_empty="zero",
                                 device=images.device, dtype=images.dtype)
            except ValueError as exc:  # the images' or scores' overflow, not the data's
                raise ValueError(_DIVERGED.format("the validation's attention failed")) from exc
        return validation_score(pred, self.validation, self.loss)


def _averaged(optimizer, validate, average, n, batch_size):
    """``(stepper, validate, callbacks)``: with a validation and an ``average``, an
    :class:`AveragingOptimizer` stepping ``optimizer``, a ``validate`` of the averaged
    parameters and the callback that puts the live ones back after each epoch; else
    ``optimizer``, ``validate`` and no callback."""
    # The average spans at most an epoch: over more it lags behind training by epochs where an
    # epoch is a few steps (docs/performance.md, "Engine design notes").
    decay = None if average is None else min(average, 1.0 - 1.0 / -(-n // batch_size))
    if decay is None or decay <= 0 or validate is None:
        return optimizer, validate, []
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stepper = AveragingOptimizer(optimizer, params, decay)

    def validate_average():
        stepper.swap_in()
        return validate()

    return stepper, validate_average, [_SwapBack(stepper)]


class _SwapBack(Callback):
    """After the validation of averaged parameters (and a snapshot of them), the live ones."""

    def __init__(self, stepper):
        self.stepper = stepper

    def on_epoch_end(self, history):
        self.stepper.swap_out()
        return False


def _minibatch_attention(queries, prepared, values, temperature, log_prior, own):
    """The attention of a training step: :func:`attention` of the minibatch ``queries`` over
    the prepared candidate keys ``prepared``, each query's own key ``own`` excluded (``None``:
    none; a validation pass), computed
    as its streaming backend computes it (one block of every key), without the public entry's
    checks of its arguments: they are internal tensors of the step, whose loss is checked
    instead, and those checks and the dispatch are a noticeable part of a small step
    (docs/performance.md, "Engine design notes"). Where that backend would do otherwise (more
    keys than one block holds, a row that could be left without a key) it is
    :func:`attention` itself."""
    if prepared.n_keys <= CPU_WHOLE_ROW_KEYS:
        work = queries.shape[0] * prepared.n_keys * (prepared.dim + values.shape[1])
        with small_work_single_threaded(work, queries.device):  # as attention() runs it
            out = single_block_attention(
                prepared, prepared.centre(queries), values, 1.0 / temperature, log_prior,
                None if own is None else self_mask(own, prepared.n_keys))
        if out is not None:
            return out
    return attention(queries, prepared.raw, values, metric=prepared.metric, temperature=temperature,
                     log_prior=log_prior, exclude_self=own, on_empty="zero",
                     device=queries.device, dtype=queries.dtype)


def soft_neighbour_loss(out, target, loss):
    """Per point, the loss of its propagated values ``out`` against its ``target``: the
    log-loss of the true class (one-hot targets) or the squared error."""
    if loss == "log_loss":
        p_true = (out * target).sum(1)
        return -torch.log(p_true.clamp_min(_LOG_EPS))
    return ((out - target) ** 2).sum(1)


@torch.no_grad()
def validation_score(pred, validation, loss):
    """(score, loss, rows) of the validation set's attention outputs ``pred``: accuracy or R^2,
    the training objective and each row's share of it (float64, on the CPU)."""
    _, values_val, weight_val = validation
    total = weight_val.sum()
    weighted = weight_val * soft_neighbour_loss(pred, values_val, loss)
    val_loss, rows = float(weighted.sum() / total), (weighted / total).double().cpu()
    if loss == "log_loss":
        correct = (pred.argmax(1) == values_val.argmax(1)).to(pred.dtype)
        return float((weight_val * correct).sum() / total), val_loss, rows
    mean = (weight_val[:, None] * values_val).sum(0) / total
    sst = float((weight_val * ((values_val - mean) ** 2).sum(1)).sum() / total)
    return (1.0 - val_loss / sst if sst > 0 else -val_loss), val_loss, rows


def key_log_prior(weight):
    """The sample weights as the keys' log-prior; ``None`` for unit weights (a prior of zeros
    changes nothing and adding it is one more pass over every score block)."""
    return torch.log(weight) if bool((weight != 1).any()) else None


def exp_in_range(log_t):
    """``exp(log_t)`` kept inside the dtype's normal range (:func:`clamp_log_temperature`): an
    exp that under- or overflows to 0 or inf is the limit without a gradient, and the backward
    pass would fail."""
    return torch.exp(clamp_log_temperature(log_t))
