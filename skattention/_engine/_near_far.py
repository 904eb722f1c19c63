"""Attention over keys grouped around prototypes: exact over each query's nearest groups, the
other groups through their prototypes (torch only).

A learned metric's attention is broad, so no key can be pruned exactly, and a pass over 10^5-10^6
keys per query is the cost of a prediction. The keys are grouped by their nearest centre; a
group's prototype is the prior-weighted mean of its keys, carries their prior-weighted mean
values and the log of their summed prior weight (it stands for as many keys as it holds). A
query attends exactly to every key of its ``n_near`` nearest groups and to the other groups
through their prototypes, in one softmax: the near groups carry most of the weight of a sharp
attention and are exact; the far ones carry little of it, or (broad attention) weights that
vary slowly across a group, where a prototype stands for its keys closely. Exactly attention
over every key when every group is near, and the prototypes alone when none is. How close it is
to exact attention is measured by the caller (``neighbors/_summary.py``).
"""

import math

import torch

from ._attention import kneighbors
from ._budget import CPU_BLOCK_ENTRIES, KEY_CHUNK_ROWS, ROW_MULTIPLE, budget_bytes
from ._distance_logits import distance_logits
from ._near_batches import batched_near_partials
from ._parallel import map_blocks, small_work_single_threaded
from ._scores import PreparedKeys, padded_rows
from ._softmax import (
    LOG2E,
    OnlineSoftmax,
    flushed_exp,
    merged_partials,
    partial_softmax,
    product_values,
)
from ._topk import top_indices

# fewer queries than this take one block in the calling thread (the workers' start costs more)
_MIN_WORKER_ROWS = 256
# ... and so does a call whose pass over each group does fewer multiply-adds than this (its
# queries that have the group near, times its keys and their dimension): the pass is a loop
# of small kernels per group, and two such loops at once wait for each other's Python
# (docs/performance.md, "The prototypes' check on one thread")
_MIN_WORKER_GROUP_WORK = 1 << 21


class GroupedKeys:
    """Keys, values and log-priors sorted by group (``bounds[g]:bounds[g + 1]`` are group
    ``g``'s), and the groups' prototypes (``prototypes``, ``prototype_values``,
    ``prototype_log_prior``), as tensors on one device; ``kind`` is the engine metric, and a
    query attends exactly to the keys of its ``n_near`` nearest groups. Made by
    :func:`group_keys`; :meth:`to` copies them to another device and dtype."""

    def __init__(self, points, values, log_prior, bounds, prototypes, prototype_values,
                 prototype_log_prior, kind, n_near):
        self.points, self.values, self.log_prior = points, values, log_prior
        self.bounds = bounds
        self.prototypes = prototypes
        self.prototype_values = prototype_values
        self.prototype_log_prior = prototype_log_prior
        self.kind, self.n_near = kind, n_near
        self._prepared = self._products = None

    def __getstate__(self):
        return {**self.__dict__, "_prepared": None, "_products": None}

    @property
    def n_groups(self):
        return self.prototypes.shape[0]

    def to(self, device, dtype):
        """A copy on ``device`` with the points, values and log-priors in ``dtype``."""
        def move(a):
            return a.to(device=device, dtype=dtype)
        return GroupedKeys(move(self.points), move(self.values), move(self.log_prior),
                           self.bounds.to(device), move(self.prototypes),
                           move(self.prototype_values), move(self.prototype_log_prior),
                           self.kind, self.n_near)

    def scores_per_query(self):
        """The scores a query's attention computes at most: every prototype's and the keys of
        the ``n_near`` largest groups."""
        sizes = (self.bounds[1:] - self.bounds[:-1]).sort(descending=True).values
        return self.n_groups + int(sizes[:min(self.n_near, self.n_groups)].sum())

    def prepared(self):
        """``(keys, prototypes)`` as :class:`PreparedKeys`, made once."""
        if self._prepared is None:
            self._prepared = (PreparedKeys(self.points, self.kind),
                              PreparedKeys(self.prototypes, self.kind))
        return self._prepared

    def products(self):
        """The keys' and the prototypes' values as :class:`OnlineSoftmax` multiplies them
        (:func:`product_values`), made once."""
        if getattr(self, "_products", None) is None:  # (pickles made before it existed)
            self._products = (product_values(self.values),
                              product_values(self.prototype_values))
        return self._products


@torch.no_grad()
def group_keys(points, values, log_prior, centres, kind, n_near, row_groups=None):
    """:class:`GroupedKeys` of the keys ``points`` (tensors, one device and dtype), each in the
    group of its nearest row of ``centres`` (squared Euclidean distance in the metric space;
    ties to the lower centre). A group's prototype is the prior-weighted mean of its keys (one
    step of Lloyd's algorithm from ``centres``) with their prior-weighted mean values and the
    log of their summed prior weight; groups without a key, or whose keys all have a zero
    prior, are dropped (with their keys: they carry no weight). ``row_groups``: the distinct
    input row of each key (equal rows, equal keys): the keys of a distinct row are kept as one
    key with their summed prior weight and weighted mean values (:func:`distinct_keys`), the
    same attention over fewer keys."""
    if row_groups is not None:
        points, values, log_prior = distinct_keys(points, values, log_prior, row_groups)
    labels = kneighbors(points, centres, 1, metric="sqeuclidean", device=points.device,
                        dtype=points.dtype)[1][:, 0].to(points.device)
    mass, log_mass, (centre_points, centre_values) = pooled(labels, centres.shape[0],
                                                            log_prior, points, values)
    keep = mass > 0
    new_label = torch.cumsum(keep, 0) - 1
    in_kept = keep[labels]
    labels = new_label[labels[in_kept]]
    order = torch.argsort(labels, stable=True)
    rows = torch.nonzero(in_kept)[:, 0][order]
    bounds = torch.zeros(int(keep.sum()) + 1, dtype=torch.long, device=points.device)
    bounds[1:] = torch.cumsum(torch.bincount(labels, minlength=bounds.shape[0] - 1), 0)
    return GroupedKeys(
        points[rows], values[rows], log_prior[rows], bounds,
        centre_points[keep].to(points.dtype), centre_values[keep].to(values.dtype),
        log_mass[keep].to(log_prior.dtype), kind, n_near)


def pooled(labels, n_labels, log_prior, *columns):
    """``(mass, log_mass, means)`` of rows pooled by ``labels`` (in ``range(n_labels)``): each
    label's summed prior weight (relative to the largest prior), the log of its summed prior
    weight, and for each of ``columns`` its rows' prior-weighted mean (float64 sums; 0 for a
    label without weight)."""
    wide = torch.float64
    top = log_prior.max().to(wide)
    weight = torch.exp(log_prior.to(wide) - top)
    mass = weight.new_zeros(n_labels).index_add_(0, labels, weight)
    divisor = torch.where(mass > 0, mass, 1.0)[:, None]
    sums = [weight.new_zeros((n_labels, c.shape[1])) for c in columns]
    # in row chunks (no float64 copy of every key): index_add_ adds a label's rows in their
    # order either way
    for start in range(0, labels.shape[0], KEY_CHUNK_ROWS):
        rows = slice(start, start + KEY_CHUNK_ROWS)
        for total, c in zip(sums, columns, strict=True):
            total.index_add_(0, labels[rows], weight[rows, None] * c[rows].to(wide))
    return mass, torch.log(mass) + top, [total / divisor for total in sums]


def distinct_keys(points, values, log_prior, row_groups):
    """``(points, values, log_prior)`` with one key per ``row_groups`` value that has weight (its
    first key; :func:`distinct_rows`): attention over them is attention over every key where a
    group's keys are equal."""
    first, values, log_prior = distinct_rows(values, log_prior, row_groups.to(points.device))
    return points[first], values, log_prior


def distinct_rows(values, log_prior, row_groups):
    """``(first, values, log_prior)`` of the rows pooled by ``row_groups`` (group ids): the
    first row of each group with weight, the group's prior-weighted mean values and the log of
    its summed prior weight."""
    n = row_groups.shape[0]
    n_groups = int(row_groups.max()) + 1 if n else 0
    first = torch.full((n_groups,), n, device=row_groups.device).scatter_reduce_(
        0, row_groups, torch.arange(n, device=row_groups.device), "amin")
    mass, log_mass, (means,) = pooled(row_groups, n_groups, log_prior, values)
    keep = mass > 0
    return first[keep], means[keep].to(values.dtype), log_mass[keep].to(log_prior.dtype)


@torch.no_grad()
def near_far_attention(queries, grouped, temperature, working_memory=None):
    """Attention of ``queries`` (a tensor on ``grouped``'s device, in its dtype, already in the
    metric space) over the keys of ``grouped`` at ``temperature`` (finite, > 0): every key of
    each query's ``grouped.n_near`` nearest groups (by its score against the prototypes)
    exactly, the other groups through their prototypes. Returns the ``(n_queries, n_values)``
    outputs.

    Memory-bounded (``working_memory`` MiB, the configured budget for ``None``); blocks of
    queries go to the engine's workers on the CPU. A query's output does not depend on the
    other queries of its call (query rows padded to the products' row multiple, as in
    :func:`attention`) as long as its near groups' keys fit the budget in one chunk (a group
    near to many queries of a large call is scored in chunks of its keys, rounded otherwise;
    and with a working memory too small for a group's keys among a worker's batches, the
    group is scored apart, rounded otherwise),
    and except that a call of at most 4 rows (a web service's single row) scores each query's
    near keys at once: the same softmax, rounded otherwise (``_few_queries``)."""
    n_q, n_groups = queries.shape[0], grouped.n_groups
    n_values = grouped.values.shape[1]
    if n_q == 0:
        return queries.new_zeros((0, n_values))
    grouped.prepared()  # made once here, not by each worker
    values_mm, prototypes_mm = grouped.products()
    scale = 1.0 / float(temperature)
    item = queries.element_size()
    workers = near_far_workers(queries, grouped)
    share = budget_bytes(working_memory) // workers
    # one block per worker (each loops over the groups once: the loop, not the products, is
    # the cost of small blocks), the prototypes' scores in chunks of the budget (cache-sized
    # on the CPU)
    rows = -(-n_q // workers)
    far_entries = share // (3 * item)
    if queries.device.type == "cpu":
        # larger blocks only hold more memory: every row is its own softmax state
        far_entries = min(far_entries, CPU_BLOCK_ENTRIES)
    far_rows = max(ROW_MULTIPLE, far_entries // max(n_groups, 1) // ROW_MULTIPLE * ROW_MULTIPLE)

    def block(start):
        q = queries[start:min(n_q, start + rows)]
        state = OnlineSoftmax(q.shape[0], n_values, prototypes_mm, q)
        nears = []
        for i in range(0, q.shape[0], far_rows):
            near, far = _far_logits(q[i:i + far_rows], grouped, scale)
            state.update_rows(slice(i, i + near.shape[0]),
                              far.add_(grouped.prototype_log_prior), prototypes_mm)
            nears.append(near)
        near = torch.cat(nears)
        if n_q <= ROW_MULTIPLE:
            _few_queries(q, near, state, grouped, scale, values_mm)
            return state.result()[:, :n_values]
        # the partials of a chunk of rows (each near group's largest logit and weighted
        # values, and their weighted copy in the merge) within a third of the share
        per_row = 3 * max(near.shape[1], 1) * (values_mm.shape[1] + 1) * values_mm.element_size()
        near_rows = max(ROW_MULTIPLE, share // 3 // per_row // ROW_MULTIPLE * ROW_MULTIPLE)
        for i in range(0, q.shape[0], near_rows):
            chunk = slice(i, min(q.shape[0], i + near_rows))
            state.add_partials(*_near_partials(q[chunk], near[chunk], grouped, scale, share,
                                               values_mm), rows=chunk)
        return state.result()[:, :n_values]

    return torch.cat(list(map_blocks(block, range(0, n_q, rows), workers)))


def near_far_workers(queries, grouped):
    """The engine's workers for the near and far scores of ``queries`` over ``grouped``: the
    caller's thread count on the CPU where the call is large enough (:data:`_MIN_WORKER_ROWS`,
    :data:`_MIN_WORKER_GROUP_WORK`), else 1 (one block in the calling thread)."""
    n_q, n_groups = queries.shape[0], max(grouped.n_groups, 1)
    n_keys, dim = grouped.points.shape
    group_work = n_q * min(grouped.n_near, n_groups) / n_groups * n_keys / n_groups * dim
    if (queries.device.type != "cpu" or n_q < _MIN_WORKER_ROWS
            or group_work < _MIN_WORKER_GROUP_WORK):
        return 1
    return max(1, torch.get_num_threads())


def grouped_rows_single_threaded(grouped, n_rows):
    """``small_work_single_threaded`` for the attention of ``n_rows`` queries over ``grouped``
    (a few rows' scores are too short for a parallel region to pay, and on a busy machine each
    region waits for a descheduled thread): a caller that maps the rows before their attention
    enters it once around both."""
    n_keys, dim = grouped.points.shape
    n_groups = max(grouped.n_groups, 1)
    scored = grouped.n_groups + min(grouped.n_near, grouped.n_groups) * n_keys / n_groups
    return small_work_single_threaded(n_rows * scored * (dim + grouped.values.shape[1]),
                                      grouped.points.device)


def _few_queries(q, near, state, grouped, scale, values_mm):
    """Add a few queries' (a web service's single row) near groups to their online softmax
    ``state``: each query's near groups' keys scored at once, not group by group (the loop's
    kernels are most of a single row's time), from the prepared keys themselves (their groups
    are contiguous spans; a copy of the gathered keys prepared again would cost more than the
    products). The same softmax, rounded otherwise than in a larger batch."""
    keys = grouped.prepared()[0]
    z = keys.prepare_queries(q)
    for i in range(q.shape[0] if near.shape[1] else 0):
        spans = list(zip(grouped.bounds[near[i]].tolist(),
                         grouped.bounds[near[i] + 1].tolist(), strict=True))
        s = _span_logits(keys, padded_rows(z[i:i + 1]), spans, scale)
        s.add_(torch.cat([grouped.log_prior[k0:k1] for k0, k1 in spans])[None])
        state.update_rows(slice(i, i + 1), s,
                          torch.cat([values_mm[k0:k1] for k0, k1 in spans]))


def _span_logits(prepared, row, spans, scale):
    """:func:`_logits` of one prepared query (``row``, padded) against the keys of each span
    ``(start, stop)`` of ``prepared``, side by side: for the ``"euclidean"`` kind one product
    per span and the logits of them all at once."""
    if prepared.squared or not prepared.offsets_row:
        return torch.cat([_logits(prepared, row, k0, k1, scale)[:1] for k0, k1 in spans], 1)
    augmented = prepared.augmented(row)
    partial = torch.cat([prepared.block(row, k0, k1, augmented=augmented)[:1]
                         for k0, k1 in spans], 1)
    return distance_logits(partial, prepared.query_offset(row[:1]), scale, None,
                           d_out=partial, z_out=partial)[1]


def _logits(prepared, z, start, stop, scale):
    """``scale`` times the scores of the prepared query rows ``z`` against the keys
    ``start:stop`` of ``prepared``: for the squared kinds the partial scores less each query's
    offset (the partial scores of two sets of prepared keys, centred on their own means, differ
    by a per-query constant; the prototypes' and the keys' logits meet in one softmax)."""
    s = prepared.logits(z, start, stop, scale)
    if prepared.squared:
        s.sub_(prepared.query_offset(z)[:, None] * scale)
    return s


def _far_logits(q, grouped, scale):
    """``(near, far)`` of the query rows ``q``: the indices of each one's ``grouped.n_near``
    nearest groups, and ``scale`` times its scores against every prototype, with its near
    groups' ``-inf``."""
    prototypes = grouped.prepared()[1]
    far = _logits(prototypes, padded_rows(prototypes.prepare_queries(q)), 0, grouped.n_groups,
                  scale)[:q.shape[0]]
    near = top_indices(far, min(grouped.n_near, grouped.n_groups))
    return near, far.scatter_(1, near, -math.inf)


def _near_blocks(q, near, grouped, scale, budget, skip=None):
    """``(rows, pairs, k0, k1, scores, first)`` for every group with queries among ``q`` that
    have it near, in chunks of its keys ``k0:k1`` within ``budget`` bytes: ``scores`` is
    ``scale`` times the scores of those queries (the rows ``rows`` of ``q``, padded to the row
    multiple) against the keys, without their log-priors; ``pairs`` the positions of those
    (query, near group) pairs in ``near.reshape(-1)``; ``first`` whether the chunk is its
    group's first. ``skip``: groups to leave out (a boolean per group), or ``None``."""
    keys = grouped.prepared()[0]
    q_keys = keys.prepare_queries(q)
    group_of = near.reshape(-1)
    counts = torch.bincount(group_of, minlength=grouped.n_groups).tolist()
    pair_order = torch.argsort(group_of, stable=True)
    query_of = pair_order // near.shape[1]
    bounds = grouped.bounds.tolist()
    at = 0
    skipped = [False] * len(counts) if skip is None else skip.tolist()
    for g, count in enumerate(counts):
        rows, pairs = query_of[at:at + count], pair_order[at:at + count]
        at += count
        if not count or skipped[g]:
            continue
        z = padded_rows(q_keys.index_select(0, rows))  # (a gather of rows: faster than [rows])
        width = max(1, budget // (3 * q.element_size() * z.shape[0]))
        for k0 in range(bounds[g], bounds[g + 1], width):
            k1 = min(bounds[g + 1], k0 + width)
            yield rows, pairs, k0, k1, _logits(keys, z, k0, k1, scale), k0 == bounds[g]


def _near_partials(q, near, grouped, scale, budget, values_mm):
    """The partial softmaxes of the queries ``q`` over each of their near groups (``near``):
    ``(m, blocks)`` of shapes (queries x near groups) and (queries x near groups x values'
    columns) for :meth:`OnlineSoftmax.add_partials`, with no update of the queries' running
    state per group (the state's gathers and scatters were most of a call's time): for the
    ``"euclidean"`` kind by batches of groups (``_near_batches``), else (and where a group's
    keys exceed the budget) group by group, a few kernels for all the queries that have it
    near, a group scored in chunks of its keys merging its chunks' partials as they come."""
    n_pairs = near.numel()
    # every pair is some group's, the first chunk of which writes it
    m = q.new_empty((n_pairs,))
    blocks = values_mm.new_empty((n_pairs, values_mm.shape[1]))
    done = batched_near_partials(q, near, grouped, scale, budget, values_mm, m, blocks)
    if done is not None and bool(done.index_select(0, near.reshape(-1)).all()):
        # every pair batched: not the loop's queries, counts and order again for nothing
        return m.view(near.shape), blocks.view(*near.shape, values_mm.shape[1])
    for rows, pairs, k0, k1, s, first in _near_blocks(q, near, grouped, scale, budget, done):
        z = s[:rows.shape[0]].add_(grouped.log_prior[k0:k1])
        part_m, part = partial_softmax(z, values_mm[k0:k1])
        if not first:
            part_m, part = merged_partials(m.index_select(0, pairs),
                                           blocks.index_select(0, pairs), part_m, part)
        m.index_copy_(0, pairs, part_m)
        blocks.index_copy_(0, pairs, part)
    return m.view(near.shape), blocks.view(*near.shape, values_mm.shape[1])


class NearFarScores:
    """The scores of a block of queries against grouped keys, kept to compute the attention at
    many temperatures (:meth:`outputs`): the calibration of the temperature scores a handful
    of them on the same queries. Made by :func:`near_far_scores`: ``far``, the scores against
    every prototype (``-inf`` for a query's near groups); ``near``, ``near_prior`` and
    ``near_values``, each query's near keys' scores, log-priors and values side by side in one
    row (padded with ``-inf`` scores)."""

    def __init__(self, grouped, far, near, near_prior, near_values):
        self.grouped, self.far = grouped, far
        self.near, self.near_prior, self.near_values = near, near_prior, near_values

    def outputs(self, temperature):
        """:func:`near_far_attention`'s outputs of the queries at ``temperature`` (rounded
        otherwise: the logits are the scores scaled here, not in the products)."""
        g, scale = self.grouped, 1.0 / float(temperature)
        far = self.far * scale + g.prototype_log_prior
        near = torch.add(self.near_prior, self.near, alpha=scale)
        m = torch.maximum(far.amax(1), near.amax(1))
        shift = torch.where(m.isinf(), 0.0, m)[:, None]
        # base 2: exp2 is the faster exponential (flushed_exp's base2)
        w_far = flushed_exp(far.sub_(shift).mul_(LOG2E), inplace=True, base2=True)
        w_near = flushed_exp(near.sub_(shift).mul_(LOG2E), inplace=True, base2=True)
        total = w_far.sum(1) + w_near.sum(1)
        out = w_far @ g.prototype_values + torch.bmm(w_near[:, None, :],
                                                     self.near_values)[:, 0]
        return out / torch.where(total > 0, total, 1.0)[:, None]  # 0 where every key weighs 0


@torch.no_grad()
def near_far_scores(queries, grouped, working_memory=None):
    """:class:`NearFarScores` of ``queries`` (as for :func:`near_far_attention`)."""
    near, far = _far_logits(queries, grouped, 1.0)
    width = max(1, _near_keys(near, grouped))  # (none near: a -inf column)
    n_q, n_values = queries.shape[0], grouped.values.shape[1]
    scores = far.new_full((n_q, width), -math.inf)
    prior = far.new_zeros((n_q, width))
    values = far.new_zeros((n_q, width, n_values))
    filled = torch.zeros(n_q, dtype=torch.long, device=queries.device)
    for rows, _, k0, k1, s, _ in _near_blocks(queries, near, grouped, 1.0,
                                              budget_bytes(working_memory)):
        cols = filled[rows][:, None] + torch.arange(k1 - k0, device=queries.device)
        scores[rows[:, None], cols] = s[:rows.shape[0]]
        prior[rows[:, None], cols] = grouped.log_prior[k0:k1]
        values[rows[:, None], cols] = grouped.values[k0:k1]
        filled[rows] += k1 - k0
    return NearFarScores(grouped, far, scores, prior, values)


@torch.no_grad()
def near_width(queries, grouped):
    """The most keys of their near groups any of ``queries`` attends to exactly: the width of
    :func:`near_far_scores`' rows (0 without a near group)."""
    if not queries.shape[0] or not grouped.n_near:
        return 0
    return _near_keys(_far_logits(queries, grouped, 1.0)[0], grouped)


def _near_keys(near, grouped):
    """The most keys that the groups of a row of ``near`` (group indices) hold (0: none)."""
    sizes = grouped.bounds[1:] - grouped.bounds[:-1]
    return int(sizes[near].sum(1).max()) if near.numel() else 0


def near_far_bytes(grouped, n_queries, width=None):
    """About the bytes :func:`near_far_scores` of ``n_queries`` queries keeps and computes with:
    their scores against every prototype and, side by side, against ``width`` keys of their
    near groups (by default the most they can have: the largest groups' keys)."""
    if width is None:
        width = grouped.scores_per_query() - grouped.n_groups
    item = grouped.points.element_size()
    return n_queries * item * (3 * grouped.n_groups + (4 + grouped.values.shape[1]) * width)
