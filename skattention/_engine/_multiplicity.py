"""Key weights as multiplicities in a k-NN selection (torch only): a key's weight
``exp(log_prior)`` counts as that many copies of it, so the k nearest "units" may need more
keys (:func:`lightest_weights`, :func:`keys_to_select`, also over shards of the keys), and
each selected key carries its share of the ``k`` units (:func:`multiplicity`); a query's own
key can lose one unit instead of the whole key (:func:`leave_one_unit_out`). At
``temperature=inf`` integer weights are counted exactly (:func:`counted`)."""

import math

import torch

from ._scores import NEG_INF

# A weight exp(log w) within this many units in the last place of the log-prior's dtype of an
# integer is that integer (the error of exp(log w) grows with |log w|: a few units up to w of
# 2**16 in float32).
_COUNT_ULPS = 16
# The weights the uniform limit counts without a shift: from 2**-16 to 2**16 (their sums
# neither underflow nor overflow in float32; integers up to there are recovered exactly).
COUNTED_MAX_LOG = 16 * math.log(2)
COUNTED_DTYPES = (torch.float32, torch.float64)  # (half precision's units are too coarse)


def counted(weight, log_dtype):
    """Weights ``exp(log w)`` as the integers they stand for, where they are within
    :data:`_COUNT_ULPS` units of ``log_dtype`` (float32 or float64; others as they are) of
    one: ``exp(log 3)`` is 3.0000000000000004 in float64, and at an exact tie of uniform votes
    (``temperature=inf``) that last bit decided the class that repeating the point 3 times
    leaves tied (the first class wins). Other weights are returned as they are."""
    if log_dtype not in COUNTED_DTYPES:
        return weight
    nearest = torch.round(weight)
    close = (weight - nearest).abs() <= (_COUNT_ULPS * torch.finfo(log_dtype).eps) * weight
    return torch.where(close & (nearest > 0), nearest, weight)


def counts_prior(spec):
    """Whether the uniform limit (``temperature=inf``) of ``spec`` weighs its keys by
    :func:`counted` ``exp(log_prior)`` with no shift (exact integer sums: the weighted votes of
    integer weights equal the repeated points' votes): a float32 or float64 per-key prior whose
    weights (but masked keys) are within ``exp(+-COUNTED_MAX_LOG)``, with no callable prior
    but the own key's unit left out (a factor of at most 1)."""
    prior = spec.prior_vec
    if (prior is None or prior.requires_grad or prior.dtype not in COUNTED_DTYPES
            or (spec.prior_fn is not None and spec.unit_out is None)):
        return False
    return _in_counted_range(prior[torch.isfinite(prior)])


def counts_every_key(log_prior, dtype):
    """Whether the uniform limit (``temperature=inf``) counts every key's weight
    ``exp(log_prior)`` (a NumPy array of the keys' log-priors) as an integer in ``dtype``
    (the attention's): each one within ``exp(+-COUNTED_MAX_LOG)`` and :func:`counted` to an
    integer. Its weighted votes are then exact integer sums, each class's count over their
    total in one division (as scikit-learn's over the repeated points)."""
    finite = torch.as_tensor(log_prior, dtype=torch.float64)
    finite = finite[torch.isfinite(finite)]
    if dtype not in COUNTED_DTYPES or not _in_counted_range(finite):
        return False
    weight = counted(torch.exp(finite.to(dtype)), dtype)
    return bool((weight == torch.round(weight)).all())


def _in_counted_range(finite):
    """Whether the finite log-priors ``finite`` (one at least) are all within
    ``+-COUNTED_MAX_LOG``: weights the uniform limit sums unshifted."""
    return bool(finite.numel() and finite.abs().amax() <= COUNTED_MAX_LOG)


def lightest_weights(log_prior, k):
    """The lightest positive key weights ``exp(log_prior)``, ascending, as many as it takes
    to add up to ``k`` (all when they never do): all :func:`keys_to_select` needs, also from
    several shards of the keys at once."""
    weight = torch.exp(log_prior.detach().double())
    low, high = weight.aminmax()
    if low == high:  # equal weights (no sample weights): a prefix, without sorting them all
        # (k / low capped at the keys' count: it overflows to inf for weights of about 1e-308)
        count = 0 if low <= 0 else min(weight.numel(),
                                       math.ceil(min(k / float(low), weight.numel())) + 2)
        return weight[:count]
    lightest = torch.sort(weight[weight > 0]).values
    reach = int(torch.searchsorted(torch.cumsum(lightest, 0), float(k)))
    return lightest[: reach + 1]


def keys_to_select(lightest, k):
    """How many keys the k units need when the lightest weights are ``lightest`` (ascending,
    float64: a :func:`lightest_weights`, or several of them merged in order)."""
    reach = torch.searchsorted(torch.cumsum(lightest, 0), float(k))
    return max(1, min(int(reach) + 1, lightest.numel()))


def selection_count(spec, k):
    """How many nearest keys hold the k-NN prior's ``k`` units of weight, whatever the query:
    ``k`` without a per-key prior; with one, enough keys that even the lightest ones add up to
    ``k`` (a key's weight ``exp(log_prior)`` is its multiplicity: :func:`multiplicity`)."""
    if spec.prior_vec is None or spec.n_neighbors is None:
        return k
    # a query's own key one unit lighter: its k units may need the keys of k + 1
    units = k + (spec.unit_out is not None)
    return keys_to_select(lightest_weights(spec.prior_vec, units), units)


def multiplicity(log_weight, valid, k):
    """Log of each selected key's share of the ``k`` units: keys in (distance, index) order
    count ``exp(log_prior)`` each (an integer weight is that many copies of the key) until ``k``
    is reached, the last one contributing the remainder; ``-inf`` beyond. A remainder below the
    sums' rounding (a key past the k units by rounding alone) is dropped; a key counted whole
    is kept however light (weights of 1e-6 are ordinary normalised sample weights)."""
    weight = torch.exp(log_weight)
    if not weight.requires_grad:  # (a learned prior keeps its gradient)
        weight = counted(weight, log_weight.dtype)
    weight = torch.where(valid, weight, 0.0)
    # the weight before each key, summed without the key's own (a sum less a heavy key's
    # weight loses the light keys' units beside it)
    before = torch.nn.functional.pad(torch.cumsum(weight, 1)[:, :-1], (1, 0))
    share = torch.minimum(weight, (k - before).clamp(min=0))
    rounding = 4 * k * torch.finfo(share.dtype).eps
    kept = valid & (share > 0) & ((share >= weight) | (share > rounding))
    # (a share of 0 kept out of the log: 0 times its infinite gradient is NaN)
    return torch.where(kept, torch.log(torch.where(kept, share, 1.0)), NEG_INF)


def leave_one_unit_out(spec):
    """``exclude_self`` leaving one unit of the own key's weight ``w = exp(log_prior)`` out
    (``max(w - 1, 0)`` stays) instead of the whole key: the leave-one-out of a point repeated
    ``w`` times, whose other copies stay. Own keys that keep nothing stay masked
    (``spec.self_index``); the others keep ``w - 1``: a log-bias ``log((w - 1) / w)`` on them
    (``spec.prior_fn``) for dense attention and, in a k-NN selection, one unit less of their
    multiplicity (``spec.unit_out``, :func:`without_own_unit`; the bias would come after the
    units are counted). A callable prior has no multiplicities: the whole key, as before."""
    own = spec.self_index
    if own is None or spec.prior_vec is None:
        return
    own_prior = spec.prior_vec[own.clamp(min=0)]
    keeps = (own >= 0) & (own_prior.detach().double() > 0)  # weights above 1
    if not bool(keeps.any()):
        return
    spec.self_index = torch.where(keeps, -1, own)
    unit_out = spec.unit_out = torch.where(keeps, own, -1)
    # log((w - 1) / w) of the live prior (differentiated through it), at 1 where none is kept
    # (its gradient there would be 0 times infinity)
    bias = torch.where(keeps, torch.log1p(-torch.exp(-torch.where(keeps, own_prior, 1.0))), 0.0)

    def own_key_bias(query_index, key_index):
        return torch.where(key_index == unit_out[query_index], bias[query_index], 0.0)

    spec.prior_fn = own_key_bias


def without_own_unit(log_weight, idx, own):
    """The selected keys' log-weights ``log_weight`` (keys ``idx``) with one unit less on each
    query's own key ``own`` (a column; ``-1``: none): :func:`leave_one_unit_out` in a k-NN
    selection, before :func:`multiplicity` counts the units."""
    is_own = (idx == own) & (own >= 0)
    # (the others' weights kept out of the expression: 0 times an infinite gradient is NaN)
    kept = torch.log(torch.expm1(torch.where(is_own, log_weight, 1.0)))
    return torch.where(is_own, kept, log_weight)
