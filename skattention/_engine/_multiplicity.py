"""Key weights as multiplicities in a k-NN selection (torch only): a key's weight
``exp(log_prior)`` counts as that many copies of it, so the k nearest "units" may need more
keys (:func:`lightest_weights`, :func:`keys_to_select`, also over shards of the keys), and
each selected key carries its share of the ``k`` units (:func:`multiplicity`)."""

import math

import torch

from ._scores import NEG_INF


def lightest_weights(log_prior, k):
    """The lightest positive key weights ``exp(log_prior)``, ascending, as many as it takes
    to add up to ``k`` (all when they never do): all :func:`keys_to_select` needs, also from
    several shards of the keys at once."""
    weight = torch.exp(log_prior.detach().double())
    low, high = weight.aminmax()
    if low == high:  # equal weights (no sample weights): a prefix, without sorting them all
        count = 0 if low <= 0 else min(weight.numel(), math.ceil(k / float(low)) + 2)
        return weight[:count]
    lightest = torch.sort(weight[weight > 0]).values
    reach = int(torch.searchsorted(torch.cumsum(lightest, 0), float(k)))
    return lightest[: reach + 1]


def keys_to_select(lightest, k):
    """How many keys the k units need when the lightest weights are ``lightest`` (ascending,
    float64: a :func:`lightest_weights`, or several of them merged in order)."""
    reach = torch.searchsorted(torch.cumsum(lightest, 0), float(k))
    return max(1, min(int(reach) + 1, lightest.numel()))


def multiplicity(log_weight, valid, k):
    """Log of each selected key's share of the ``k`` units: keys in (distance, index) order
    count ``exp(log_prior)`` each (an integer weight is that many copies of the key) until ``k``
    is reached, the last one contributing the remainder; ``-inf`` beyond. A remainder below the
    sums' rounding (a key past the k units by rounding alone) is dropped; a key counted whole
    is kept however light (weights of 1e-6 are ordinary normalised sample weights)."""
    weight = torch.where(valid, torch.exp(log_weight), 0.0)
    before = torch.cumsum(weight, 1) - weight
    share = torch.minimum(weight, (k - before).clamp(min=0))
    rounding = 4 * k * torch.finfo(share.dtype).eps
    kept = valid & (share > 0) & ((share >= weight) | (share > rounding))
    return torch.where(kept, torch.log(share), NEG_INF)
