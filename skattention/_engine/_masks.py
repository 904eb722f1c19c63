"""Masks and priors of a score block (torch only): the radius, self-exclusion and key masks
(``-inf`` scores), a callable log-prior evaluated block by block, a per-key one, and the
scaling by the temperature.

A block is the scores of a block of queries (rows ``qs:qe``) against a block of keys (columns
``ks:ke``). Scores are *partial* (``||q||^2 - f``, see ``PreparedKeys``); masks set them to
``-inf``.
"""

import math

import torch

from ._exact import settle
from ._scores import NEG_INF


class Radius:
    """The radius prior: key j is kept for query i when f(q_i, k_j) <= f_of(r_ij), where r_ij
    is one number or ``max(query_radius[i], key_radius[j])`` and ``f_of`` the metric's value
    of ``f`` at a distance (its square for the Euclidean kinds, ``_kinds.f_of_distance``).

    Blocks hold partial scores ``s = offset(q) - f`` (see ``PreparedKeys``), so the fast test is
    ``s >= offset(q) - f_of(r_ij)`` (:meth:`threshold`). Only keys within the rounding margin of
    that threshold are settled on exact distances (``_exact.settle``), so a key at distance
    exactly ``r`` is always kept, as in scikit-learn. A ``lenient`` block keeps those keys
    unsettled (the k-NN selection settles its candidates itself, :meth:`inside`).
    """

    def __init__(self, f_of, radius=None, query_r=None, key_r=None):
        self.radius = radius
        if radius is not None:
            # f at the radius, the one value every test against it uses
            self.bound = self.max_r2 = f_of(radius)
        else:
            self.query_r2, self.key_r2 = f_of(query_r), f_of(key_r)
            self.query_r2_exact = f_of(query_r.double())
            self.key_r2_exact = f_of(key_r.double())
            self.max_r2 = float(torch.cat([self.query_r2_exact, self.key_r2_exact]).max())
        self._qoff = self._q_r2 = self._rows = None

    def start_block(self, prepared, q, q_raw, rows, budget, lenient=False):
        """Prepare the query rows ``rows`` (a slice or index tensor of the queries); ``q`` are
        their centred coordinates, ``q_raw`` the uncentred ones."""
        q = q.detach()
        self._keys, self._q_raw, self._rows, self._budget = prepared, q_raw, rows, budget
        self._lenient = lenient
        eps = torch.finfo(q.dtype).eps
        self._margin = (prepared.margin(q) + 4 * eps * self.max_r2)[:, None]
        self._qoff = prepared.query_offset(q)[:, None]
        if self.radius is not None:
            self._qoff = self._qoff - self.bound
        else:
            self._q_r2 = self.query_r2[rows, None]

    def threshold(self, ks, ke):
        if self.radius is not None:
            return self._qoff
        return self._qoff - torch.maximum(self._q_r2, self.key_r2[None, ks:ke])

    def exact_r2(self, rows, keys):
        """``f_of(r_ij)`` in float64 for block rows ``rows`` and key indices ``keys``."""
        if self.radius is not None:
            return self.bound
        q_r2 = self.query_r2_exact[self._rows][rows]
        return torch.maximum(q_r2, self.key_r2_exact[keys])

    def outside(self, s, ks, ke):
        """Boolean mask of the keys of a block of partial scores outside the radius."""
        excess = self.threshold(ks, ke) - s.detach()
        if self._lenient:
            return excess > self._margin

        def exact_excess(rows, cols):
            f = self._keys.exact_pairs(self._q_raw, rows, cols + ks, self._budget)
            return f - self.exact_r2(rows, cols + ks)

        return settle(excess, self._margin, exact_excess)

    def inside(self, f, index):
        """Exact membership of candidates: exact ``f`` (b, m) of keys ``index`` (b, m)."""
        rows = torch.arange(f.shape[0], device=f.device)[:, None].expand_as(index)
        return f <= self.exact_r2(rows, index.clamp(min=0))

    def pair_bytes(self, item):
        """Extra scratch bytes per score entry: the excess block and its masks, and for
        per-point radii a threshold block."""
        return item + 3 + (0 if self.radius is not None else item + 1)

    def __str__(self):
        return f"radius={self.radius}" if self.radius is not None else "the per-point radii"


def query_index(spec, rows, device):
    """Query indices of the rows ``rows`` (a slice or an index tensor), as a column, for a
    callable prior (else ``None``)."""
    if spec.prior_fn is None:
        return None
    if isinstance(rows, slice):
        return torch.arange(rows.start, rows.stop, device=device)[:, None]
    return rows[:, None]


def mask_self(s, self_index, rows, ks, ke, inplace, fill=NEG_INF):
    """Set s[i, j] = ``fill`` (-inf: a logit, inf: a distance) where key ks + j is the excluded
    index of query ``rows[i]``."""
    local = self_index[rows] - ks
    rows = ((local >= 0) & (local < ke - ks)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return s
    cols = local[rows]
    fill = torch.full((rows.numel(),), fill, dtype=s.dtype, device=s.device)
    return s.index_put_((rows, cols), fill) if inplace else s.index_put((rows, cols), fill)


def _masked(s, mask, inplace):
    return s.masked_fill_(mask, NEG_INF) if inplace else s.masked_fill(mask, NEG_INF)


def raw_scores(spec, q, rows, ks, ke, q_index, inplace, augmented=None, scratch_key=None):
    """Partial scores of a block (query rows ``rows``, a slice or an index tensor) with every
    mask applied (-inf), and the callable prior's bias (``augmented`` and ``scratch_key``:
    ``PreparedKeys.block``'s)."""
    s = spec.keys.block(q, ks, ke, augmented=augmented, scratch_key=scratch_key)
    if spec.radius is not None:
        s = _masked(s, spec.radius.outside(s, ks, ke), inplace)
    if spec.self_index is not None:
        s = mask_self(s, spec.self_index, rows, ks, ke, inplace)
    if spec.key_mask is not None:
        s = _masked(s, spec.key_mask[None, ks:ke], inplace)
    bias = None
    if spec.prior_fn is not None:
        k_index = torch.arange(ks, ke, device=s.device)[None, :]
        bias = call_prior_fn(spec.prior_fn, q_index, k_index, s)
        s = _masked(s, torch.isneginf(bias), inplace)
    return s, bias


def call_prior_fn(prior_fn, q_index, k_index, like):
    try:
        bias = prior_fn(q_index, k_index)
    except Exception as exc:
        raise ValueError(f"log_prior callable failed: {exc}") from exc
    bias = torch.as_tensor(bias, dtype=like.dtype, device=like.device)
    try:
        bias = torch.broadcast_to(bias, like.shape)
    except RuntimeError:
        raise ValueError(
            f"log_prior callable returned shape {tuple(bias.shape)}, not broadcastable to "
            f"{tuple(like.shape)}."
        ) from None
    if bool(torch.isnan(bias).any()) or bool((bias == math.inf).any()):
        raise ValueError("log_prior callable returned NaN or +inf; use -inf to mask.")
    return bias


def block_prior(prior_vec, bias, ks, ke, s):
    """Log-prior of a block as a tensor broadcastable to ``s`` (0 when there is none)."""
    prior = None if prior_vec is None else prior_vec[None, ks:ke]
    if bias is not None:
        prior = bias if prior is None else prior + bias
    if prior is None:
        prior = s.new_zeros((1, 1))
    return prior


def scaled(s, T):
    """s / T. With a learned temperature, masked (-inf) scores are kept out of the product:
    d(s/T)/dT is infinite there and 0 * inf would poison the gradient with NaN."""
    if not isinstance(T, torch.Tensor):
        return s * (1.0 / T)
    masked = torch.isneginf(s)
    return torch.where(masked, 0.0, s).div(T).masked_fill(masked, NEG_INF)
