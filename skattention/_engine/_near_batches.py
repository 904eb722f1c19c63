"""The near groups' partial softmaxes of near-far attention, many groups per kernel (torch only).

``_near_far.near_far_attention`` scores each query against the keys of its nearest groups and
keeps one partial softmax per (query, near group) pair. Group by group, that is a loop of a
dozen small kernels per group (a few hundred queries against a few dozen keys each), and the
engine's two workers running such loops at once waited for each other's hold on Python's
interpreter at every kernel (about as slow on two workers as on one: docs/performance.md).
:func:`batched_near_partials` computes the same partial softmaxes for many groups at once:
groups whose keys fill the same number of whole spans go together, their queries' rows and
their keys gathered into batches of equal shape (padding rows and masked keys), each batch
a few batched products and passes over a cache-sized block.

A pair's result depends on its query and its group alone, as in the loop: its group's keys
are padded to a multiple of :data:`_SPAN` keys (its own count, whatever the batch), query
rows to the products' row multiple, and the padding keys get weight 0."""

import math

import torch

from ._budget import CPU_BLOCK_ENTRIES, ROW_MULTIPLE
from ._distance_logits import distance_logits
from ._softmax import partial_weights

# A group's keys in a batch: padded to a multiple of this many (the exponential's vector, so
# that no row has a scalar tail: ``_softmax.batch_exp``; a multiple of the products' column
# multiple, ``_budget.KEY_SPAN_MULTIPLE``).
_SPAN = 16
# A batched product of fewer than 400 multiply-adds per member is torch's plain loop; with at
# least this many terms, :data:`_SPAN` keys and ROW_MULTIPLE rows, never
_MIN_TERMS = 8


def batched_near_partials(q, near, grouped, scale, budget, values_mm, m, blocks):
    """Write ``_near_far._near_partials``' ``m`` and ``blocks`` (flat: one row per pair of
    ``near``) of the pairs whose group a batch member holds, for the ``"euclidean"`` kind's
    prepared keys outside autograd; return which groups that is (a boolean per group), or
    ``None`` for other keys. A group whose keys with :data:`_budget.ROW_MULTIPLE` rows do not
    fit ``budget`` is left to the caller's loop (which scores it in chunks of its keys)."""
    keys = grouped.prepared()[0]
    if keys.kind != "euclidean" or keys.wide_t is None or not keys.offsets_row:
        return None
    entries = budget // (3 * q.element_size())
    if q.device.type == "cpu":
        entries = min(entries, CPU_BLOCK_ENTRIES)
    sizes = grouped.bounds[1:] - grouped.bounds[:-1]
    widths = -(-sizes // _SPAN) * _SPAN
    terms = max(q.shape[1] + 1, _MIN_TERMS)
    costs = _Costs(terms, values_mm.shape[1], entries)
    n_pairs, n_near = near.numel(), near.shape[1]
    group_of = near.reshape(-1)
    counts = torch.bincount(group_of, minlength=grouped.n_groups)
    batched = costs.most_rows(widths) >= ROW_MULTIPLE
    # by padded width, then by queries: a batch's groups pad their rows to similar counts
    order = torch.argsort(widths * (n_pairs + 1) + counts)
    order = order[(counts.index_select(0, order) > 0) & batched.index_select(0, order)]
    if not order.numel():
        return batched
    z = keys.prepare_queries(q)
    # [coef q, 1] and zero terms up to _MIN_TERMS: torch's batched product takes a plain
    # loop, which rounds otherwise, for batches of few rows, terms and keys
    q_aug = torch.cat([z * keys.coef, z.new_ones((z.shape[0], 1)),
                       z.new_zeros((z.shape[0], terms - z.shape[1] - 1))], 1)
    offset = (z * z).sum(1)
    pair_order = torch.argsort(group_of, stable=True)
    starts = counts.cumsum(0) - counts
    for groups, n_rows, first_row, width in _batches(order, widths, counts, costs):
        pairs, valid = _pairs(groups, starts, counts, pair_order, n_rows, first_row)
        queries = (pairs // n_near).reshape(-1)
        part_m, part = _partial_softmaxes(
            keys, grouped, q_aug.index_select(0, queries).view(groups.numel(), n_rows, -1),
            offset.index_select(0, queries),
            groups, sizes, width, scale, values_mm)
        chosen = pairs[valid]
        m.index_copy_(0, chosen, part_m[valid])
        blocks.index_copy_(0, chosen, part[valid])
    return batched


class _Costs:
    """The numbers a batch member holds: per row its scores, its gathered query row, its
    weighted values and its indices; per member its keys (gathered, then laid out with the
    zero terms) and their values and columns. A batch stays within ``entries``."""

    def __init__(self, terms, n_values, entries):
        self.terms, self.n_values, self.entries = terms, n_values, entries

    def per_row(self, width):
        return width + self.terms + self.n_values + 6

    def per_member(self, width):
        return width * (2 * self.terms + self.n_values + 4)

    def most_rows(self, width):
        """The most rows (a multiple of ROW_MULTIPLE) a member of ``width`` keys can hold."""
        rows = (self.entries - self.per_member(width)) // self.per_row(width)
        return rows // ROW_MULTIPLE * ROW_MULTIPLE


def _batches(order, widths, counts, costs):
    """``(groups, rows, first_row, width)`` per batch: groups of one padded ``width`` (in
    ``order``), each with ``rows`` rows of its queries from its ``first_row`` (a group of more
    queries than a member holds is cut into row ranges, each its own member), ``rows`` a
    multiple of the row multiple and the batch within ``costs.entries``."""
    order_list, width_list = order.tolist(), widths.index_select(0, order).tolist()
    count_list = counts.index_select(0, order).tolist()
    members = []  # (group, first row, rows) of the current width
    for i, (g, width, count) in enumerate(zip(order_list, width_list, count_list,
                                              strict=True)):
        most = costs.most_rows(width)
        members.extend((g, r, min(most, count - r)) for r in range(0, count, most))
        if i + 1 < len(order_list) and width_list[i + 1] == width:
            continue
        per_row, per_member = costs.per_row(width), costs.per_member(width)
        while members:  # the members of this width (by their queries) into batches
            n_rows, taken = 0, 0
            for _, _, rows in members:  # (one member always fits: ``most``)
                padded = -(-max(n_rows, rows) // ROW_MULTIPLE) * ROW_MULTIPLE
                if (taken + 1) * (padded * per_row + per_member) > costs.entries:
                    break
                n_rows, taken = padded, taken + 1
            batch, members = members[:taken], members[taken:]
            yield (torch.tensor([b[0] for b in batch], device=order.device), n_rows,
                   torch.tensor([b[1] for b in batch], device=order.device), width)


def _pairs(groups, starts, counts, pair_order, n_rows, first_row):
    """``(pairs, valid)`` of a batch: the (query, near group) pair of each member's row (its
    position in the flattened ``near``; a padding row repeats a valid one) and which rows
    are real."""
    rows = first_row[:, None] + torch.arange(n_rows, device=groups.device)[None, :]
    valid = rows < counts.index_select(0, groups)[:, None]
    at = (starts.index_select(0, groups)[:, None] + rows).clamp_(max=pair_order.numel() - 1)
    return pair_order.index_select(0, at.reshape(-1)).view(at.shape), valid


def _partial_softmaxes(keys, grouped, q_rows, offset, groups, sizes, width, scale, values_mm):
    """``(m, part)`` of a batch: ``_softmax.partial_softmax`` of each member's query rows
    ``q_rows`` (augmented, ``[coef q, 1]``; ``offset`` their squared norms, member by member)
    over its group's keys, the ``width`` columns from the group's first key (the next groups'
    keys and the padding beyond its own count masked)."""
    n, device = groups.numel(), groups.device
    columns = grouped.bounds.index_select(0, groups)[:, None] + torch.arange(width, device=device)
    # the keys (and their offsets' row) of each member, contiguous as the loop's products
    # take them (a transposed operand rounds a row otherwise among other rows)
    gathered = keys.wide_t.index_select(
        1, columns.clamp(max=keys.wide_t.shape[1] - 1).reshape(-1)).view(-1, n, width)
    span = gathered.new_zeros((n, q_rows.shape[2], width))
    span[:, :gathered.shape[0]] = gathered.transpose(0, 1)
    del gathered
    z = torch.bmm(q_rows, span)
    rows = z.view(-1, width)  # the members' rows as one block of rows
    distance_logits(rows, offset, scale, d_out=rows, z_out=rows)
    own = torch.arange(width, device=device)[None, :] < sizes.index_select(0, groups)[:, None]
    inside = columns.clamp(max=grouped.log_prior.shape[0] - 1)
    prior = grouped.log_prior.index_select(0, inside.reshape(-1)).view(n, width)
    z.add_(prior.masked_fill_(~own, -math.inf)[:, None, :])
    m, p = partial_weights(rows)
    values = values_mm.index_select(0, inside.reshape(-1)).view(n, width, -1)
    if p.dtype != values.dtype:
        p = p.to(values.dtype)
    return m.view(n, -1), torch.bmm(p.view(z.shape), values)
