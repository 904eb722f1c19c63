"""The one training loop of the library and its callbacks (torch only).

:func:`run_training` runs epochs of minibatch steps; what happens after each epoch (progress
reports, early stopping with validation) is a :class:`Callback`. Built on it:

* ``_metric_training.train_metric``: a pseudo-metric by leave-one-out soft-neighbour
  likelihood (the metric estimators), with ``_calibration.calibrate_temperature`` after it;
* :func:`train_network`: a network of class logits (``skattention.nn.IPN``) by minibatch
  cross-entropy with Adam (``AttentionNetworkClassifier``).

Every tensor lives on the device of the training inputs, which the estimator resolved from its
``device``.
"""

import contextlib
import math
from dataclasses import dataclass

import torch

from ._optimizers import Adam
from ._parallel import SMALL_STEP_WORK, kept_workers, small_work_single_threaded
from ._scratch import reused_buffers


@contextlib.contextmanager
def autograd_on():
    """Autograd recording whatever the caller's mode: a fit called under ``torch.no_grad()``
    or ``torch.inference_mode()`` (a serving loop that also refits) trains as anywhere else
    (the backward of a step found no graph); tensors made in it are ordinary ones."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


class EpochBatches:
    """The ``batches`` of :func:`run_training` over ``n`` points: each epoch a random order of
    them all, or (``epoch_rows``, ``train_metric``'s) that many, the next ones of a random
    order that carries over from epoch to epoch, cut into minibatches of ``batch_size``."""

    def __init__(self, n, epoch_rows, batch_size, generator):
        self.n, self.batch_size, self.generator = n, batch_size, generator
        self.rows = n if epoch_rows is None else min(n, epoch_rows)
        self.order = torch.empty(0, dtype=torch.long)

    def __call__(self):
        if self.rows == self.n:
            return torch.randperm(self.n, generator=self.generator).split(self.batch_size)
        if self.order.numel() < self.rows:
            # the points not yet visited come first, then a new order of every point
            fresh = torch.randperm(self.n, generator=self.generator)
            self.order = torch.cat([self.order, fresh])
        epoch, self.order = self.order[: self.rows], self.order[self.rows:]
        return epoch.split(self.batch_size)


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
    each epoch every callback runs, in order; training stops when one of them asks to. The
    steps reuse their scratch buffers and worker threads (:func:`reused_buffers`,
    :func:`kept_workers`).
    """
    history = history or TrainingHistory()
    with reused_buffers(), kept_workers():
        _epochs(model, optimizer, max_iter, batches, step, history, callbacks)
    for callback in callbacks:
        callback.on_train_end(history)
    model.eval()
    return history


def _epochs(model, optimizer, max_iter, batches, step, history, callbacks):
    """The epochs of :func:`run_training`, until ``max_iter`` or a callback's stop."""
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


@dataclass(frozen=True)
class WindowRule:
    """:class:`EarlyStopping`'s rule for a window of the last ``n_iter_no_change`` epochs: stop
    when together they improved the best validation loss by less than ``gain`` of it, or (with
    ``z`` and per-row validation losses) by less than ``z`` standard errors of the per-row
    differences between the two best epochs, paired on the same rows: a slow steady gain
    passes, a plateau's small gains (within the validation rows' noise) do not."""

    gain: float
    z: float = None

    def stops(self, before, best, before_rows, best_rows):
        if before - best < self.gain * abs(before):
            return True
        if self.z is None or best_rows is None or before_rows is None:
            return False
        gains = (before_rows - best_rows) * before_rows.numel()  # per row, summing to the gain
        spread = float(gains.std()) / math.sqrt(gains.numel())
        return float(gains.mean()) < self.z * spread


class EarlyStopping(Callback):
    """Stop when the monitored loss has not improved by ``tol`` for ``n_iter_no_change`` epochs:
    the one stopping rule of every trainer.

    With ``validate`` (a function returning ``(score, loss)`` on held-out points, or ``(score,
    loss, rows)`` with each row's share of the loss), the validation loss is monitored, recorded
    in the history with its score, and the state of the best epoch (``snapshot()``) is restored
    at the end (``restore(state)``); without, the training loss (as
    :class:`~sklearn.neural_network.MLPClassifier` without early stopping). ``history``: that of
    earlier epochs (a warm start), whose best losses are the ones to beat; ``None`` for none.
    ``window``: a :class:`WindowRule` that also stops training (``None``: none).
    """

    def __init__(self, n_iter_no_change, tol, history=None, validate=None, snapshot=None,
                 restore=None, window=None):
        self.n_iter_no_change, self.tol = n_iter_no_change, tol
        self.window, self.bests = window, []
        self.validate, self.snapshot, self.restore = validate, snapshot, restore
        history = history or TrainingHistory()
        self.best_val = (
            math.inf if history.best_validation_loss is None else history.best_validation_loss
        )
        self.best_loss = min(history.loss_curve) if history.loss_curve else math.inf
        self.best_state = self.best_rows = None
        self.stall = 0

    def on_epoch_end(self, history):
        if self.validate is not None:
            score, val_loss, *rows = self.validate()
            history.validation_scores.append(score)
            history.validation_losses.append(val_loss)
            improved = val_loss < self.best_val - self.tol
            if val_loss < self.best_val:
                self.best_val, self.best_rows = val_loss, rows[0] if rows else None
                history.best_validation_loss, history.best_validation_score = val_loss, score
                self.best_state = self.snapshot()
        else:
            epoch_loss = history.loss_curve[-1]
            improved = epoch_loss < self.best_loss - self.tol
            self.best_loss = min(self.best_loss, epoch_loss)
        self.stall = 0 if improved else self.stall + 1
        best = self.best_val if self.validate is not None else self.best_loss
        self.bests.append((best, self.best_rows))
        if self.window is not None and len(self.bests) > self.n_iter_no_change:
            before = self.bests[-1 - self.n_iter_no_change]
            if self.window.stops(before[0], best, before[1], self.best_rows):
                return True
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


def train_network(net, X, y, *, max_iter, batch_size, learning_rate, weight_decay, order,
                  callbacks=(), step_work=None):
    """Train the class logits ``net(X)`` against labels ``y`` by minibatch cross-entropy (Adam
    with L2 weight decay); ``order()`` gives each epoch's permutation of the samples. Returns
    the :class:`TrainingHistory` (the loss curve: mean cross-entropy per epoch).
    ``step_work``: the multiply-adds of a step's attention; a loop of small steps runs on one
    thread (as the learned metrics' training does: :data:`SMALL_STEP_WORK`)."""
    optimizer = Adam(net.parameters(), lr=learning_rate, weight_decay=weight_decay,
                     decoupled=False)

    def step(idx):
        optimizer.zero_grad()
        batch_loss = torch.nn.functional.cross_entropy(net(X[idx]), y[idx])
        batch_loss.backward()
        return float(batch_loss.detach()), idx.numel()

    with small_work_single_threaded(math.inf if step_work is None else step_work, X.device,
                                    limit=SMALL_STEP_WORK):
        return run_training(
            net, optimizer, max_iter=max_iter, step=step, callbacks=callbacks,
            batches=lambda: order().split(batch_size),
        )
