"""The one training loop of the library, and the two trainings built on it (torch only).

:func:`run_training` runs epochs of minibatch steps; what happens after each epoch (progress
reports, early stopping with validation) is a :class:`Callback`. On it:

* :func:`train_metric`: a pseudo-metric by leave-one-out soft-neighbour likelihood (the recipe
  of NCA and ModernNCA in the notation of docs/theory.md): each minibatch of training points
  attends,
  through :func:`attention`, to a random sample of candidate training points with itself
  excluded, and the propagated labels are scored against the true ones (log-loss for classes,
  squared error for targets). The map and a log-temperature are optimised with AdamW;
  :func:`calibrate_temperature` then re-fits the temperature alone on the validation points.
* :func:`train_network`: a network of class logits (``skattention.nn.IPN``) by minibatch
  cross-entropy with Adam.

Every tensor lives on the device of the training inputs, which the estimator resolved from its
``device``; every :func:`attention` call of training is told that device.
"""

import copy
import math

import torch

from ._attention import attention
from ._blocks import flushed_exp, self_mask, single_block_attention
from ._budget import CPU_WHOLE_ROW_KEYS, budget_bytes, cache_row_slices, plan_rows
from ._inputs import clamp_log_temperature
from ._parallel import small_work_single_threaded
from ._scores import Scorer

_LOG_EPS = 1e-7  # floor of a propagated class probability inside the log-loss


class Adam:
    """Adam, or AdamW (``decoupled``: weight decay as ``param *= 1 - lr * weight_decay``
    instead of an L2 term in the gradient), computed as ``torch.optim``'s single-tensor code
    computes it (the optimizer torch uses for CPU parameters: the same values to the bit), with
    its ``state_dict`` layout. Not ``torch.optim`` itself: its ``Optimizer`` imports
    ``torch._dynamo`` on first use, about a second added to the first fit of every process.

    ``groups``: parameters, or dicts of ``params`` and ``weight_decay``, as for ``torch.optim``.
    """

    def __init__(self, groups, lr, weight_decay=0.0, decoupled=True, betas=(0.9, 0.999),
                 eps=1e-8):
        groups = list(groups)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.decoupled = decoupled
        self.param_groups = [
            {"params": list(g["params"]), "lr": lr, "betas": betas, "eps": eps,
             "weight_decay": g.get("weight_decay", weight_decay)}
            for g in groups
        ]
        self.state = {}

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def zero_grad(self, set_to_none=True):
        for p in self._params():
            p.grad = None

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            weight_decay = group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state.get(param)
                if state is None:
                    state = self.state[param] = {
                        "step": torch.tensor(0.0, dtype=torch.float32),
                        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(
                            param, memory_format=torch.preserve_format
                        ),
                    }
                state["step"] += 1
                if weight_decay != 0:
                    if self.decoupled:
                        param.mul_(1 - lr * weight_decay)
                    else:
                        grad = grad.add(param, alpha=weight_decay)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = state["step"].item()
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self):
        """``torch.optim``'s layout: per-parameter state by position, and the groups."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry.update(amsgrad=False, maximize=False,
                         decoupled_weight_decay=self.decoupled,
                         params=[index[id(p)] for p in group["params"]])
            groups.append(entry)
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """The state of a :meth:`state_dict` (or of ``torch.optim.Adam``/``AdamW``'s), moved to
        each parameter's device and dtype (``step`` stays a CPU float tensor)."""
        params = self._params()
        self.state = {}
        for i, saved in state_dict["state"].items():
            param = params[int(i)]
            self.state[param] = {
                "step": torch.as_tensor(saved["step"], dtype=torch.float32).clone().cpu(),
                "exp_avg": saved["exp_avg"].to(device=param.device, dtype=param.dtype,
                                               copy=True),
                "exp_avg_sq": saved["exp_avg_sq"].to(device=param.device, dtype=param.dtype,
                                                     copy=True),
            }
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=False):
            group.update({k: saved[k] for k in ("lr", "betas", "eps", "weight_decay")
                          if k in saved})


class TrainingHistory:
    """Per-epoch training loss, validation score and loss; the best epoch's validation figures."""

    def __init__(self):
        self.loss_curve = []
        self.validation_scores = []
        self.validation_losses = []
        self.best_validation_score = None
        self.best_validation_loss = None
        self.n_iter = 0


class Callback:
    """What the training loop does after each epoch and at the end (nothing, by default)."""

    def on_epoch_end(self, history):
        """Called after each epoch; return True to stop training."""
        return False

    def on_train_end(self, history):
        """Called once training has stopped."""


def run_training(model, optimizer, *, max_iter, batches, step, history=None, callbacks=()):
    """Train ``model`` for up to ``max_iter`` epochs; return its :class:`TrainingHistory`.

    ``batches()`` gives the minibatches of one epoch; ``step(batch)`` zeroes the gradients and
    computes the minibatch's loss and gradients, returning ``(loss, weight)`` (the epoch loss is
    their weighted mean) or ``None`` to skip the minibatch; the optimizer step follows. After
    each epoch every callback runs, in order; training stops when one of them asks to.
    """
    history = history or TrainingHistory()
    for _ in range(max_iter):
        model.train()
        total, total_weight = 0.0, 0.0
        for batch in batches():
            result = step(batch)
            if result is None:
                continue
            optimizer.step()
            loss, weight = result
            total += loss * weight
            total_weight += weight
        history.loss_curve.append(total / total_weight if total_weight > 0 else 0.0)
        history.n_iter += 1
        stop = False
        for callback in callbacks:
            stop = bool(callback.on_epoch_end(history)) or stop
        if stop:
            break
    for callback in callbacks:
        callback.on_train_end(history)
    model.eval()
    return history


class EarlyStopping(Callback):
    """Stop when the monitored loss has not improved by ``tol`` for ``n_iter_no_change`` epochs.

    With ``validate`` (a function returning ``(score, loss)`` on held-out points), the validation
    loss is monitored, recorded in the history with its score, and the state of the best epoch
    (``snapshot()``) is restored at the end (``restore(state)``); without, the training loss.
    """

    def __init__(self, n_iter_no_change, tol, history, validate=None, snapshot=None,
                 restore=None):
        self.n_iter_no_change, self.tol = n_iter_no_change, tol
        self.validate, self.snapshot, self.restore = validate, snapshot, restore
        self.best_val = (
            math.inf if history.best_validation_loss is None else history.best_validation_loss
        )
        self.best_loss = min(history.loss_curve) if history.loss_curve else math.inf
        self.best_state = None
        self.stall = 0

    def on_epoch_end(self, history):
        if self.validate is not None:
            score, val_loss = self.validate()
            history.validation_scores.append(score)
            history.validation_losses.append(val_loss)
            improved = val_loss < self.best_val - self.tol
            if val_loss < self.best_val:
                self.best_val = val_loss
                history.best_validation_loss, history.best_validation_score = val_loss, score
                self.best_state = self.snapshot()
        else:
            epoch_loss = history.loss_curve[-1]
            improved = epoch_loss < self.best_loss - self.tol
            self.best_loss = min(self.best_loss, epoch_loss)
        self.stall = 0 if improved else self.stall + 1
        return self.stall >= self.n_iter_no_change

    def on_train_end(self, history):
        if self.best_state is not None:
            self.restore(self.best_state)


class ProgressReport(Callback):
    """Per epoch, the bar shows the loss (and the validation score when ``validating``); with
    ``verbose >= 2`` also one line per epoch (on standard error, above the bar). ``first``: the
    epochs run before this fit (warm start)."""

    def __init__(self, bar, name, max_iter, verbose, validating=False, first=0):
        self.bar, self.name, self.max_iter, self.verbose = bar, name, max_iter, verbose
        self.validating, self.first = validating, first

    def on_epoch_end(self, history):
        loss = history.loss_curve[-1]
        score = history.validation_scores[-1] if self.validating else None
        postfix = {"loss": f"{loss:.4f}"}
        if score is not None:
            postfix["val_score"] = f"{score:.4f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update()
        if self.verbose >= 2:
            extra = "" if score is None else f", validation score {score:.4f}"
            epoch = history.n_iter - self.first
            self.bar.write(f"{self.name} epoch {epoch}/{self.max_iter}: loss {loss:.4f}{extra}")
        return False


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
        Candidate keys sampled for each minibatch (all points when >= n).
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

    Returns
    -------
    history : TrainingHistory
    optimizer_state : dict
        To continue training (``warm_start``).
    """
    history = history or TrainingHistory()
    device, n = X.device, X.shape[0]
    log_prior = _key_log_prior(weight)
    groups = [{"params": list(metric_map.parameters()), "weight_decay": weight_decay}]
    if log_temperature.requires_grad:
        groups.append({"params": [log_temperature], "weight_decay": 0.0})
    optimizer = Adam(groups, lr=learning_rate)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    in_batch = torch.zeros(n, dtype=torch.bool)
    symmetric = metric_map.kind != "dot"

    def step(batch):
        # Candidates: the batch itself plus a random sample of the other points, so a symmetric
        # map embeds every point of the step once. Each point is excluded from its own candidates.
        if n_candidates < n:
            in_batch[batch] = True
            perm = torch.randperm(n, generator=generator)
            others = perm[~in_batch[perm]][: max(n_candidates - batch.numel(), 0)]
            in_batch[batch] = False
            candidates = torch.cat([batch, others])
            own = torch.arange(batch.numel())
        else:
            candidates, own = torch.arange(n), batch
        batch_d, cand_d, own_d = batch.to(device), candidates.to(device), own.to(device)
        w = weight[batch_d]
        if not bool((w > 0).any()):
            return None  # a batch of zero-weight points carries no loss
        keys = metric_map.key(X[cand_d])
        queries = keys[own_d] if symmetric else metric_map.query(X[batch_d])
        temperature = _exp_in_range(log_temperature)
        if not log_temperature.requires_grad:
            temperature = float(temperature)  # a fixed temperature: a float, as attention() has it
        # Under autograd a step's scores stay alive until backward: a batch too large for
        # working_memory is split into chunks whose gradients are accumulated (same sum).
        rows = batch_rows(candidates.numel(), values.shape[1], keys.shape[1], X.element_size())
        prior = None if log_prior is None else log_prior[cand_d]
        scorer, cand_values = Scorer(keys, metric_map.kind, check_finite=False), values[cand_d]
        optimizer.zero_grad(set_to_none=True)
        batch_loss, w_sum = 0.0, w.sum()
        for s in range(0, batch.numel(), rows):
            e = min(batch.numel(), s + rows)
            out = _minibatch_attention(queries[s:e], scorer, cand_values, temperature, prior,
                                       own_d[s:e])
            per_point = _loss(out, values[batch_d[s:e]], loss)
            part = (w[s:e] * per_point).sum() / w_sum
            part.backward(retain_graph=e < batch.numel())
            batch_loss += float(part.detach())
            del out, per_point, part  # free this chunk's scores before the next chunk's
        if not math.isfinite(batch_loss):
            raise ValueError(
                "Training diverged: the minibatch loss is not finite (the map's images overflow "
                "the compute dtype); lower learning_rate, rescale the data or use float64."
            )
        return batch_loss, float(w_sum)

    def snapshot():
        return copy.deepcopy(metric_map.state_dict()), log_temperature.detach().clone()

    def restore(state):
        metric_map.load_state_dict(state[0])
        with torch.no_grad():
            log_temperature.copy_(state[1])

    validate = None
    if validation is not None:
        keys = torch.arange(n)
        if max_validation_keys is not None and max_validation_keys < n:
            keys = torch.randperm(n, generator=generator)[:max_validation_keys].sort().values
        keys = keys.to(device)

        def validate():
            return validation_score(metric_map, log_temperature, X[keys], values[keys],
                                    None if log_prior is None else log_prior[keys],
                                    validation, loss)

    stepper, swap_back = optimizer, []
    # The average spans at most an epoch: over more it lags behind training by epochs where an
    # epoch is a few steps (measured: a linear map on 476 rows, one step an epoch, stopped at
    # max_iter=30 with test accuracy 0.72 with a decay of 0.9, 0.75 without the average).
    decay = None if average is None else min(average, 1.0 - 1.0 / -(-n // batch_size))
    if decay is not None and decay > 0 and validate is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        stepper = _AveragingOptimizer(optimizer, params, decay)
        plain_validate = validate

        def validate():
            stepper.swap_in()
            return plain_validate()

        swap_back = [_SwapBack(stepper)]
    stopping = EarlyStopping(n_iter_no_change, tol, history, validate, snapshot, restore)
    # the caller's callbacks see the epoch's validated (averaged) parameters, then the live
    # ones are put back for the next epoch
    run_training(
        metric_map, stepper, max_iter=max_iter, step=step, history=history,
        batches=lambda: torch.randperm(n, generator=generator).split(batch_size),
        callbacks=[stopping, *callbacks, *swap_back],
    )
    if swap_back and stopping.best_state is None:
        # no epoch of this fit beat the best of an earlier one (warm start): keep the last
        # validated parameters, the average, rather than live ones no epoch validated
        stepper.keep_average()
    return history, optimizer.state_dict()


class _AveragingOptimizer:
    """An optimizer whose steps also update an exponential moving average of the parameters
    (``average``: the decay per step); :meth:`swap_in` puts the averages in the parameters'
    place (the live values kept), :meth:`swap_out` the live values back."""

    def __init__(self, optimizer, params, average):
        self.optimizer, self.params, self.average = optimizer, params, average
        self.averages = [p.detach().clone() for p in params]
        self.live = None

    def step(self):
        self.optimizer.step()
        with torch.no_grad():
            for a, p in zip(self.averages, self.params, strict=True):
                a.lerp_(p, 1.0 - self.average)

    def swap_in(self):
        with torch.no_grad():
            self.live = [p.detach().clone() for p in self.params]
            for a, p in zip(self.averages, self.params, strict=True):
                p.copy_(a)

    def keep_average(self):
        """The averages in the parameters' place for good (the live values dropped)."""
        self.swap_in()
        self.live = None

    def swap_out(self):
        if self.live is None:
            return
        with torch.no_grad():
            for v, p in zip(self.live, self.params, strict=True):
                p.copy_(v)
        self.live = None


class _SwapBack(Callback):
    """After the validation of averaged parameters (and a snapshot of them), the live ones."""

    def __init__(self, stepper):
        self.stepper = stepper

    def on_epoch_end(self, history):
        self.stepper.swap_out()
        return False


def train_network(net, X, y, *, max_iter, batch_size, learning_rate, weight_decay, order,
                  callbacks=()):
    """Train the class logits ``net(X)`` against labels ``y`` by minibatch cross-entropy (Adam
    with L2 weight decay); ``order()`` gives each epoch's permutation of the samples. Returns
    the :class:`TrainingHistory` (the loss curve: mean cross-entropy per epoch)."""
    optimizer = Adam(net.parameters(), lr=learning_rate, weight_decay=weight_decay,
                     decoupled=False)

    def step(idx):
        optimizer.zero_grad()
        batch_loss = torch.nn.functional.cross_entropy(net(X[idx]), y[idx])
        batch_loss.backward()
        return float(batch_loss.detach()), idx.numel()

    return run_training(
        net, optimizer, max_iter=max_iter, step=step, callbacks=callbacks,
        batches=lambda: order().split(batch_size),
    )


def _minibatch_attention(queries, scorer, values, temperature, log_prior, own):
    """The attention of a training step: :func:`attention` of the minibatch ``queries`` over
    the candidate keys prepared in ``scorer``, each query's own key ``own`` excluded, computed
    as its streaming backend computes it (one block of every key), without the public entry's
    checks of its arguments: they are internal tensors of the step, whose loss is checked
    instead, and at 256 x 512 candidates those checks and the dispatch took about a tenth of a
    step. Where that backend would do otherwise (more keys than one block holds, a row that
    could be left without a key) it is :func:`attention` itself."""
    if scorer.n_keys <= CPU_WHOLE_ROW_KEYS:
        work = queries.shape[0] * scorer.n_keys * (scorer.dim + values.shape[1])
        with small_work_single_threaded(work, queries.device):  # as attention() runs it
            out = single_block_attention(scorer, scorer.centre(queries), values,
                                         1.0 / temperature, log_prior,
                                         self_mask(own, scorer.n_keys))
        if out is not None:
            return out
    return attention(queries, scorer.raw, values, metric=scorer.metric, temperature=temperature,
                     log_prior=log_prior, exclude_self=own, on_empty="zero",
                     device=queries.device, dtype=queries.dtype)


def batch_rows(n_candidates, n_values, dim, itemsize, working_memory=None):
    """Most minibatch rows whose training step fits ``working_memory`` (MiB; ``None``: config).

    Under autograd the (rows x n_candidates) scores of a step, their exponentials and, in the
    backward pass, their gradients coexist: about 4 values and a mask byte per pair (measured:
    13 bytes per pair in float32), plus per-row outputs, targets and gradients.
    """
    return plan_rows(
        None, row_bytes=n_candidates * (4 * itemsize + 2) + itemsize * (4 * n_values + 4 * dim + 8),
        budget=budget_bytes(working_memory), per="per point",
        what=f"training (each point attends to {n_candidates} candidate points)",
        hint="lower sample_rate (fewer candidates per minibatch)",
    )


def _loss(out, target, loss):
    if loss == "log_loss":
        p_true = (out * target).sum(1)
        return -torch.log(p_true.clamp_min(_LOG_EPS))
    return ((out - target) ** 2).sum(1)


@torch.no_grad()
def validation_score(metric_map, log_temperature, X, values, log_prior, validation, loss):
    """(score, loss) of the validation set attending to ``X``: accuracy or R^2, and the
    training objective."""
    X_val, values_val, weight_val = validation
    metric_map.eval()
    pred = attention(
        metric_map.query(X_val), metric_map.key(X), values, metric=metric_map.kind,
        temperature=float(torch.exp(log_temperature)), log_prior=log_prior, on_empty="zero",
        device=X.device, dtype=X.dtype,
    )
    total = weight_val.sum()
    val_loss = float((weight_val * _loss(pred, values_val, loss)).sum() / total)
    if loss == "log_loss":
        correct = (pred.argmax(1) == values_val.argmax(1)).to(pred.dtype)
        return float((weight_val * correct).sum() / total), val_loss
    mean = (weight_val[:, None] * values_val).sum(0) / total
    sst = float((weight_val * ((values_val - mean) ** 2).sum(1)).sum() / total)
    return (1.0 - val_loss / sst if sst > 0 else -val_loss), val_loss


# Temperature calibration: a grid over log T around the trained value, then two finer grids
# around the best point so far (each step a fifth of the last one's, the best point not scored
# again); every point of a grid is scored in one pass over the scores.
_CALIBRATION_GRIDS = ((2.5, 0.5), (0.4, 0.1), (0.08, 0.02))  # (half-width, step) in log T


@torch.no_grad()
def calibrate_temperature(metric_map, log_temperature, X, values, weight, validation, loss):
    """Set ``log_temperature`` (in place) to the value with the lowest validation loss of the
    trained map: the validation points of ``validation = (X_val, values_val, weight_val)``
    attend to all training points ``X``. A grid of ``log T`` over +-2.5 around the current value
    (step 0.5), then grids of step 0.1 and 0.02 around the best point found so far. For
    ``loss="log_loss"`` the validation loss counts one pseudo-error more (see below).
    Returns the minimised objective: the validation loss, with that pseudo-error."""
    X_val, values_val, weight_val = validation
    metric_map.eval()
    keys, queries = metric_map.key(X), metric_map.query(X_val)
    log_prior, total = _key_log_prior(weight), weight_val.sum()
    # Every candidate temperature scales the same scores: computed once when they, the logits
    # and their softmax fit the working memory (an attention call per temperature otherwise),
    # and each cache-sized chunk of them is scored at every temperature of a grid while it is
    # in the cache (one pass over the scores per grid instead of one per temperature).
    n_pairs = queries.shape[0] * keys.shape[0]
    scores = None
    if 3 * n_pairs * X.element_size() <= budget_bytes(None):
        scorer = Scorer(keys, metric_map.kind)
        scores = scorer.logits(scorer.prepare_queries(queries), 0, scorer.n_keys, scale=1.0)
        # [values, 1]^T: one product gives each row's weighted values and its normaliser
        values_1t = torch.cat([values, values.new_ones((values.shape[0], 1))], 1).T.contiguous()

    def terms(pred, rows):
        """The rows' weighted loss and (classes) the largest probability of a wrong class."""
        target = values_val[rows]
        wrong = pred.masked_fill(target > 0, 0.0).amax() if loss == "log_loss" else 0.0
        return float((weight_val[rows] * _loss(pred, target, loss)).sum()), float(wrong)

    # Classes: one pseudo-error more, Laplace's rule of succession: the validation point
    # likeliest to be wrong counted once as if it were (the loss of its likeliest wrong class,
    # with the mean weight). Without it, a validation split that the map separates perfectly
    # (small or easy sets) is fitted best by T -> 0, and the test set's rare errors then get
    # probabilities near 0 (log-loss 0.4-0.9 on wdbc, 65 validation points, against 0.1-0.3
    # for HistGradientBoosting).
    pseudo_weight = float(total) / weight_val.shape[0] if loss == "log_loss" else 0.0

    def objective(loss_sum, wrong):
        pseudo = -math.log(max(wrong, _LOG_EPS)) if pseudo_weight else 0.0
        return (loss_sum + pseudo_weight * pseudo) / (float(total) + pseudo_weight)

    def val_losses(log_ts):
        if scores is None:
            return [objective(*terms(attention(
                queries, keys, values, metric=metric_map.kind, temperature=math.exp(log_t),
                log_prior=log_prior, on_empty="zero", device=X.device, dtype=X.dtype,
            ), slice(None))) for log_t in log_ts]
        sums, wrongs = [0.0] * len(log_ts), [0.0] * len(log_ts)
        for rows in cache_row_slices(*scores.shape, scores.device):
            chunk = scores[rows]
            z = torch.empty_like(chunk)
            if log_prior is None:  # max(scores / T) = max(scores) / T: one shift for every T
                shifted = chunk - chunk.amax(1, keepdim=True)
            for j, log_t in enumerate(log_ts):
                if log_prior is None:
                    torch.mul(shifted, math.exp(-log_t), out=z)
                else:
                    torch.add(log_prior, chunk, alpha=math.exp(-log_t), out=z)
                    z.sub_(z.amax(1, keepdim=True))
                # (the flush: this calibration took 0.88 s without it, 0.53 s with, on magic;
                # values^T @ p^T: 4 times faster than p @ values for a few values, measured)
                sums_1 = (values_1t @ flushed_exp(z, inplace=True).T).T
                loss_sum, wrong = terms(sums_1[:, :-1] / sums_1[:, -1:], rows)
                sums[j] += loss_sum
                wrongs[j] = max(wrongs[j], wrong)
        return [objective(*pair) for pair in zip(sums, wrongs, strict=True)]

    best, best_loss = float(log_temperature), math.inf
    for half, step in _CALIBRATION_GRIDS:
        n_steps = round(half / step)
        grid = [best + i * step for i in range(-n_steps, n_steps + 1) if i or best_loss == math.inf]
        losses = val_losses(grid)
        i = min(range(len(grid)), key=losses.__getitem__)
        if losses[i] < best_loss:
            best, best_loss = grid[i], losses[i]
    best = clamp_log_temperature(best, log_temperature.dtype)
    log_temperature.fill_(best)
    return best_loss


def _key_log_prior(weight):
    """The sample weights as the keys' log-prior; ``None`` for unit weights (a prior of zeros
    changes nothing and adding it is one more pass over every score block)."""
    return torch.log(weight) if bool((weight != 1).any()) else None


def _exp_in_range(log_t):
    """``exp(log_t)`` kept inside the dtype's normal range: an exp that under- or overflows to 0
    or inf is the limit without a gradient, and the backward pass would fail."""
    return torch.exp(clamp_log_temperature(log_t))
