"""Calibration of a trained map's temperature on held-out points (torch only)."""

import math

import torch

from ._budget import budget_bytes, cache_row_slices
from ._inputs import clamp_log_temperature
from ._metric_training import _LOG_EPS, key_log_prior, soft_neighbour_loss
from ._near_far import near_far_bytes, near_far_scores, near_width
from ._parallel import map_blocks
from ._scores import PreparedKeys
from ._softmax import LOG2E, flush_below, flushed_exp

# Temperature calibration: a grid over log T around the trained value, then two finer grids
# around the best point so far (each step a fifth of the last one's, the best point not scored
# again), each searched by _lattice_minimum.
_CALIBRATION_GRIDS = ((2.5, 0.5), (0.4, 0.1), (0.08, 0.02))  # (half-width, step) in log T


@torch.no_grad()
def calibrate_temperature(metric_map, log_temperature, X, values, weight, validation, loss,
                          keys=None):
    """Set ``log_temperature`` (in place) to the value with the lowest validation loss of the
    trained map: the validation points of ``validation = (X_val, values_val, weight_val)``
    attend to all training points ``X``. A grid of ``log T`` over +-2.5 around the current value
    (step 0.5), then grids of step 0.1 and 0.02 around the best point found so far (searched
    outward from it: :func:`_lattice_minimum`). For
    ``loss="log_loss"`` the validation loss counts one pseudo-error more (see below).
    ``keys``: the training points' keys grouped around prototypes (:class:`GroupedKeys`) that
    the validation points attend to (:func:`near_far_attention`) instead of ``X``, ``values``
    and ``weight``. Returns the minimised objective: the validation loss, with that
    pseudo-error; ``nan``, the temperature kept, where every validation weight is zero (their
    loss is 0/0 at every temperature: they judge none)."""
    X_val, values_val, weight_val = validation
    metric_map.eval()
    total = weight_val.sum()
    if not float(total) > 0:
        return math.nan
    queries = metric_map.query(X_val)

    # Classes: one pseudo-error more, Laplace's rule of succession: the validation point
    # likeliest to be wrong counted once as if it were (the loss of its likeliest wrong class,
    # with the mean weight). Without it, a validation split that the map separates perfectly
    # (small or easy sets) is fitted best by T -> 0, and the test set's rare errors then get
    # probabilities near 0, a large log-loss (docs/performance.md, "Engine design notes").
    pseudo_weight = float(total) / weight_val.shape[0] if loss == "log_loss" else 0.0

    def objectives(block_terms):
        """The objective at each temperature from every block's ``[(loss_sum, wrong), ...]``
        (one pair per temperature), the blocks' loss sums added in order."""
        sums, wrongs = None, None
        for terms_at in block_terms:
            if sums is None:
                sums, wrongs = [0.0] * len(terms_at), [0.0] * len(terms_at)
            for j, (loss_sum, wrong) in enumerate(terms_at):
                sums[j] += loss_sum
                wrongs[j] = max(wrongs[j], wrong)
        return [(loss_sum + pseudo_weight * -math.log(max(wrong, _LOG_EPS))
                 if pseudo_weight else loss_sum) / (float(total) + pseudo_weight)
                for loss_sum, wrong in zip(sums, wrongs, strict=True)]

    def terms(pred, rows):
        """The weighted loss of the validation rows ``rows`` predicted ``pred`` and (classes)
        the largest probability of a wrong class among them."""
        target = values_val[rows]
        wrong = pred.masked_fill(target > 0, 0.0).amax() if loss == "log_loss" else 0.0
        return (float((weight_val[rows] * soft_neighbour_loss(pred, target, loss)).sum()),
                float(wrong))

    workers = max(1, torch.get_num_threads()) if queries.device.type == "cpu" else 1
    if keys is not None:
        block_terms_at = _grouped_block_terms(queries, keys, terms, workers)
        return _search(lambda log_ts: objectives(block_terms_at(log_ts)), log_temperature)

    points, log_prior = metric_map.chunked_keys(X), key_log_prior(weight)
    log_prior2 = None if log_prior is None else log_prior * LOG2E
    prepared = PreparedKeys(points, metric_map.kind)
    # [values, 1]^T: one product gives each row's weighted values and its normaliser
    values_1t = torch.cat([values, values.new_ones((values.shape[0], 1))], 1).T.contiguous()
    # Every candidate temperature scales the same scores: each block of query rows whose scores,
    # logits and softmax fit a worker's share of the working memory is scored once per grid, and
    # each cache-sized chunk of it at every temperature of the grid while it is in the cache
    # (one pass over the scores per grid instead of one per temperature). The blocks go to the
    # engine's workers (one thread each: passes over a chunk that fits a core's cache are too
    # short for a parallel region to pay); their terms are added in block order.
    per_row = 3 * prepared.n_keys * points.element_size()
    block = max(1, budget_bytes(None) // per_row)
    whole = (prepared.logits(prepared.prepare_queries(queries), 0, prepared.n_keys, scale=1.0)
             if block >= queries.shape[0] else None)  # one block: scores for every grid
    block = max(1, min(block // workers, -(-queries.shape[0] // workers)))
    starts = range(0, queries.shape[0], block)

    def block_terms(start, log_ts):
        """The weighted loss of the rows of the block at ``start`` at every temperature of
        ``log_ts``, and (classes) the largest probability of a wrong class among them."""
        stop = min(queries.shape[0], start + block)
        scores = whole[start:stop] if whole is not None else prepared.logits(
            prepared.prepare_queries(queries[start:stop]), 0, prepared.n_keys, scale=1.0)
        sums = scores.new_empty((len(log_ts), stop - start, values_1t.shape[0]))
        for rows in cache_row_slices(*scores.shape, scores.device):
            _chunk_sums(scores[rows], log_ts, sums[:, rows])
        return [terms(sums[j, :, :-1] / sums[j, :, -1:], slice(start, stop))
                for j in range(len(log_ts))]

    def _chunk_sums(chunk, log_ts, out):
        """``out[j]``: the chunk's rows' [weighted values, normaliser] at ``log_ts[j]``."""
        z = torch.empty_like(chunk)
        low = flush_below(chunk.dtype)
        if log_prior is None:  # max(scores / T) = max(scores) / T: one shift for every T
            shifted = chunk - chunk.amax(1, keepdim=True)
            lowest = float(shifted.min())
        # the logits in base 2 (LOG2E folded into the temperature and the prior:
        # flushed_exp's base2)
        for j, log_t in enumerate(log_ts):
            if log_prior is None:
                torch.mul(shifted, math.exp(-log_t) * LOG2E, out=z)
                # no weight of the chunk is near the flush at this temperature: exp2 alone,
                # the same weights as flushed_exp's three passes
                p = (z.exp2_() if lowest * math.exp(-log_t) > low + 1.0
                     else flushed_exp(z, inplace=True, base2=True))
            else:
                torch.add(log_prior2, chunk, alpha=math.exp(-log_t) * LOG2E, out=z)
                z.sub_(z.amax(1, keepdim=True))
                p = flushed_exp(z, inplace=True, base2=True)
            # values^T @ p^T, the fast form for a few values (docs/performance.md, "Fit")
            out[j] = (values_1t @ p.T).T

    return _search(lambda log_ts: objectives(map_blocks(
        lambda start: block_terms(start, log_ts), starts, workers)), log_temperature)


def _grouped_block_terms(queries, keys, terms, workers):
    """``terms_at(log_ts)``: every block's ``[terms(outputs, rows) at each log T]`` of the
    ``queries`` attending to the grouped ``keys`` (:func:`near_far_scores`), in block order.

    Blocks of queries whose scores fit a worker's share of the working memory go to the
    engine's workers (one thread each: a block's group-by-group kernels are too short for a
    parallel region to pay, and each would wait for a descheduled thread on a busy machine).
    Every block's scores are kept for the next grids where all of them fit the budget, as
    many near keys as the queries actually have (not the largest groups' bound that sizes the
    blocks); else each grid scores them again, the same numbers."""
    budget = budget_bytes(None)
    rows = max(1, budget // workers // max(1, near_far_bytes(keys, 1)))
    rows = max(1, min(rows, -(-queries.shape[0] // workers)))
    width = max((near_width(queries[start:start + rows], keys)
                 for start in range(0, queries.shape[0], rows)), default=0)
    kept = {} if near_far_bytes(keys, queries.shape[0], width) <= budget else None
    keys.prepared()  # made once here, not by each worker

    def block_terms(start, log_ts):
        block = slice(start, min(queries.shape[0], start + rows))
        scores = None if kept is None else kept.get(start)
        if scores is None:
            scores = near_far_scores(queries[block], keys)
            if kept is not None:
                kept[start] = scores  # (each block's own entry: one worker writes it)
        return [terms(scores.outputs(math.exp(log_t)), block) for log_t in log_ts]

    starts = range(0, queries.shape[0], rows)
    return lambda log_ts: map_blocks(lambda start: block_terms(start, log_ts), starts, workers)


def _search(losses_at, log_temperature):
    """Set ``log_temperature`` to the calibration grids' best point of ``losses_at(log_ts)``
    (losses of several points in one pass); returns its loss."""
    # from inside the dtype's range: a training that diverged can leave the parameter far out
    # (the temperatures it used were clamped), where the grid's exp would overflow
    best = clamp_log_temperature(float(log_temperature), log_temperature.dtype)
    best_loss = math.inf
    for half, step in _CALIBRATION_GRIDS:
        if best_loss == math.inf:
            # the first grid whole: over +-2.5 the loss may have a second minimum (towards a
            # broad T on small noisy sets)
            grid = [best + i * step for i in range(-round(half / step), round(half / step) + 1)]
            losses = losses_at(grid)
            best, best_loss = min(zip(grid, losses), key=lambda pair: pair[1])
        else:
            best, best_loss = _lattice_minimum(losses_at, best, best_loss, step,
                                               round(half / step))
    best = clamp_log_temperature(best, log_temperature.dtype)
    log_temperature.fill_(best)
    return best_loss


def _lattice_minimum(losses_at, centre, centre_loss, step, n_steps):
    """``(point, loss)``: the lowest loss on the grid ``centre + i * step``, ``0 < |i| <=
    n_steps`` (ties to the lower point) where it is below ``centre_loss``, else ``(centre,
    centre_loss)``. ``losses_at(points)`` scores points in one pass over the scores.

    The centre's two neighbours are scored, then the points beyond the lower one, two a pass,
    while the losses keep falling: near the minimum found by a coarser grid the loss falls and
    then rises along the grid, and its minimum is found without scoring the rest; where both
    neighbours are lower, the whole grid is scored."""
    loss_at = {0: centre_loss}

    def score(indices):
        indices = [i for i in indices if abs(i) <= n_steps and i not in loss_at]
        loss_at.update(zip(indices, losses_at([centre + i * step for i in indices]),
                           strict=True))

    score([-1, 1])
    down, up = loss_at[-1] < centre_loss, loss_at[1] < centre_loss
    if down and up:
        score(range(-n_steps, n_steps + 1))
    elif down or up:
        way = -1 if down else 1
        edge = way
        while abs(edge) < n_steps and loss_at[edge] < loss_at[edge - way]:
            score([edge + way, edge + 2 * way])
            edge = max(loss_at, key=lambda i: way * i)
    i = min(sorted(i for i in loss_at if i), key=loss_at.__getitem__)
    return (centre + i * step, loss_at[i]) if loss_at[i] < centre_loss else (centre, centre_loss)
