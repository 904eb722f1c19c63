"""Prototypes of the keys: dense attention over many keys, summarised.

A learned metric's attention is broad: most training points carry weight for every query, so
no key can be pruned exactly, and a prediction over 10^5-10^6 keys costs a pass over all of
them. The keys are grouped around prototypes (k-means' groups after one step from keys drawn at
random), and a query attends exactly to the keys of its :data:`NEAR_GROUPS` nearest groups and
to every other group through its prototype (the engine's ``near_far_attention``: a prototype is
the prior-weighted mean of its keys, with their mean values and summed prior weight). How
closely that follows attention over every key is measured when they are chosen
(:func:`choose_prototypes`, on held-out queries against exact attention over every key), and
they are used only within a tolerance (docs/theory.md, "Computing it exactly";
docs/neighbors.md, "Many training points").
"""

import math

import torch

from .._engine import attention, calibrate_temperature, group_keys, near_far_attention
from ..utils._warnings import warn_user

# prototypes="auto": PROTOTYPES_PER_ROOT * sqrt(n_keys) prototypes (a query's scores, the
# prototypes' and the near groups' keys, grow as sqrt(n_keys); a block's pass visits every
# group near to one of its queries, so not many more), at least MIN_KEYS // 64 and at most
# AUTO_PROTOTYPES, from MIN_KEYS keys
AUTO_PROTOTYPES = 4096
PROTOTYPES_PER_ROOT = 2.0
MIN_KEYS = 16384
# a query attends exactly to the keys of its nearest this many groups
NEAR_GROUPS = 16
# "auto" keeps prototypes whose outputs on the held-out queries differ from exact attention by at
# most this much on average (half the L1 distance of class probabilities: the probability mass
# moved; for targets, standardised units)
TOLERANCE = 0.01
# held-out queries of that check
CHECK_QUERIES = 1024


def prototype_centres(points, n_prototypes, generator):
    """Starting centres of the prototypes: ``n_prototypes`` rows of ``points`` (a tensor)
    drawn at random. :func:`summarize` then moves each to the mean of the keys nearest to it
    (one step of Lloyd's algorithm; more steps barely lowered the measured error, at several
    times the cost: docs/performance.md)."""
    order = torch.randperm(points.shape[0], generator=generator)[:n_prototypes]
    return points[order.to(points.device)].clone()


def summarize(points, values, log_prior, centres, kind, n_near=None, row_groups=None):
    """The keys ``points`` (with their ``values`` and ``log_prior``, tensors on one device)
    grouped around ``centres`` for the engine's ``near_far_attention`` (a ``GroupedKeys``,
    exact over each query's ``n_near`` nearest groups, :data:`NEAR_GROUPS` for ``None``): every
    key joins its nearest centre; centres without a key are dropped. ``row_groups``: the
    distinct input row of each key (or ``None``), whose equal keys are kept as one."""
    return group_keys(points, values, log_prior, centres, kind,
                      NEAR_GROUPS if n_near is None else n_near, row_groups)


def output_error(approx, exact, loss):
    """Mean over queries of the difference of two attention outputs: half the L1 distance of
    class probabilities (the probability mass moved), or the L1 distance of targets."""
    distance = (approx - exact).abs().sum(1)
    return float((0.5 * distance if loss == "log_loss" else distance).mean())


def prototype_count(setting, n_keys):
    """The number of prototypes for ``n_keys`` keys (``prototypes=setting``), or ``None`` for
    attention over every key."""
    if setting is None or (setting == "auto" and n_keys < MIN_KEYS):
        return None
    if setting == "auto":
        count = min(AUTO_PROTOTYPES,
                    max(round(PROTOTYPES_PER_ROOT * math.sqrt(n_keys)), MIN_KEYS // 64))
    else:
        count = int(setting)
        if count >= n_keys:
            warn_user(f"prototypes={count} is not fewer than the {n_keys} training points "
                      "the fit trained on (those left by a validation split, if any): every "
                      "key is attended to (n_prototypes_ is None).")
    return count if count < n_keys else None


def summary_error(grouped, queries, temperature, loss):
    """The mean difference (:func:`output_error`) between the held-out ``queries``' attention
    over ``grouped`` and over every key. Every key is the grouped keys themselves (the keys in
    their groups' order, equal rows kept as one, zero-weight groups left out: the same
    attention, summed in another order), already prepared for :func:`near_far_attention`: a
    second preparation of the keys was a fit's largest allocation on many rows."""
    points = grouped.points
    exact = attention(queries, grouped.prepared()[0], grouped.values,
                      log_prior=grouped.log_prior, metric=grouped.kind, temperature=temperature,
                      device=points.device, dtype=points.dtype)
    return output_error(near_far_attention(queries, grouped, temperature), exact, loss)


def choose_prototypes(setting, keys, queries, values, log_prior, metric, temperature, loss,
                      generator, distinct=None, row_groups=None, measure=True):
    """``(centres, error, grouped)``, or ``(None, None, None)`` for exact attention over every
    key; ``grouped``: :func:`summarize` of the keys at ``centres``.

    ``setting``: the estimator's ``prototypes`` (``"auto"``, a number or ``None``); ``keys``,
    ``values``, ``log_prior``: the training points' keys (tensors, one device); ``queries``:
    held-out queries, already mapped; ``metric``: the engine metric (its kind groups the keys).
    ``"auto"`` keeps ``2 sqrt(n_keys)`` prototypes (at least 256, at most
    :data:`AUTO_PROTOTYPES`) if their error is within
    :data:`TOLERANCE` of exact attention on the held-out queries (none for fewer than
    :data:`MIN_KEYS` keys); a number is used as given (if fewer than the keys), its error
    measured all the same. ``distinct``: the index of one key per distinct input row (or
    ``None``); where ``"auto"`` would keep at least as many prototypes, the distinct rows'
    keys are the prototypes, each a group of equal keys: attention over them alone is exact
    (no near group). ``row_groups``: the distinct input row of each key (or ``None``): equal
    keys kept as one (:func:`summarize`). ``measure=False``: the error is not measured here
    (``None``; the caller measures it at another temperature and decides), the prototypes
    kept.
    """
    count = prototype_count(setting, keys.shape[0])
    if count is None:
        return None, None, None
    if setting == "auto" and distinct is not None and distinct.numel() <= count:
        centres = keys[distinct.to(keys.device)]
        grouped = summarize(keys, values, log_prior, centres, metric, n_near=0,
                            row_groups=row_groups)
    else:
        centres = prototype_centres(keys, count, generator)
        grouped = summarize(keys, values, log_prior, centres, metric, row_groups=row_groups)
    if not measure:
        return centres, None, grouped
    error = summary_error(grouped, queries, temperature, loss)
    if setting != "auto" or error <= TOLERANCE:
        return centres, error, grouped
    return None, None, None


class FitPrototypes:
    """The prototypes of a learned metric's fit, chosen with its temperature: :meth:`choose`
    after training (their error measured at the trained temperature, unless :meth:`calibrate`
    follows), then :meth:`calibrate` (the temperature over the grouped keys where a query's
    scores against them are at most a quarter of every key's, else over every key; the error
    measured at the calibrated temperature and, beyond :data:`TOLERANCE` with ``"auto"``, no
    prototypes and the temperature calibrated over every key). ``centres`` and ``error`` are
    what the fit keeps (``None``: every key)."""

    def __init__(self, setting, metric_map, X, values, weight, loss):
        self.setting, self.metric_map, self.loss = setting, metric_map, loss
        self.X, self.values, self.weight = X, values, weight
        self.centres = self.error = self._check = self.n_near = None

    @torch.no_grad()
    def choose(self, log_t, pool, generator, chunk, row_groups=None, measure=True):
        """Choose them with the held-out rows ``pool`` (inputs) as check queries, at most
        :data:`CHECK_QUERIES` drawn at random (the split keeps the table's order, which may be
        sorted by time or group); the keys mapped ``chunk`` rows at a time. ``row_groups``:
        the distinct row of each training row (``choose_prototypes``' ``distinct``).
        ``measure=False``: their error is measured by :meth:`calibrate` alone, at the
        calibrated temperature, which decides (measured at the trained temperature too, it
        was the check queries' pass over every key once more, and on every table of the scale
        benchmark within the tolerance at both: docs/performance.md)."""
        if prototype_count(self.setting, self.X.shape[0]) is None:
            return
        self.metric_map.eval()
        keys = self.metric_map.chunked_keys(self.X, max_rows=chunk)
        rows = torch.randperm(pool.shape[0], generator=generator)[:CHECK_QUERIES]
        queries = self.metric_map.query(pool[rows.to(pool.device)])
        distinct = None
        if row_groups is not None:  # the first row of each distinct row
            n = row_groups.numel()
            distinct = torch.full((int(row_groups.max()) + 1,), n, device=row_groups.device)
            distinct.scatter_reduce_(0, row_groups, torch.arange(n, device=row_groups.device),
                                     "amin")
        self.centres, self.error, grouped = choose_prototypes(
            self.setting, keys, queries, self.values, torch.log(self.weight),
            self.metric_map.kind, float(torch.exp(log_t)), self.loss, generator, distinct,
            row_groups, measure)
        if self.centres is not None:
            self._check = grouped, queries
            self.n_near = grouped.n_near

    def calibrate(self, log_t, validation):
        """Calibrate the temperature ``log_t`` on ``validation`` (with the prototypes'
        check, above)."""
        over = self._check[0] if self._check else None
        if over is not None and 4 * over.scores_per_query() > self.X.shape[0]:
            over = None  # few large groups: little to save, and twice the passes per score
        calibrate_temperature(self.metric_map, log_t, self.X, self.values, self.weight,
                              validation, self.loss, keys=over)
        if not self._check:
            return
        grouped, queries = self._check
        with torch.no_grad():
            self.error = summary_error(grouped, queries, float(torch.exp(log_t)), self.loss)
        if self.setting == "auto" and self.error > TOLERANCE:
            self.centres = self.error = self._check = None
            if over is not None:
                calibrate_temperature(self.metric_map, log_t, self.X, self.values, self.weight,
                                      validation, self.loss)
