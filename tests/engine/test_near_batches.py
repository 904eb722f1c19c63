"""The near groups' partial softmaxes by batches of groups (``_engine._near_batches``)."""

import pytest
import torch

from skattention._engine import _near_far, group_keys
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


@pytest.mark.parametrize("budget", [1 << 28, 1 << 17])
@pytest.mark.parametrize("d", [2, 5, 40])
def test_batches_of_groups_give_the_group_loop_s_partials(monkeypatch, budget, d):
    """Every (query, near group) pair's largest logit and weighted values as the loop over
    the groups gives them (float64, up to rounding): groups of unequal sizes (widths), a
    group near to more queries than a batch holds (the small budget: cut into row ranges),
    few dimensions (zero terms added) and many."""
    q, near, grouped, values_mm = _case(d=d)
    sizes = grouped.bounds[1:] - grouped.bounds[:-1]
    assert int(sizes.max()) > 4 * int(sizes.min()) + 16  # several padded widths
    m, blocks = batched_near_partials(q, near, grouped, 0.8, budget, values_mm)
    m_loop, blocks_loop = _loop(monkeypatch, q, near, grouped, budget, values_mm)
    torch.testing.assert_close(m, m_loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blocks, blocks_loop, rtol=1e-10, atol=1e-12)


def test_the_loop_takes_other_kinds_and_groups_too_large_for_the_budget():
    """``None`` (the caller's group loop) for the squared kind, and where a group's keys with
    the products' few rows would not fit the budget."""
    q, near, grouped, values_mm = _case(kind="sqeuclidean")
    assert batched_near_partials(q, near, grouped, 0.8, 1 << 28, values_mm) is None
    q, near, grouped, values_mm = _case()
    assert batched_near_partials(q, near, grouped, 0.8, 1 << 28, values_mm) is not None
    assert batched_near_partials(q, near, grouped, 0.8, 1 << 12, values_mm) is None


def test_a_pair_does_not_depend_on_its_batch_float32():
    """float32: a query's partials over its near groups are the same bits whichever other
    queries share the call (so the batches' members, rows and shapes differ)."""
    q, near, grouped, values_mm = _case(dtype=torch.float32, d=3)
    m, blocks = batched_near_partials(q, near, grouped, 0.8, 1 << 28, values_mm)
    for rows in (slice(0, 1), slice(3, 11), slice(550, 700), slice(0, 350)):
        part_m, part = batched_near_partials(q[rows], near[rows], grouped, 0.8, 1 << 28,
                                             values_mm)
        assert torch.equal(part_m, m[rows]) and torch.equal(part, blocks[rows])
