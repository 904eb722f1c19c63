"""The engine's non-squared ("euclidean") distance: gradients, selections, float32."""

import math

import pytest
import torch

from skattention import attention, kneighbors

from .reference import reference_attention


def test_euclidean_gradients_match_reference_and_learned_temperature(data):
    Q, K, V, prior = data
    for kwargs in [dict(n_neighbors=5), dict(log_prior=prior, working_memory=0.01), {}]:
        q1 = Q.clone().requires_grad_()
        t1 = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        attention(q1, K, V, metric="euclidean", temperature=t1, **kwargs).sum().backward()
        q2 = Q.clone().requires_grad_()
        t2 = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        ref_kwargs = dict(k=kwargs.get("n_neighbors"), log_prior=kwargs.get("log_prior"))
        reference_attention(q2, K, V, "euclidean", T=t2, **ref_kwargs)[0].sum().backward()
        torch.testing.assert_close(q1.grad, q2.grad)
        if not kwargs:  # the reference's temperature gradient is NaN where keys are masked
            torch.testing.assert_close(t1.grad, t2.grad)


def test_euclidean_gradient_is_zero_at_distance_zero():
    # Duplicated rows: d(q, k) = 0 has an infinite derivative; the engine's is 0, so training
    # on data with duplicates stays finite (and equals the gradient without the duplicate's
    # distance term).
    g = torch.Generator().manual_seed(4)
    K = torch.randn(30, 3, dtype=torch.float64, generator=g)
    K[1] = K[0]
    V = torch.randn(30, 2, dtype=torch.float64, generator=g)
    for kwargs in [dict(exclude_self=True), dict(n_neighbors=4), {}]:
        keys = K.clone().requires_grad_()
        out = attention(keys, keys, V, metric="euclidean", temperature=0.5, **kwargs)
        out.sum().backward()
        assert bool(torch.isfinite(keys.grad).all())
    # a query on key 0 and away from key 2: only the distance to key 2 moves the output
    q = K[:1].clone().requires_grad_()
    attention(q, K[[0, 2]], V[[0, 2]], metric="euclidean", temperature=0.5).sum().backward()
    q_ref = K[:1].clone().requires_grad_()
    scores = torch.stack([torch.zeros((), dtype=torch.float64), -(q_ref - K[2]).norm()]) / 0.5
    (torch.softmax(scores, 0) @ V[[0, 2]]).sum().backward()
    torch.testing.assert_close(q.grad, q_ref.grad)


def test_euclidean_selects_like_sqeuclidean_and_kneighbors_gives_distances(data):
    Q, K, V, _ = data
    d2, i2 = kneighbors(Q, K, 6, metric="sqeuclidean")
    d1, i1 = kneighbors(Q, K, 6, metric="euclidean")
    assert torch.equal(i1, i2)
    torch.testing.assert_close(d1, d2.sqrt())
    for kwargs in [dict(temperature=0.0), dict(temperature=math.inf, n_neighbors=5),
                   dict(temperature=math.inf, radius=2.0)]:
        torch.testing.assert_close(
            attention(Q, K, V, metric="euclidean", on_empty="zero", **kwargs),
            attention(Q, K, V, metric="sqeuclidean", on_empty="zero", **kwargs),
        )


def test_euclidean_float32_close_to_float64_and_no_sdpa(data):
    Q, K, V, prior = data
    kw = dict(metric="euclidean", temperature=0.5, log_prior=prior)
    exact = attention(Q, K, V, **kw)
    fast = attention(Q.float(), K.float(), V.float(), **kw)
    torch.testing.assert_close(fast.double(), exact, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="backend='sdpa'"):
        attention(Q, K, V, backend="sdpa", **kw)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "dot"])
@pytest.mark.parametrize("exclude", [False, True])
@pytest.mark.parametrize("row_chunk", [None, 3])
def test_single_block_training_path_gradcheck(metric, exclude, row_chunk, monkeypatch):
    # Under autograd one key block holding every key takes the hand-written single-block
    # softmax (_one_block._SingleBlockSoftmax), row chunk by row chunk; its forward must equal the
    # no-grad result and its backward the finite differences, for every input that gets one.
    import skattention._engine._one_block as blocks

    if row_chunk is not None:
        monkeypatch.setattr(blocks, "cache_row_slices", lambda n, m, device: [
            slice(s, min(n, s + row_chunk)) for s in range(0, n, row_chunk)])
    g = torch.Generator().manual_seed(4)
    Q, K = (torch.randn(9, 3, dtype=torch.float64, generator=g) for _ in range(2))
    K[4] = K[3]  # a duplicated key
    V = torch.randn(9, 3, dtype=torch.float64, generator=g)
    prior = torch.randn(9, dtype=torch.float64, generator=g)
    T = torch.tensor(0.7, dtype=torch.float64)
    self_index = torch.arange(9) if exclude else None

    def f(q, k, v, p, t):
        return attention(q, k, v, metric=metric, temperature=t, log_prior=p,
                         exclude_self=self_index)

    inputs = [x.clone().requires_grad_() for x in (Q, K, V, prior, T)]
    assert torch.autograd.gradcheck(f, inputs)
    with torch.no_grad():
        expected = f(Q, K, V, prior, float(T))
    torch.testing.assert_close(f(*inputs).detach(), expected)


def test_single_block_training_path_zero_gradient_at_distance_zero():
    # Keys attending to themselves and to their duplicates (distance 0, non-squared distance):
    # the gradient there is 0, not inf or NaN.
    g = torch.Generator().manual_seed(5)
    K = torch.randn(6, 2, dtype=torch.float64, generator=g)
    K = torch.cat([K, K[:2]]).requires_grad_()
    V = torch.randn(8, 2, dtype=torch.float64, generator=g)
    T = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    attention(K, K, V, metric="euclidean", temperature=T).sum().backward()
    assert torch.isfinite(K.grad).all() and torch.isfinite(T.grad)
