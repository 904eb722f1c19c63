"""The near groups' partial softmaxes by batches of groups (``_engine._near_batches``)."""

import pytest
import torch

from skattention._engine import _near_batches, _near_far, group_keys
from skattention._engine._near_batches import batched_near_partials


def _case(n=3000, d=5, n_groups=40, n_queries=700, n_near=4, dtype=torch.float64, seed=0,
          kind="euclidean"):
    """Grouped keys of very unequal groups (a dense cluster makes a few large ones), queries,
    their near groups and the keys' values as the softmax multiplies them."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.cat([torch.randn(n - 600, d, generator=g, dtype=dtype),
                      0.05 * torch.randn(600, d, generator=g, dtype=dtype)])
    values = torch.randn(n, 3, generator=g, dtype=dtype)
    log_prior = torch.log(torch.rand(n, generator=g, dtype=dtype) + 0.1)
    centres = keys[torch.randperm(n, generator=g)[:n_groups]]
    grouped = group_keys(keys, values, log_prior, centres, kind, n_near)
    queries = torch.cat([torch.randn(n_queries - 100, d, generator=g, dtype=dtype),
                         0.05 * torch.randn(100, d, generator=g, dtype=dtype)])
    near, _ = _near_far._far_logits(queries, grouped, 0.8)
    return queries, near, grouped, grouped.products()[0]


def _loop(monkeypatch, q, near, grouped, budget, values_mm):
    with monkeypatch.context() as m:
        m.setattr(_near_far, "batched_near_partials", lambda *args: None)
        return _near_far._near_partials(q, near, grouped, 0.8, budget, values_mm)


def _batched(q, near, grouped, budget, values_mm):
    """``batched_near_partials``' groups and ``(m, blocks)`` (``nan`` for the pairs it left)."""
    m = q.new_full((near.numel(),), float("nan"))
    blocks = values_mm.new_full((near.numel(), values_mm.shape[1]), float("nan"))
    done = batched_near_partials(q, near, grouped, 0.8, budget, values_mm, m, blocks)
    return done, m.view(near.shape), blocks.view(*near.shape, values_mm.shape[1])


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("d", [2, 5, 40])
def test_batches_of_groups_give_the_group_loop_s_partials(monkeypatch, small, d):
    """Every (query, near group) pair's largest logit and weighted values as the loop over
    the groups gives them (float64, up to rounding): groups of unequal sizes (widths), a
    budget whose largest member holds 8 rows (a group near to more queries: cut into row
    ranges), few dimensions (zero terms added) and many."""
    q, near, grouped, values_mm = _case(d=d)
    sizes = grouped.bounds[1:] - grouped.bounds[:-1]
    widths = -(-sizes // 16) * 16
    assert int(sizes.max()) > 4 * int(sizes.min()) + 16  # several padded widths
    budget = 1 << 28
    if small:
        costs = _near_batches._Costs(max(d + 1, 8), values_mm.shape[1], 0)
        largest = int(widths.max())
        budget = 24 * (costs.per_member(largest) + 8 * costs.per_row(largest))
        counts = torch.bincount(near.reshape(-1), minlength=grouped.n_groups)
        assert int(counts[widths == largest].max()) > 8
    done, m, blocks = _batched(q, near, grouped, budget, values_mm)
    assert bool(done.all())
    m_loop, blocks_loop = _loop(monkeypatch, q, near, grouped, budget, values_mm)
    torch.testing.assert_close(m, m_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blocks, blocks_loop, rtol=1e-10, atol=1e-12)
    m_all, blocks_all = _near_far._near_partials(q, near, grouped, 0.8, budget, values_mm)
    assert torch.equal(m_all, m) and torch.equal(blocks_all, blocks)


def test_groups_too_large_for_the_budget_are_left_to_the_loop(monkeypatch):
    """The squared kind is the loop's (``None``). With a budget that holds the small groups'
    keys but not the largest ones, only the largest are left (their pairs unwritten), the
    loop scores them in chunks of their keys, and the other groups' pairs keep the batches'
    bits: the choice is made per group."""
    q, near, grouped, values_mm = _case(kind="sqeuclidean")
    assert _batched(q, near, grouped, 1 << 28, values_mm)[0] is None
    q, near, grouped, values_mm = _case(d=40)
    sizes = grouped.bounds[1:] - grouped.bounds[:-1]
    done, m, blocks = _batched(q, near, grouped, 1 << 17, values_mm)
    assert 0 < int((~done).sum()) < int(done.sum())
    assert int(sizes[~done].min()) > int(sizes[done].max())
    left = ~done[near]
    assert bool(m[left].isnan().all()) and not bool(m[~left].isnan().any())
    m_all, blocks_all = _near_far._near_partials(q, near, grouped, 0.8, 1 << 17, values_mm)
    assert torch.equal(m_all[~left], m[~left]) and torch.equal(blocks_all[~left], blocks[~left])
    m_loop, blocks_loop = _loop(monkeypatch, q, near, grouped, 1 << 17, values_mm)
    torch.testing.assert_close(m_all, m_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blocks_all, blocks_loop, rtol=1e-10, atol=1e-12)


def test_a_pair_does_not_depend_on_its_batch_float32():
    """float32: a query's partials over its near groups are the same bits whichever other
    queries share the call (so the batches' members, rows and shapes differ)."""
    q, near, grouped, values_mm = _case(dtype=torch.float32, d=3)
    m, blocks = _near_far._near_partials(q, near, grouped, 0.8, 1 << 28, values_mm)
    for rows in (slice(0, 1), slice(3, 11), slice(550, 700), slice(0, 350)):
        part_m, part = _near_far._near_partials(q[rows], near[rows], grouped, 0.8, 1 << 28,
                                                values_mm)
        assert torch.equal(part_m, m[rows]) and torch.equal(part, blocks[rows])
