"""The engine's softmax flush, half and mixed precision, and the weights of light keys."""

import math

import numpy as np
import pytest
import torch

from skattention import attention

from .reference import reference_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flushed_softmax_sets_only_negligible_weights_to_zero(dtype):
    # Every softmax of the engine sets the weights below exp(-60) (float32; exp(-600) in
    # float64) of a row's largest to 0: torch's exp is many times slower on arguments beyond
    # the dtype's normal range. The other weights are the very numbers of torch.softmax.
    from skattention._engine._softmax import flush_below, flushed_softmax

    g = torch.Generator().manual_seed(0)
    cut = flush_below(dtype)
    z = torch.randn(7, 53, dtype=torch.float64, generator=g).mul(4).to(dtype)
    torch.testing.assert_close(flushed_softmax(z, z.amax(1)), torch.softmax(z, 1),
                               rtol=0, atol=0)
    far = z.clone()
    far[:, ::3] += 1.5 * cut  # a third of each row far below its largest (not the largest)
    far[:, 1] = far.amax(1) + 1.0
    p = flushed_softmax(far, far.amax(1))
    shifted = far - far.amax(1, keepdim=True)
    assert torch.equal(p == 0, shifted < cut)
    assert (p[:, ::3] == 0).all()
    kept = shifted >= cut
    expected = torch.softmax(torch.where(kept, far, -math.inf), 1)
    torch.testing.assert_close(p, expected, rtol=0, atol=0)
    # against the exact softmax: a flushed weight is below exp(cut)
    torch.testing.assert_close(p.double(), torch.softmax(far.double(), 1),
                               rtol=16 * torch.finfo(dtype).eps, atol=math.exp(cut))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("working_memory", [None, 0.01])
def test_sharp_temperature_matches_the_reference(dtype, working_memory):
    # With a sharp temperature most of a row's keys fall below the flush: one key block or
    # several (the online softmax flushes relative to its running maximum), the output is the
    # reference's to the dtype's precision.
    g = torch.Generator().manual_seed(1)
    Q = torch.randn(20, 4, dtype=torch.float64, generator=g)
    K = torch.randn(300, 4, dtype=torch.float64, generator=g) * 3
    V = torch.randn(300, 2, dtype=torch.float64, generator=g)
    expected, weights = reference_attention(Q, K, V, metric="euclidean", T=0.02)
    assert ((weights > 0) & (weights < math.exp(-60))).any()  # some weights are flushed
    out = attention(Q.to(dtype), K.to(dtype), V.to(dtype), metric="euclidean",
                    temperature=0.02, working_memory=working_memory, backend="stream")
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("inplace", [False, True])
def test_online_softmax_keeps_a_nan_logit_visible(inplace):
    # The flush of tiny weights (threshold: NaN is not at most the cut, so it stays NaN) must
    # keep a NaN logit (a bug upstream) visible in its row's output, which attention reports,
    # not turn it into a weight of 0 (as a where(p > cut, p, 0) would).
    from skattention._engine._softmax import OnlineSoftmax, product_values

    z = torch.zeros(4, 32)
    z[:, 1:] = -100.0  # far below the flush
    z[2, 5] = math.nan
    v = product_values(torch.ones(32, 1))
    state = OnlineSoftmax(4, 1, v, z)
    state.update(z.clone(), v, inplace)
    out = state.result()[:, :1]
    assert torch.isnan(out[2]).all()
    torch.testing.assert_close(out[[0, 1, 3]], torch.ones(3, 1), rtol=0, atol=0)


def test_averaging_dtype():
    # float64 values averaged in float64 at temperature inf or 0 (the exact selections),
    # except on devices without float64; everything else in the compute dtype
    from skattention._engine import averaging_dtype

    cpu, mps = torch.device("cpu"), torch.device("mps")
    f32, f64 = torch.float32, torch.float64
    values = np.zeros(4)
    assert averaging_dtype(values, math.inf, f32, cpu) == f64
    assert averaging_dtype(values, 0.0, f32, cpu) == f64
    assert averaging_dtype(values, 1.0, f32, cpu) == f32
    assert averaging_dtype(values, math.inf, f32, mps) == f32
    assert averaging_dtype(values.astype(np.float32), math.inf, f32, cpu) == f32
    assert averaging_dtype(torch.zeros(4, dtype=f64), math.inf, f32, cpu) == f64
    grad = torch.zeros(4, dtype=f64, requires_grad=True)
    assert averaging_dtype(grad, math.inf, f32, cpu) == f32
    assert averaging_dtype(values, math.inf, torch.float16, cpu) == f64


def test_bfloat16_attention_of_numpy_inputs_returns_float32():
    # NumPy has no bfloat16: the result comes back in float32 instead of failing at the end
    out = attention(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 1)), dtype=torch.bfloat16)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(out, 1.0)


@pytest.mark.parametrize("call", [
    dict(temperature=math.inf), dict(temperature=1.0, backend="stream"),
    dict(temperature=1.0, radius=100.0), dict(temperature=math.inf, n_neighbors=70_000),
    dict(temperature=1.0, backend="stream", return_weights=True, n_weights=3),
])
def test_float16_weights_of_more_keys_than_its_largest_number_sum_in_float32(call):
    # a row's weight sum over 100,000 keys passes float16's 65,504: it overflowed to inf and
    # the output silently became 0 (the sums now accumulate in float32)
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(100_000, 2, generator=g) * 1e-3).half()
    v = torch.rand(100_000, 1, generator=g).half()
    result = attention(torch.zeros(1, 2).half(), k, v, **call)
    out = result[0] if isinstance(result, tuple) else result
    assert out.dtype == torch.float16
    expected = v.double().mean() if call.get("n_neighbors") is None else None
    if expected is not None:
        assert abs(float(out) - float(expected)) < 2e-3
    else:
        assert abs(float(out) - 0.5) < 0.02
    if isinstance(result, tuple):
        assert result[1].dtype == torch.float16 and bool((result[1] > 0).all())


@pytest.mark.parametrize(("metric", "backend"), [("sqeuclidean", "stream"),
                                                  ("euclidean", "stream"),
                                                  ("sqeuclidean", "sdpa")])
def test_a_second_derivative_through_the_backward_is_refused(metric, backend):
    # the streaming gradient was computed without a graph: the second derivative came out 0,
    # silently; torch's fused SDPA kernel on the CPU has none (its error named an operator)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (torch.randn(4, 2, dtype=torch.float64, generator=g) for _ in range(2))
    out = attention(q, k, v, metric=metric, backend=backend)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        (grad,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        grad.sum().backward()
    (first,) = torch.autograd.grad(attention(q, k, v, metric=metric, backend=backend).sum(), q)
    assert first.shape == q.shape and not first.requires_grad


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_light_key_weights_count_whole_in_a_selection(dtype):
    # weights of 1e-6 each (normalised sample weights of many rows) never add up to the k
    # units: every key counts, as with weights of 1e-3; they were all dropped as "rounding"
    # and the call raised that no key had weight
    rng = np.random.default_rng(0)
    X, y, Q = rng.normal(size=(50, 2)), rng.normal(size=50), rng.normal(size=(2, 2))
    light = attention(Q, X, y, n_neighbors=5, log_prior=np.full(50, np.log(1e-6)), dtype=dtype)
    heavier = attention(Q, X, y, n_neighbors=5, log_prior=np.full(50, np.log(1e-3)),
                        dtype=dtype)
    np.testing.assert_allclose(light, heavier, rtol=1e-5)


def test_weights_of_a_selection_of_light_keys_cover_every_key_that_gets_weight():
    # key weights below 1 make the k units span more than k keys: the weights returned are
    # theirs (key 3, the heaviest, was cut off and the weights summed to 0.5)
    X, y = np.arange(6.0)[:, None], np.arange(6.0)
    log_prior = np.log([0.5, 0.5, 0.5, 10.0, 1.0, 1.0])
    call = dict(n_neighbors=3, log_prior=log_prior, temperature=math.inf, return_weights=True,
                dtype="float64")
    _, weights, indices = attention([[0.0]], X, y, **call)
    np.testing.assert_allclose(weights.sum(1), 1.0)
    assert 3 in indices[0]
    _, weights, indices = attention([[0.0]], X, y, n_weights=4, **call)
    np.testing.assert_array_equal(indices, [[0, 1, 2, 3]])
