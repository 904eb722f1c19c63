"""Attention over grouped keys (``_engine._near_far``): exact over the near groups, through the
prototypes of the others."""

import numpy as np
import pytest
import torch

from skattention._engine import attention, group_keys, near_far_attention
from skattention._engine._near_far import near_far_scores


def _grouped(n=600, d=3, n_groups=12, n_near=3, dtype=torch.float64, seed=0, prior=True,
             kind="euclidean"):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, d, generator=g, dtype=dtype)
    values = torch.randn(n, 2, generator=g, dtype=dtype)
    log_prior = (torch.log(torch.rand(n, generator=g, dtype=dtype) + 0.1) if prior
                 else torch.zeros(n, dtype=dtype))
    centres = keys[torch.randperm(n, generator=g)[:n_groups]]
    queries = torch.randn(50, d, generator=g, dtype=dtype)
    return queries, keys, values, log_prior, group_keys(keys, values, log_prior, centres,
                                                       kind, n_near)


def _scores(q, points, kind):
    """The score of ``q`` against each row of ``points`` for the engine metric ``kind``."""
    if kind == "dot":
        return points @ q
    d = torch.linalg.norm(points - q, dim=1)
    return -d if kind == "euclidean" else -d * d


def _reference(queries, grouped, temperature):
    """Float64 loop: per query, its n_near nearest prototypes' keys exactly, the others' as
    prototypes."""
    out = []
    P, b = grouped.prototypes, grouped.bounds.tolist()
    for q in queries:
        score = _scores(q, P, grouped.kind)
        near = torch.argsort(-score, stable=True)[:grouped.n_near].tolist()
        far = [j for j in range(len(P)) if j not in near]
        idx = torch.cat([torch.arange(b[j], b[j + 1]) for j in near]) if near else \
            torch.empty(0, dtype=torch.long)
        logits = torch.cat([score[far] / temperature + grouped.prototype_log_prior[far],
                            _scores(q, grouped.points[idx], grouped.kind) / temperature
                            + grouped.log_prior[idx]])
        w = torch.softmax(logits, 0)
        out.append(w @ torch.cat([grouped.prototype_values[far], grouped.values[idx]]))
    return torch.stack(out)


@pytest.mark.parametrize("n_near", [0, 1, 3, 12])
@pytest.mark.parametrize("temperature", [0.05, 1.0, 20.0])
@pytest.mark.parametrize("kind", ["euclidean", "sqeuclidean", "dot"])
def test_near_far_attention_is_the_grouped_softmax(n_near, temperature, kind):
    queries, keys, values, log_prior, grouped = _grouped(n_near=n_near, kind=kind)
    got = near_far_attention(queries, grouped, temperature)
    torch.testing.assert_close(got, _reference(queries, grouped, temperature), rtol=1e-9,
                               atol=1e-9)
    # the kept scores give the same attention at any temperature
    torch.testing.assert_close(near_far_scores(queries, grouped).outputs(temperature), got,
                               rtol=1e-9, atol=1e-9)
    if n_near == 12:  # every group near: attention over every key
        exact = attention(queries, keys, values, log_prior=log_prior, metric=kind,
                          temperature=temperature)
        torch.testing.assert_close(got, exact, rtol=1e-9, atol=1e-9)
    # a single row (scored at once) is the same softmax
    torch.testing.assert_close(near_far_attention(queries[:1], grouped, temperature), got[:1],
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["euclidean", "sqeuclidean", "dot"])
def test_each_of_a_few_rows_is_scored_as_if_alone(dtype, kind):
    queries, *_, grouped = _grouped(dtype=dtype, kind=kind)
    if kind == "euclidean":  # the one-row products of the offsets' row
        assert grouped.prepared()[0].offsets_row
    alone = torch.cat([near_far_attention(queries[i:i + 1], grouped, 0.5) for i in range(6)])
    for start, stop in ((0, 2), (0, 3), (0, 4), (2, 6), (1, 4)):
        assert torch.equal(near_far_attention(queries[start:stop], grouped, 0.5),
                           alone[start:stop])


def test_groups_hold_every_key_once_with_their_prototype():
    queries, keys, values, log_prior, grouped = _grouped(prior=False)
    b = grouped.bounds
    assert b[0] == 0 and b[-1] == keys.shape[0]
    # the sorted keys are a permutation of the keys
    assert torch.equal(torch.sort(grouped.points[:, 0]).values, torch.sort(keys[:, 0]).values)
    for j in range(grouped.n_groups):
        members = grouped.points[b[j]:b[j + 1]]
        torch.testing.assert_close(grouped.prototypes[j], members.mean(0))
        assert float(grouped.prototype_log_prior[j]) == pytest.approx(np.log(len(members)))


def test_zero_prior_groups_are_dropped_with_their_keys():
    queries, keys, values, _, _ = _grouped()
    log_prior = torch.zeros(keys.shape[0], dtype=keys.dtype)
    centres = torch.stack([keys[0], keys[1] + 100.0])  # the far centre gets no key
    log_prior[keys[:, 0] > 1.0] = -torch.inf
    grouped = group_keys(keys, values, log_prior, centres, "euclidean", 1)
    assert grouped.n_groups == 1 and grouped.points.shape[0] == keys.shape[0]
    out = near_far_attention(queries, grouped, 1.0)
    exact = attention(queries, keys, values, log_prior=log_prior, metric="euclidean",
                      temperature=1.0)
    torch.testing.assert_close(out, exact, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("workers", ["by work", "always"])
def test_a_query_does_not_depend_on_its_batch_or_the_threads(monkeypatch, dtype, workers):
    from skattention._engine import _near_far

    queries, _, _, _, grouped = _grouped(n=3000, n_groups=40, dtype=dtype)
    queries = torch.cat([queries] * 8)  # 400 rows
    # by work: this small call is one block in the calling thread; always: the workers take
    # blocks of it
    assert _near_far.near_far_workers(queries, grouped) == 1
    if workers == "always":
        monkeypatch.setattr(_near_far, "_MIN_WORKER_GROUP_WORK", 0)
        assert _near_far.near_far_workers(queries, grouped) == torch.get_num_threads()
    whole = near_far_attention(queries, grouped, 0.7)
    for rows in (slice(3, 10), slice(100, 399)):
        assert torch.equal(near_far_attention(queries[rows], grouped, 0.7), whole[rows])
    # up to 4 rows: each query's near keys scored at once, rounded otherwise
    for rows in (slice(0, 1), slice(5, 9)):
        torch.testing.assert_close(near_far_attention(queries[rows], grouped, 0.7), whole[rows])
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(near_far_attention(queries, grouped, 0.7), whole)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_query_over_small_groups_does_not_depend_on_its_place_in_the_batch(dtype):
    # groups of a few keys (products of some widths round a row by its place among the
    # block's rows on some CPUs' kernels: such spans are scored wider); the rows 37-73 of the
    # batch first alone, then among the others, where each group's block holds other
    # queries before them
    queries, _, _, _, grouped = _grouped(n=600, d=8, n_groups=75, n_near=4, dtype=dtype)
    sizes = (grouped.bounds[1:] - grouped.bounds[:-1]).tolist()
    assert any(size % 4 for size in sizes)
    queries = torch.cat([queries] * 8)  # 400 rows
    whole = near_far_attention(queries, grouped, 0.7)
    for rows in (slice(37, 74), slice(5, 30), slice(101, 397)):
        assert torch.equal(near_far_attention(queries[rows], grouped, 0.7), whole[rows])


def test_small_budgets_chunk_the_keys_of_a_group():
    queries, _, _, _, grouped = _grouped(n=3000, n_groups=4, n_near=2)
    whole = near_far_attention(queries, grouped, 0.5)
    chunked = near_far_attention(queries, grouped, 0.5, working_memory=0.01)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cache_sized_prototype_blocks_give_the_same_bits(monkeypatch, dtype):
    # on the CPU a worker's prototype scores come in blocks of at most CPU_BLOCK_ENTRIES (not
    # the whole working memory): each row is its own softmax state, so any block gives the
    # same outputs
    from skattention._engine import _near_far

    queries, _, _, _, grouped = _grouped(n=3000, n_groups=40, dtype=dtype)
    queries = torch.cat([queries] * 8)
    whole = near_far_attention(queries, grouped, 0.7)
    monkeypatch.setattr(_near_far, "CPU_BLOCK_ENTRIES", 40 * 12)  # 12 rows a block
    assert torch.equal(near_far_attention(queries, grouped, 0.7), whole)


def test_pooled_sums_in_row_chunks_give_the_same_bits(monkeypatch):
    # the prototypes' float64 weighted means are summed in chunks of rows (a float64 copy of
    # every key was a fit's largest allocation): index_add_ adds a label's rows in order
    from skattention._engine import _near_far

    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 7, (1000,), generator=g)
    log_prior = torch.randn(1000, generator=g)
    points = torch.randn(1000, 5, generator=g)
    values = torch.rand(1000, 2, generator=g, dtype=torch.float64)
    whole = _near_far.pooled(labels, 9, log_prior, points, values)
    monkeypatch.setattr(_near_far, "KEY_CHUNK_ROWS", 37)
    chunked = _near_far.pooled(labels, 9, log_prior, points, values)
    for a, b in zip([*whole[:2], *whole[2]], [*chunked[:2], *chunked[2]], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(whole[0][7:], torch.zeros(2, dtype=torch.float64))  # labels 7, 8: none


def test_no_queries_and_no_near_groups():
    queries, keys, values, log_prior, grouped = _grouped(n_near=0)
    assert near_far_attention(queries[:0], grouped, 1.0).shape == (0, 2)
    one = near_far_attention(queries[:1], grouped, 1.0)  # the few-rows path, no near group
    torch.testing.assert_close(one, _reference(queries[:1], grouped, 1.0), rtol=1e-9,
                               atol=1e-9)


@pytest.mark.parametrize("n_near", [0, 2, 8])
def test_equal_keys_kept_as_one_give_the_same_attention(n_near):
    """``row_groups``: the keys of equal rows as one key with their summed weight and mean
    values: fewer keys, the same attention (and zero-weight rows' groups carry no weight)."""
    g = torch.Generator().manual_seed(0)
    distinct = torch.randn(40, 3, generator=g, dtype=torch.float64)
    rows = torch.randint(40, (900,), generator=g)
    keys = distinct[rows]
    values = torch.randn(900, 2, generator=g, dtype=torch.float64)
    log_prior = torch.log(torch.rand(900, generator=g, dtype=torch.float64) + 0.1)
    log_prior[rows == 7] = -torch.inf
    centres = distinct[:8]
    queries = torch.randn(30, 3, generator=g, dtype=torch.float64)
    merged = group_keys(keys, values, log_prior, centres, "euclidean", n_near, rows)
    assert merged.points.shape[0] <= 40
    exact = attention(queries, keys, values, log_prior=log_prior, metric="euclidean",
                      temperature=0.3)
    if n_near == 8:  # every group near: exact
        torch.testing.assert_close(near_far_attention(queries, merged, 0.3), exact,
                                   rtol=1e-9, atol=1e-9)
    whole = group_keys(keys, values, log_prior, centres, "euclidean", n_near)
    torch.testing.assert_close(near_far_attention(queries, merged, 0.3),
                               near_far_attention(queries, whole, 0.3), rtol=1e-9, atol=1e-9)
