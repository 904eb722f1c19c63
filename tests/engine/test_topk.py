"""The blockwise top-k merge: the grouped search for the entries above a row's k-th best
finds the entries a comparison of every entry finds, in the same order."""

import math

import pytest
import torch

from skattention._engine import _topk
from skattention._engine._topk import TopK, top_indices


def _blocks(seed, n_rows, width, n_blocks, dtype):
    g = torch.Generator().manual_seed(seed)
    # integer scores: ties within and across blocks; some -inf (masked keys) and rows of
    # -inf only (a query with fewer unmasked keys than k)
    blocks = [torch.randint(-40, 0, (n_rows, width), generator=g).to(dtype)
              for _ in range(n_blocks)]
    for b in blocks:
        b[torch.rand(b.shape, generator=g) < 0.1] = float("-inf")
        b[:3] = float("-inf")
    return blocks


def _merged(blocks, k, monkeypatch, grouped):
    if not grouped:  # every block compares every entry
        monkeypatch.setattr(_topk, "_GROUPED_MIN_COLUMNS", 1 << 30)
    top = TopK(blocks[0].shape[0], k, blocks[0])
    for j, block in enumerate(blocks):
        top.update(block, j * block.shape[1])
    monkeypatch.undo()
    return top.r, top.i


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [256, 512, 272])
@pytest.mark.parametrize("k", [1, 5, 12])
def test_grouped_search_equals_every_entry_compared(monkeypatch, dtype, width, k):
    blocks = _blocks(0, 37, width, 6, dtype)
    r, i = _merged(blocks, k, monkeypatch, grouped=True)
    r_all, i_all = _merged(blocks, k, monkeypatch, grouped=False)
    assert torch.equal(r, r_all) and torch.equal(i, i_all)
    # and the exact top k of the concatenated blocks, ties to the first key
    whole = torch.cat(blocks, 1)
    assert torch.equal(r, whole.topk(k, 1).values)
    assert bool(((whole.gather(1, i.clamp(min=0)) == r) | (i < 0)).all())
    assert bool((i[:3] == -1).all())


def test_entries_above_gives_rows_and_columns_in_order():
    g = torch.Generator().manual_seed(1)
    block = torch.randn(20, 256, generator=g)
    kth = torch.full((20,), 2.0)
    kth[5] = float("inf")  # a row with nothing above
    rows, local, (values, cols) = _topk._entries_above(block, kth, None)
    expected = (block > kth[:, None]).nonzero()
    assert torch.equal(rows[local], expected[:, 0]) and torch.equal(cols, expected[:, 1])
    assert torch.equal(values, block[expected[:, 0], expected[:, 1]])
    assert 5 not in rows.tolist()
    assert _topk._entries_above(block, torch.full((20,), 10.0), None) is None


@pytest.mark.parametrize("read_between", [False, True])
def test_merges_of_several_blocks_give_the_top_k_of_every_block(read_between):
    # entries wait for one merge of several blocks; reading the state merges them (the key
    # cells' pruning reads the k-th best between blocks)
    blocks = _blocks(2, 50, 512, 20, torch.float32)
    top = TopK(50, 7, blocks[0])
    for j, block in enumerate(blocks):
        top.update(block, j * 512)
        if read_between:
            seen = torch.cat(blocks[: j + 1], 1)
            assert torch.equal(top.r, seen.topk(7, 1).values)
    whole = torch.cat(blocks, 1)
    assert torch.equal(top.r, whole.topk(7, 1).values)
    assert bool(((whole.gather(1, top.i.clamp(min=0)) == top.r) | (top.i < 0)).all())


def test_a_companion_ranking_follows_its_entries():
    blocks = _blocks(3, 30, 512, 12, torch.float64)
    aux = [-b for b in blocks]
    top = TopK(30, 5, blocks[0], with_aux=True)
    for j, (block, companion) in enumerate(zip(blocks, aux)):
        top.update(block, j * 512, companion)
    whole, whole_aux = torch.cat(blocks, 1), torch.cat(aux, 1)
    assert torch.equal(top.r, whole.topk(5, 1).values)
    kept = top.i >= 0
    assert torch.equal(top.aux[kept], whole_aux.gather(1, top.i.clamp(min=0))[kept])


@pytest.mark.parametrize("width", [100, 511, 512, 775, 1023, 1024, 3000])
def test_top_indices_are_topk_s_on_distinct_entries(width):
    """The k largest entries through the groups' maxima (512 to 1,023 columns for k = 16) or
    ``topk`` itself: the same columns in the same order, whatever the width's remainder."""
    scores = torch.randn(300, width, generator=torch.Generator().manual_seed(width))
    assert torch.equal(top_indices(scores, 16), scores.topk(16, 1).indices)


def test_top_indices_at_ties_and_with_few_finite_entries():
    """At ties of a row's k-th entry: k distinct columns holding every entry above it and
    equal to it for the rest; a row with fewer than k finite entries (the padding's -inf
    among its candidates) gets ``topk``'s columns, all inside the row."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 40, (400, 700), generator=g).float()  # many ties
    scores[7] = -math.inf
    scores[7, :5] = 1.0
    top = top_indices(scores, 16)
    assert int(top.max()) < 700
    assert all(row.unique().numel() == 16 for row in top)
    values = scores.gather(1, top)
    kth = scores.topk(16, 1).values[:, -1:]
    assert torch.equal(values.sort(1, descending=True).values,
                       scores.topk(16, 1).values)
    assert torch.equal((scores > kth).sum(1), (values > kth).sum(1))
    assert torch.equal(top[7, :5].sort().values, torch.arange(5))


def test_top_indices_of_a_row_do_not_depend_on_the_other_rows():
    """A row with fewer than k finite entries takes ``topk`` alone: a row with ties beside it
    keeps its own columns; no rows give no columns."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 30, (1, 700), generator=g).float()
    b = torch.full((1, 700), -math.inf)
    b[0, :3] = 1.0
    assert torch.equal(top_indices(torch.cat([a, b]), 16)[0], top_indices(a, 16)[0])
    assert top_indices(torch.zeros(0, 700), 16).shape == (0, 16)
