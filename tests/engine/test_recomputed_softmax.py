"""The training step's softmax over a block never stored whole (``_recomputed``): the same
values and gradients as the block computed whole."""

import pytest
import torch

from skattention._engine import _one_block, _recomputed
from skattention._engine._one_block import self_mask, single_block_attention
from skattention._engine._scores import PreparedKeys


def _step(monkeypatch, recomputed, learned_scale, prior, masked, n=300, dtype=torch.float64,
          n_queries=120, value_grad=True):
    monkeypatch.setattr(_one_block, "RECOMPUTED_MIN_PAIRS", 0 if recomputed else 1 << 60)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 5, generator=g, dtype=dtype)
    X[7] = X[3]  # a duplicate: distance 0, gradient 0 there
    W = torch.randn(5, 4, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(n, 2, generator=g, dtype=dtype, requires_grad=value_grad)
    log_t = torch.tensor(0.3, dtype=dtype, requires_grad=learned_scale)
    log_prior = (torch.randn(n, generator=g, dtype=dtype).requires_grad_() if prior
                 else None)
    keys = X @ W
    queries = keys[:n_queries] * 1.0
    prepared = PreparedKeys(keys, "euclidean", check_finite=False)
    scale = torch.exp(-log_t) if learned_scale else 0.8
    own = torch.arange(n_queries) if masked else None
    out = single_block_attention(prepared, prepared.centre(queries), v, scale, log_prior,
                                 self_mask(own, n) if masked else None)
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).reshape(out.shape)).sum()
    leaves = ([W] + ([v] if value_grad else []) + ([log_t] if learned_scale else [])
              + ([log_prior] if prior else []))
    return out.detach(), torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("learned_scale", [False, True])
@pytest.mark.parametrize("prior", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n", [300, 5000])  # one chunk of rows, several
def test_recomputed_block_has_the_values_and_gradients_of_the_whole_block(
        monkeypatch, learned_scale, prior, masked, n):
    want_out, want_grads = _step(monkeypatch, False, learned_scale, prior, masked, n)
    out, grads = _step(monkeypatch, True, learned_scale, prior, masked, n)
    # Unmasked, each query meets its own key at a distance of rounding noise: the square root
    # of a squared distance of about 1e-16 (the two paths' products round it differently, as
    # the CPU's BLAS does: 1.5e-8 apart on an AMD EPYC, equal on Intel), which moves the own
    # key's weight, and so the outputs, by up to about 1e-8.
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12 if masked else 1e-7)
    # There too the partial scores' gradient (divided by the distance) is that noise
    # magnified: the two paths, which sum the keys' gradients in other orders and fold the row
    # factors in elsewhere, differ there by a few 1e-10 (Intel) to a few 1e-8 (AMD EPYC) on
    # gradients of order 1e-2.
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10 if masked else 1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recomputed_block_is_the_same_on_any_number_of_workers(monkeypatch, dtype):
    # 400 queries over 5,000 keys: 8 cache-sized chunks in 4 runs, each run's sums of the
    # keys' gradients apart and added in the runs' order, on 1, 2 or 3 workers alike
    from skattention._engine._parallel import chunk_workers

    assert len(_recomputed._chunk_groups(400, 5000, torch.device("cpu"))) == 4
    runs = []
    for workers in (1, 2, 3):
        with chunk_workers(workers):
            out, grads = _step(monkeypatch, True, True, True, True, n=5000, dtype=dtype,
                               n_queries=400)
        runs.append([out, *grads])
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)


def test_recomputed_block_with_reused_buffers_is_the_same_and_keeps_its_gradients(monkeypatch):
    # within a training loop the chunks' buffers are reused from step to step: the same
    # results, and gradients returned by one step are not overwritten by the next
    from skattention._engine._scratch import reused_buffers

    want_out, want_grads = _step(monkeypatch, True, False, False, True, n=5000,
                                 dtype=torch.float32, n_queries=400)
    with reused_buffers():
        out, grads = _step(monkeypatch, True, False, False, True, n=5000, dtype=torch.float32,
                           n_queries=400)
        kept = [g.clone() for g in grads]
        _step(monkeypatch, True, True, True, True, n=4000, dtype=torch.float32, n_queries=300)
    assert torch.equal(out, want_out)
    for got, again, want in zip(grads, kept, want_grads, strict=True):
        assert torch.equal(got, want) and torch.equal(got, again)


@pytest.mark.parametrize("learned_scale", [False, True])
@pytest.mark.parametrize("prior", [False, True])
@pytest.mark.parametrize("value_grad", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distances_kept_for_the_backward_give_the_same_bits(monkeypatch, learned_scale, prior,
                                                             value_grad, dtype):
    # within a training loop the forward keeps its distances for the backward (which then
    # skips their product and square root), or, without the scale's, the prior's and the
    # values' gradients (a training step), the weights over the distances: the same
    # operations on the same numbers
    from skattention._engine._scratch import reused_buffers

    want = _step(monkeypatch, True, learned_scale, prior, True, n=5000, dtype=dtype,
                 n_queries=400, value_grad=value_grad)
    with reused_buffers():
        got = _step(monkeypatch, True, learned_scale, prior, True, n=5000, dtype=dtype,
                    n_queries=400, value_grad=value_grad)
    for a, b in zip([want[0], *want[1]], [got[0], *got[1]], strict=True):
        assert torch.equal(a, b)


def test_a_forward_whose_kept_distances_were_taken_recomputes_them(monkeypatch):
    # two forwards before their backwards: the second takes the kept distances' buffer, so
    # the first backward computes its distances again (and gets its own gradients)
    from skattention._engine._scratch import reused_buffers

    monkeypatch.setattr(_one_block, "RECOMPUTED_MIN_PAIRS", 0)
    g = torch.Generator().manual_seed(1)

    def graph():
        keys = torch.randn(3000, 6, generator=g).requires_grad_()
        v = torch.randn(3000, 2, generator=g)
        prepared = PreparedKeys(keys, "euclidean", check_finite=False)
        out = single_block_attention(prepared, prepared.centre(keys[:200] * 1.0), v, 0.7,
                                     None, self_mask(torch.arange(200), 3000))
        return keys, out.sum()

    first, second = graph(), graph()
    want = [torch.autograd.grad(loss, keys) for keys, loss in (first, second)]
    g.manual_seed(1)  # the same draws again
    with reused_buffers():
        first, second = graph(), graph()
        got = [torch.autograd.grad(loss, keys) for keys, loss in (first, second)]
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a[0], b[0])
