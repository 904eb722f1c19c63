"""End-to-end training of a pseudo-metric by leave-one-out soft-neighbour likelihood (torch only).

The recipe of NCA and ModernNCA in the notation of THEORY.md: each minibatch of training points
attends, through :func:`attention`, to a random sample of candidate training points with itself
excluded, and the propagated labels are scored against the true ones (log-loss for classes,
squared error for targets). The map and a log-temperature are optimised with AdamW.
"""

import copy
import math

import torch

from ._attention import _budget_bytes, attention

_LOG_EPS = 1e-7  # floor of a propagated class probability inside the log-loss


class TrainingHistory:
    """Per-epoch training loss, validation score and loss; the best epoch's validation figures."""

    def __init__(self):
        self.loss_curve = []
        self.validation_scores = []
        self.validation_losses = []
        self.best_validation_score = None
        self.best_validation_loss = None
        self.n_iter = 0


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
    history=None,
    optimizer_state=None,
    callback=None,
):
    """Train ``metric_map`` (and ``log_temperature`` if it requires grad) in place.

    Parameters
    ----------
    metric_map : MetricMap
    log_temperature : Tensor (0-d)
        Learned when it requires grad, else fixed.
    X : Tensor (n, d)
        Training inputs (already on the compute device).
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
    n_candidates : int
        Candidate keys sampled for each minibatch (all points when >= n).
    generator : torch.Generator
        Drives batches and candidate samples (on the CPU, for reproducibility).
    callback : callable(epoch, loss, score) or None
        Called after each epoch (progress reporting).

    Returns
    -------
    history : TrainingHistory
    optimizer_state : dict
        To continue training (``warm_start``).
    """
    history = history or TrainingHistory()
    device = X.device
    n = X.shape[0]
    log_prior = torch.log(weight)
    learned_t = log_temperature.requires_grad
    groups = [{"params": list(metric_map.parameters()), "weight_decay": weight_decay}]
    if learned_t:
        groups.append({"params": [log_temperature], "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, lr=learning_rate)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    best_val = math.inf if history.best_validation_loss is None else history.best_validation_loss
    best_loss = min(history.loss_curve) if history.loss_curve else math.inf
    best_state = None
    stall = 0
    in_batch = torch.zeros(n, dtype=torch.bool)
    symmetric = metric_map.kind != "dot"
    for _ in range(max_iter):
        metric_map.train()
        order = torch.randperm(n, generator=generator)
        total, total_weight = 0.0, 0.0
        for batch in order.split(batch_size):
            # Candidates: the batch itself plus a random sample of the other points, so a
            # symmetric map embeds every point of the step once. Each point is excluded from
            # its own candidates.
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
                continue  # a batch of zero-weight points carries no loss
            keys = metric_map.key(X[cand_d])
            queries = keys[own_d] if symmetric else metric_map.query(X[batch_d])
            temperature = _exp_in_range(log_temperature)
            # Under autograd a step's scores stay alive until backward: a batch too large for
            # working_memory is split into chunks whose gradients are accumulated (same sum).
            rows = batch_rows(candidates.numel(), values.shape[1], keys.shape[1], X.element_size())
            optimizer.zero_grad(set_to_none=True)
            batch_loss, w_sum = 0.0, w.sum()
            for s in range(0, batch.numel(), rows):
                e = min(batch.numel(), s + rows)
                out = attention(
                    queries[s:e], keys, values[cand_d],
                    metric=metric_map.kind, temperature=temperature,
                    log_prior=log_prior[cand_d], exclude_self=own_d[s:e], on_empty="zero",
                )
                per_point = _loss(out, values[batch_d[s:e]], loss)
                part = (w[s:e] * per_point).sum() / w_sum
                part.backward(retain_graph=e < batch.numel())
                batch_loss += float(part.detach())
                del out, per_point, part  # free this chunk's scores before the next chunk's
            optimizer.step()
            total += batch_loss * float(w_sum)
            total_weight += float(w_sum)
        epoch_loss = total / total_weight if total_weight > 0 else 0.0
        history.loss_curve.append(epoch_loss)
        history.n_iter += 1
        score = None
        if validation is not None:
            score, val_loss = validation_score(metric_map, log_temperature, X, values, log_prior, validation, loss)
            history.validation_scores.append(score)
            history.validation_losses.append(val_loss)
            improved = val_loss < best_val - tol
            if val_loss < best_val:
                best_val = val_loss
                history.best_validation_loss, history.best_validation_score = val_loss, score
                best_state = (copy.deepcopy(metric_map.state_dict()), log_temperature.detach().clone())
        else:
            improved = epoch_loss < best_loss - tol
            best_loss = min(best_loss, epoch_loss)
        stall = 0 if improved else stall + 1
        if callback is not None:
            callback(history.n_iter, epoch_loss, score)
        if stall >= n_iter_no_change:
            break
    if best_state is not None:
        metric_map.load_state_dict(best_state[0])
        with torch.no_grad():
            log_temperature.copy_(best_state[1])
    metric_map.eval()
    return history, optimizer.state_dict()


def batch_rows(n_candidates, n_values, dim, itemsize, working_memory=None):
    """Most minibatch rows whose training step fits ``working_memory`` (MiB; ``None``: config).

    Under autograd the (rows x n_candidates) scores of a step, their exponentials and, in the
    backward pass, their gradients coexist: about 4 values and a mask byte per pair (measured:
    13 bytes per pair in float32), plus per-row outputs, targets and gradients.
    """
    budget = _budget_bytes(working_memory)
    per_row = n_candidates * (4 * itemsize + 2) + itemsize * (4 * n_values + 4 * dim + 8)
    if per_row > budget:
        raise MemoryError(
            f"training attends each point to {n_candidates} candidate points: one point needs "
            f"{per_row / 2**20:.2f} MiB of scratch memory but the budget is {budget / 2**20:.2f} MiB; "
            "raise working_memory (skattention.config_context(working_memory=...)) or lower "
            "sample_rate (fewer candidates per minibatch)."
        )
    return int(budget // per_row)


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
    )
    total = weight_val.sum()
    val_loss = float((weight_val * _loss(pred, values_val, loss)).sum() / total)
    if loss == "log_loss":
        correct = (pred.argmax(1) == values_val.argmax(1)).to(pred.dtype)
        return float((weight_val * correct).sum() / total), val_loss
    mean = (weight_val[:, None] * values_val).sum(0) / total
    sst = float((weight_val * ((values_val - mean) ** 2).sum(1)).sum() / total)
    return (1.0 - val_loss / sst if sst > 0 else -val_loss), val_loss


def _exp_in_range(log_t):
    """``exp(log_t)`` kept inside the dtype's normal range: an exp that under- or overflows to 0
    or inf is the limit without a gradient, and the backward pass would fail."""
    info = torch.finfo(log_t.dtype)
    return torch.exp(log_t.clamp(0.5 * math.log(info.tiny), 0.5 * math.log(info.max)))
