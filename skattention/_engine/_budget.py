"""Working memory -> block sizes: the one planner of every blockwise loop (torch only).

``working_memory`` (MiB, ``skattention.get_config()`` or a per-call argument) bounds the scratch
memory a loop holds beyond its inputs and outputs. Every loop that works in blocks asks
:func:`plan_blocks` (rows x columns: queries x keys) or :func:`plan_rows` (rows only: points,
queries, minibatch rows) how large a block may be, from what one block costs:

* ``pair_bytes``: bytes per (row, column) entry of a block (scores and their temporaries);
* ``row_bytes``: bytes per row whatever the columns (softmax state, top-k buffers, gathers);
* ``fixed_bytes``: bytes held once for the whole loop (e.g. SDPA's padded key copies).

On the CPU, blocks are also capped at a cache-sized number of score entries,
``CPU_BLOCK_ENTRIES`` (:func:`cpu_block_rows` for row blocks).

A loop that cannot fit even one row raises the one :class:`MemoryError` text of
:func:`memory_error`, naming ``working_memory`` and what else to change.
"""

import math

import torch

from .._config import check_working_memory, get_config

# The BLAS kernels give a row of a product the same rounding whatever the rows around it only
# when the row count is a multiple of 4 (one or two rows take a matrix-vector path, a ragged tail
# another kernel; measured with torch's MKL on AVX-512, float32 and float64, 1 and 2 threads):
# blocks of queries are padded to one, so that a query's output does not depend on its batch.
ROW_MULTIPLE = 4

# And a row's rounding depends on its place among the rows unless the product's column count is
# a multiple of 4 (measured with MKL on an AMD EPYC: float32 5-7 and 9-11 columns, float64 odd
# ones): blocks of keys are computed over spans of a multiple of 4 keys and sliced (``span_stop``).
KEY_SPAN_MULTIPLE = 4


def span_stop(start, stop, n_columns):
    """The end of the span from ``start`` of a multiple of :data:`KEY_SPAN_MULTIPLE` columns
    that covers ``stop``, where a matrix of ``n_columns`` columns holds it (else ``stop``)."""
    wide = start + -(stop - start) % KEY_SPAN_MULTIPLE + (stop - start)
    return wide if wide <= n_columns else stop


def span_columns(n):
    """``n`` columns and the zero ones after them that :func:`span_stop` may reach."""
    return n + -n % KEY_SPAN_MULTIPLE

# On the CPU a score block of about 2**20 entries (4 MiB in float32) stays in cache; larger
# blocks are slower, not faster. Accelerators want blocks as large as the budget allows.
CPU_BLOCK_ENTRIES = 1 << 20
# A block that whole rows of scores pass through with two temporaries of its size (a softmax
# and its logits): a quarter of the above stays in cache.
_CPU_ROW_PASS_ENTRIES = CPU_BLOCK_ENTRIES // 4
_CPU_KEY_BLOCK = 1024
# Rows per chunk of a pass over every key that would otherwise hold a copy of all of them at
# once (the offsets of ``PreparedKeys``, the float64 sums of ``_near_far.pooled``): such
# copies were the largest allocations of a fit on many rows.
KEY_CHUNK_ROWS = 16384
# Dense attention over at most this many keys: one key block on the CPU (``plan_blocks``); up
# to here whole rows cost no more than key blocks, beyond it they do (docs/performance.md,
# "Engine design notes").
CPU_WHOLE_ROW_KEYS = 16384
_ACCEL_KEY_BLOCK = 16384


def budget_bytes(working_memory=None):
    """The scratch budget in bytes: ``working_memory`` MiB, or the configured one for ``None``."""
    mib = get_config()["working_memory"] if working_memory is None else working_memory
    return int(check_working_memory(mib) * 2**20)


def memory_error(what, need, budget, hint, per="per query"):
    """The MemoryError of a loop that cannot fit one block row in the budget.

    ``what`` needs ``need`` bytes ``per`` row (or, with ``per=""``, in all); ``hint`` says what
    to change besides raising ``working_memory`` (``None``: nothing).
    """
    per = f" {per}" if per else ""
    need_text, budget_text = f"{_mib(need)} MiB", f"{_mib(budget)} MiB"
    if need_text == budget_text:  # (rounded alike: the bytes tell them apart)
        need_text += f" ({math.ceil(need):,} bytes)"
        budget_text += f" ({math.floor(budget):,} bytes)"
    return MemoryError(
        f"{what} needs at least {need_text} of scratch memory{per} but the budget is "
        f"{budget_text}; raise working_memory (skattention.config_context("
        f"working_memory=...)){f' or {hint}' if hint else ''}."
    )


def _mib(n_bytes):
    mib = n_bytes / 2**20
    return f"{mib:.1f}" if mib >= 0.1 else f"{mib:.2g}"


def plan_blocks(n_rows, n_cols, *, pair_bytes, row_bytes=0, budget, device, what, hint,
                cache_sized=True, whole_rows=False, whole_rows_up_to=0,
                cpu_cols=_CPU_KEY_BLOCK):
    """``(rows, cols)`` of blocks of an ``n_rows x n_cols`` loop whose scratch fits ``budget``.

    Columns first: on the CPU (``cache_sized``) at most ``cpu_cols`` (1024) columns and
    ``CPU_BLOCK_ENTRIES`` entries per block, which keeps the block in cache; elsewhere, or under
    autograd where every block stays alive in the graph anyway, up to 16384 columns and as many
    rows as the budget allows (fewer, larger blocks: fewer ops). Columns are halved until one
    row fits.
    ``whole_rows``: every block spans all columns (callers that fill whole output rows).
    ``whole_rows_up_to``: on the CPU, up to this many columns are one block of a quarter of
    ``CPU_BLOCK_ENTRIES`` (a whole softmax row and its temporaries stay in cache, and a query
    or a few pay one block's operations, not one per 1024 columns). The columns depend on
    ``n_cols`` alone, never on ``n_rows``: a row's result must not depend on its batch.
    """
    if whole_rows:
        cols = n_cols
        per_row = n_cols * pair_bytes + row_bytes
        if per_row > budget:
            raise memory_error(what, per_row, budget, hint, per="per row")
        return max(1, min(n_rows, budget // per_row)), cols
    if device.type == "cpu" and cache_sized:
        cols, target = min(n_cols, cpu_cols), CPU_BLOCK_ENTRIES
        if n_cols <= whole_rows_up_to:
            cols, target = n_cols, _CPU_ROW_PASS_ENTRIES
    else:
        cols, target = min(n_cols, _ACCEL_KEY_BLOCK), max(1, budget // pair_bytes)
    while cols > 1 and cols * pair_bytes + row_bytes > budget:
        cols //= 2
    if cols * pair_bytes + row_bytes > budget:
        raise memory_error(what, pair_bytes + row_bytes, budget, hint)
    rows = budget // (cols * pair_bytes + row_bytes)
    return max(1, min(rows, max(1, target // cols), n_rows)), cols


def plan_rows(n_rows, *, row_bytes, budget, what=None, hint=None, fixed_bytes=0, max_rows=None,
              per="per row"):
    """Rows per block of a loop over ``n_rows`` rows (``None``: unbounded) within ``budget``.

    Each block holds ``fixed_bytes`` plus ``row_bytes`` per row; ``max_rows`` caps the block
    (a cache-sized block on the CPU, a kernel's limit). With ``what``, a budget that cannot fit
    one row raises :func:`memory_error`; without, a block has at least one row.
    """
    if what is not None and fixed_bytes + row_bytes > budget:
        raise memory_error(what, fixed_bytes + row_bytes, budget, hint, per=per)
    rows = (budget - fixed_bytes) // max(1, row_bytes)
    if max_rows is not None:
        rows = min(rows, max_rows)
    if n_rows is not None:
        rows = min(rows, n_rows)
    return int(max(1, rows))


def cpu_block_rows(row_entries):
    """Rows of a CPU block holding ``row_entries`` score entries per row (cache-sized)."""
    return max(1, CPU_BLOCK_ENTRIES // max(1, row_entries))


def all_finite(t):
    """Whether every entry of tensor ``t`` is finite, checked in cache-sized row chunks:
    ``torch.isfinite`` of a whole float tensor holds temporaries several times its size (its
    absolute value and comparisons), a peak beyond the budget for a large input or output."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    if t.numel() <= _CPU_ROW_PASS_ENTRIES or t.device.type != "cpu":  # (a small call: one)
        return bool(torch.isfinite(t).all())
    rows = t.reshape(t.shape[0], -1)
    return all(bool(torch.isfinite(part).all())
               for rows_slice in cache_row_slices(*rows.shape, t.device)
               for part in rows[rows_slice].split(_CPU_ROW_PASS_ENTRIES, dim=1))


def cache_row_slices(n_rows, n_cols, device):
    """Row slices of a (n_rows x n_cols) matrix pass that keep a chunk and two temporaries of
    its size in a CPU core's cache (a pass over wide rows that leaves the cache is several
    times slower); one slice on accelerators."""
    rows = n_rows if device.type != "cpu" else max(1, _CPU_ROW_PASS_ENTRIES // max(1, n_cols))
    return [slice(s, min(n_rows, s + rows)) for s in range(0, n_rows, rows)]


def score_pair_bytes(spec):
    """Scratch bytes per (query, key) entry of a score block: the block and its temporaries."""
    return pair_bytes(spec.queries.element_size(), spec.radius)


def pair_bytes(item, radius=None):
    """:func:`score_pair_bytes` of queries of ``item`` bytes per number and a ``radius``."""
    return 3 * item + 2 + (radius.pair_bytes(item) if radius else 0)


def dense_plan(n_q, n_k, dim, n_values, pair_bytes, n_weights, device, inplace, budget,
               item):
    """``(plan, bq, bk)``: the :func:`plan_blocks` arguments of dense attention of ``n_q``
    queries of ``dim`` numbers of ``item`` bytes over ``n_k`` keys with ``n_values`` values
    (``pair_bytes`` per score, the ``n_weights`` largest weights of each query tracked), and
    its query and key blocks."""
    query_bytes = item * (2 * n_values + 4 + 2 * dim) + (n_weights or 0) * 3 * (2 * item + 8)
    plan = dict(
        pair_bytes=pair_bytes, row_bytes=query_bytes, device=device, what="dense attention",
        hint=None, cache_sized=inplace,
        whole_rows_up_to=CPU_WHOLE_ROW_KEYS,
    )
    return (plan, *plan_blocks(n_q, n_k, budget=budget, **plan))


def batch_rows(n_candidates, n_values, dim, itemsize, working_memory=None):
    """Most minibatch rows whose training step fits ``working_memory`` (MiB; ``None``: config).

    Under autograd the (rows x n_candidates) scores of a step, their exponentials and, in the
    backward pass, their gradients coexist: about 4 values and a mask byte per pair
    (docs/engine.md, "Memory"), plus per-row outputs, targets and gradients.
    """
    return plan_rows(
        None, row_bytes=n_candidates * (4 * itemsize + 2) + itemsize * (4 * n_values + 4 * dim + 8),
        budget=budget_bytes(working_memory), per="per point",
        what=f"training (each point attends to {n_candidates} candidate points)",
        hint="lower sample_rate (fewer candidates per minibatch)",
    )
