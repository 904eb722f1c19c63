"""Calibration of a trained map's temperature on held-out points (torch only)."""

import contextlib
import math

import torch

from ._budget import budget_bytes, cache_row_slices
from ._inputs import clamp_log_temperature
from ._metric_training import _LOG_EPS, key_log_prior, soft_neighbour_loss
from ._parallel import one_thread
from ._scores import PreparedKeys
from ._softmax import flushed_exp

# Temperature calibration: a grid over log T around the trained value, then two finer grids
# around the best point so far (each step a fifth of the last one's, the best point not scored
# again); every point of a grid is scored in one pass over the scores.
_CALIBRATION_GRIDS = ((2.5, 0.5), (0.4, 0.1), (0.08, 0.02))  # (half-width, step) in log T


@torch.no_grad()
def calibrate_temperature(metric_map, log_temperature, X, values, weight, validation, loss,
                          keys=None):
    """Set ``log_temperature`` (in place) to the value with the lowest validation loss of the
    trained map: the validation points of ``validation = (X_val, values_val, weight_val)``
    attend to all training points ``X``. A grid of ``log T`` over +-2.5 around the current value
    (step 0.5), then grids of step 0.1 and 0.02 around the best point found so far. For
    ``loss="log_loss"`` the validation loss counts one pseudo-error more (see below).
    ``keys``: ``(points, values, log_prior)`` already in the map's key space (e.g. prototypes
    of the training points' keys) that the validation points attend to instead of ``X``,
    ``values`` and ``weight``. Returns the minimised objective: the validation loss, with that
    pseudo-error."""
    X_val, values_val, weight_val = validation
    metric_map.eval()
    if keys is None:
        points, log_prior = metric_map.key(X), key_log_prior(weight)
    else:
        points, values, log_prior = keys
    queries, total = metric_map.query(X_val), weight_val.sum()
    prepared = PreparedKeys(points, metric_map.kind)
    # [values, 1]^T: one product gives each row's weighted values and its normaliser
    values_1t = torch.cat([values, values.new_ones((values.shape[0], 1))], 1).T.contiguous()
    # Every candidate temperature scales the same scores: each block of query rows whose scores,
    # logits and softmax fit the working memory is scored once per grid, and each cache-sized
    # chunk of it at every temperature of the grid while it is in the cache (one pass over the
    # scores per grid instead of one per temperature).
    block = max(1, budget_bytes(None) // (3 * prepared.n_keys * points.element_size()))
    whole = None
    if block >= queries.shape[0]:  # one block: its scores serve every grid
        whole = prepared.logits(prepared.prepare_queries(queries), 0, prepared.n_keys, scale=1.0)

    def score_chunks():
        """``(rows, scores)`` of cache-sized chunks of validation rows."""
        for start in range(0, queries.shape[0], block):
            stop = min(queries.shape[0], start + block)
            scores = whole if whole is not None else prepared.logits(
                prepared.prepare_queries(queries[start:stop]), 0, prepared.n_keys, scale=1.0)
            for rows in cache_row_slices(*scores.shape, scores.device):
                yield slice(start + rows.start, start + rows.stop), scores[rows]

    def terms(pred, rows):
        """The rows' weighted loss and (classes) the largest probability of a wrong class."""
        target = values_val[rows]
        wrong = pred.masked_fill(target > 0, 0.0).amax() if loss == "log_loss" else 0.0
        loss_sum = (weight_val[rows] * soft_neighbour_loss(pred, target, loss)).sum()
        return float(loss_sum), float(wrong)

    # Classes: one pseudo-error more, Laplace's rule of succession: the validation point
    # likeliest to be wrong counted once as if it were (the loss of its likeliest wrong class,
    # with the mean weight). Without it, a validation split that the map separates perfectly
    # (small or easy sets) is fitted best by T -> 0, and the test set's rare errors then get
    # probabilities near 0, a large log-loss (docs/performance.md, "Engine design notes").
    pseudo_weight = float(total) / weight_val.shape[0] if loss == "log_loss" else 0.0

    def objective(loss_sum, wrong):
        pseudo = -math.log(max(wrong, _LOG_EPS)) if pseudo_weight else 0.0
        return (loss_sum + pseudo_weight * pseudo) / (float(total) + pseudo_weight)

    def val_losses(log_ts):
        sums, wrongs = [0.0] * len(log_ts), [0.0] * len(log_ts)
        for rows, chunk in score_chunks():
            with one_thread() if chunk.device.type == "cpu" else contextlib.nullcontext():
                _score_chunk(chunk, rows, log_ts, sums, wrongs)
        return [objective(*pair) for pair in zip(sums, wrongs, strict=True)]

    def _score_chunk(chunk, rows, log_ts, sums, wrongs):
        """Add a cache-sized chunk's loss at every temperature of ``log_ts`` to ``sums`` (and
        its largest wrong probability to ``wrongs``), on one thread: passes over a chunk that
        fits a core's cache are too short for a parallel region to pay."""
        z = torch.empty_like(chunk)
        if log_prior is None:  # max(scores / T) = max(scores) / T: one shift for every T
            shifted = chunk - chunk.amax(1, keepdim=True)
        for j, log_t in enumerate(log_ts):
            if log_prior is None:
                torch.mul(shifted, math.exp(-log_t), out=z)
            else:
                torch.add(log_prior, chunk, alpha=math.exp(-log_t), out=z)
                z.sub_(z.amax(1, keepdim=True))
            # flushed exponentials and values^T @ p^T, the fast forms for a few values
            # (docs/performance.md, "Fit")
            sums_1 = (values_1t @ flushed_exp(z, inplace=True).T).T
            loss_sum, wrong = terms(sums_1[:, :-1] / sums_1[:, -1:], rows)
            sums[j] += loss_sum
            wrongs[j] = max(wrongs[j], wrong)

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
