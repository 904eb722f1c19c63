"""The engine's paths on a CUDA GPU against the dense float64 reference (skipped without one)."""

import pytest
import torch

from skattention import attention, kneighbors

from .reference import reference_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _data(n_q=300, n_k=5000, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n_q, d, generator=g),
        torch.randn(n_k, d, generator=g),
        torch.randn(n_k, 8, generator=g),
    )


@pytest.mark.parametrize("backend", ["stream", "sdpa"])
@pytest.mark.parametrize(
    "dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)]
)
def test_dense_paths(backend, dtype, tol):
    Q, K, V = _data()
    ref, _ = reference_attention(Q, K, V, T=64.0)
    out = attention(Q.cuda(), K.cuda(), V.cuda(), temperature=64.0, backend=backend, dtype=dtype)
    assert out.is_cuda and out.dtype == dtype
    torch.testing.assert_close(out.double().cpu(), ref, atol=tol, rtol=tol)


def test_top_k_matches_cpu():
    Q, K, V = _data()
    ref, _ = reference_attention(Q, K, V, T=64.0, k=16)
    out = attention(
        Q.cuda(), K.cuda(), V.cuda(), temperature=64.0, n_neighbors=16, dtype=torch.float64
    )
    torch.testing.assert_close(out.cpu(), ref, atol=1e-10, rtol=1e-10)
    # float32: GPU and CPU round the scores differently, so a near tie may swap a neighbour
    d_gpu, i_gpu = kneighbors(Q.cuda(), K.cuda(), n_neighbors=16)
    d_cpu, i_cpu = kneighbors(Q, K, n_neighbors=16, device="cpu")
    torch.testing.assert_close(d_gpu.cpu(), d_cpu, atol=1e-3, rtol=1e-5)
    assert (i_gpu.cpu() == i_cpu).float().mean() > 0.99


def test_top_k_bfloat16_runs():
    # bf16 scores (8-bit mantissa) can swap near-tied neighbours: run, but no exact selection.
    Q, K, V = _data()
    out = attention(
        Q.cuda(), K.cuda(), V.cuda(), temperature=64.0, n_neighbors=16, dtype=torch.bfloat16
    )
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())


def test_repeatable_forward():
    Q, K, V = (t.cuda() for t in _data())
    for kw in ({"backend": "stream"}, {"backend": "sdpa"}, {"n_neighbors": 16}):
        a = attention(Q, K, V, temperature=64.0, **kw)
        b = attention(Q, K, V, temperature=64.0, **kw)
        assert torch.equal(a, b), kw
