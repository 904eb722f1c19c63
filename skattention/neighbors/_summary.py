"""Prototypes of the keys: dense attention over many keys, summarised.

A learned metric's attention is broad: most training points carry weight for every query, so
no key can be pruned exactly, and a prediction over 10^5-10^6 keys costs a pass over all of
them. Keys close to each other in the metric space carry nearly the same weight, though: the
prototypes are centres of groups of nearby keys (k-means' groups after one step), each
with the summed prior weight of its keys
(``log_prior`` = the log of the sum: a prototype stands for as many keys as it holds) and
their prior-weighted mean values. Attention over them approximates attention over the keys
(exactly so as the keys of a prototype collapse to its centre). How closely is measured when
they are chosen (:func:`choose_prototypes`, on held-out queries against exact attention over
every key), and they are used only within a tolerance (docs/theory.md, "Computing it
exactly"; docs/neighbors.md, "Many training points").
"""

import torch

from .._engine import attention, kneighbors

# prototypes="auto": the numbers of prototypes tried, fewest first, for at least this many keys
AUTO_PROTOTYPES = (2048, 8192)
MIN_KEYS = 16384
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


def summarize(points, values, log_prior, centres):
    """``(points, values, log_prior)`` of the prototypes at ``centres``: every key joins its
    nearest centre; a prototype is the prior-weighted mean of its keys, carries their
    prior-weighted mean values and the log of their summed prior weight. Centres without a key
    are dropped. Tensors in, tensors out (on the device of ``points``)."""
    labels = kneighbors(points, centres, 1, metric="sqeuclidean", device=points.device,
                        dtype=points.dtype)[1][:, 0].to(points.device)
    weight = torch.exp(log_prior.to(torch.float64) - log_prior.max().to(torch.float64))
    mass = torch.zeros(centres.shape[0], dtype=torch.float64, device=points.device)
    mass.index_add_(0, labels, weight)
    sums = torch.zeros((centres.shape[0], points.shape[1]), dtype=torch.float64,
                       device=points.device).index_add_(0, labels, weight[:, None] * points)
    value_sums = torch.zeros((centres.shape[0], values.shape[1]), dtype=torch.float64,
                             device=points.device).index_add_(0, labels, weight[:, None] * values)
    keep = mass > 0
    mass = mass[keep]
    out_points = (sums[keep] / mass[:, None]).to(points.dtype)
    out_values = (value_sums[keep] / mass[:, None]).to(values.dtype)
    out_prior = (torch.log(mass) + log_prior.max().to(torch.float64)).to(log_prior.dtype)
    return out_points, out_values, out_prior


def output_error(approx, exact, loss):
    """Mean over queries of the difference of two attention outputs: half the L1 distance of
    class probabilities (the probability mass moved), or the L1 distance of targets."""
    distance = (approx - exact).abs().sum(1)
    return float((0.5 * distance if loss == "log_loss" else distance).mean())


def prototype_counts(setting, n_keys):
    """The numbers of prototypes to try for ``n_keys`` keys (``prototypes=setting``)."""
    if setting is None or (setting == "auto" and n_keys < MIN_KEYS):
        return []
    counts = AUTO_PROTOTYPES if setting == "auto" else (int(setting),)
    return [m for m in counts if m < n_keys]


def choose_prototypes(setting, keys, queries, values, log_prior, metric, temperature, loss,
                      generator):
    """``(centres, error, summary)``, or ``(None, None, None)`` for exact attention over every
    key; ``summary``: :func:`summarize` of the keys at ``centres``.

    ``setting``: the estimator's ``prototypes`` (``"auto"``, a number or ``None``); ``keys``,
    ``values``, ``log_prior``: the training points' keys (tensors, one device); ``queries``:
    held-out queries, already mapped. ``"auto"`` tries :data:`AUTO_PROTOTYPES` fewest first and
    keeps the first within :data:`TOLERANCE` of exact attention on the held-out queries (none
    for fewer than :data:`MIN_KEYS` keys, or when none is within it); a number is used as given
    (if fewer than the keys), its error measured all the same.
    """
    counts = prototype_counts(setting, keys.shape[0])
    if not counts:
        return None, None, None
    kwargs = {"metric": metric, "temperature": temperature, "device": keys.device,
              "dtype": keys.dtype}
    exact = attention(queries, keys, values, log_prior=log_prior, **kwargs)
    for m in counts:
        centres = prototype_centres(keys, m, generator)
        summary = summarize(keys, values, log_prior, centres)
        approx = attention(queries, summary[0], summary[1], log_prior=summary[2], **kwargs)
        error = output_error(approx, exact, loss)
        if setting != "auto" or error <= TOLERANCE:
            return centres, error, summary
    return None, None, None

