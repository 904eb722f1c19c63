"""The engine against a naive dense reference, across paths, priors, limits and block sizes."""

import math

import numpy as np
import pytest
import torch

import skattention
from skattention import attention, kneighbors

from .reference import DIM, N_KEYS, N_QUERIES, reference_attention

CASES = [
    (backend, metric, temperature, n_neighbors, radius, with_prior, working_memory)
    for backend in ["stream", "auto"]
    for metric in ["sqeuclidean", "euclidean", "dot"]
    for temperature in [0.5, 3.0, 0.0, math.inf]
    for n_neighbors in [None, 1, 7]
    for radius in ([None] if metric == "dot" else [None, 2.5])  # radius needs a distance
    for with_prior in [False, True]
    for working_memory in [None, 0.01]
]


@pytest.mark.parametrize(
    "backend, metric, temperature, n_neighbors, radius, with_prior, working_memory", CASES
)
def test_matches_reference(
    data, backend, metric, temperature, n_neighbors, radius, with_prior, working_memory
):
    Q, K, V, prior = data
    prior = prior if with_prior else None
    expected, _ = reference_attention(Q, K, V, metric, temperature, n_neighbors, radius, prior)
    out = attention(
        Q, K, V, metric=metric, temperature=temperature, n_neighbors=n_neighbors, radius=radius,
        log_prior=prior, working_memory=working_memory, backend=backend, on_empty="zero",
    )
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_small_budget_uses_many_blocks_and_same_result(data):
    Q, K, V, _ = data
    # 0.01 MiB forces key blocks far smaller than N_KEYS and many query blocks.
    from skattention._engine._budget import plan_blocks

    bq, bk = plan_blocks(
        N_QUERIES, N_KEYS, pair_bytes=26, row_bytes=200, budget=int(0.01 * 2**20),
        device=torch.device("cpu"), what="x", hint="y",
    )
    assert bq * bk * 26 + bq * 200 <= 0.01 * 2**20
    a = attention(Q, K, V, temperature=1.0, working_memory=0.01, backend="stream")
    b = attention(Q, K, V, temperature=1.0, backend="stream")
    torch.testing.assert_close(a, b)


def test_sdpa_path_equals_streaming_path(data):
    Q, K, V, prior = data
    for dtype, tol in [(torch.float32, 2e-6), (torch.float64, 1e-12)]:
        for metric in ["sqeuclidean", "dot"]:
            kw = dict(metric=metric, temperature=2.0, log_prior=prior, dtype=dtype)
            fused = attention(Q, K, V, backend="sdpa", **kw)
            plain = attention(Q, K, V, backend="stream", **kw)
            torch.testing.assert_close(fused, plain, rtol=tol, atol=tol)


def test_sdpa_backend_refuses_what_it_cannot_do(data):
    Q, K, V, _ = data
    with pytest.raises(ValueError, match="backend='sdpa'"):
        attention(Q, K, V, n_neighbors=3, backend="sdpa")


def test_top_weights_dense_and_knn(data):
    Q, K, V, prior = data
    _, W = reference_attention(Q, K, V, T=2.0, log_prior=prior)
    out, w, idx = attention(
        Q,
        K,
        V,
        temperature=2.0,
        log_prior=prior,
        return_weights=True,
        n_weights=5,
        working_memory=0.01,
    )
    top_w, top_i = W.topk(5, 1)
    torch.testing.assert_close(w, top_w)
    assert torch.equal(idx, top_i)

    _, W = reference_attention(Q, K, V, T=2.0, k=6)
    out, w, idx = attention(Q, K, V, temperature=2.0, n_neighbors=6, return_weights=True)
    assert w.shape == idx.shape == (N_QUERIES, 6)
    torch.testing.assert_close(w, W.gather(1, idx))
    torch.testing.assert_close(w.sum(1), torch.ones(N_QUERIES, dtype=torch.float64))
    # nearest first
    d = torch.cdist(Q, K).gather(1, idx)
    assert torch.all(d[:, 1:] >= d[:, :-1])


@pytest.mark.parametrize("temperature", [0.0, math.inf])
def test_top_weights_in_the_limits(data, temperature):
    Q, K, V, _ = data
    _, W = reference_attention(Q, K, V, T=temperature)
    _, w, idx = attention(
        Q, K, V, temperature=temperature, return_weights=True, n_weights=4, working_memory=0.01
    )
    torch.testing.assert_close(w, W.gather(1, idx))
    if temperature == 0.0:
        assert torch.equal(idx[:, 0], torch.cdist(Q, K).argmin(1))


def test_exclude_self_bool_and_array(data):
    _, K, V, _ = data
    expected, _ = reference_attention(K, K, V, T=1.0, exclude=torch.arange(N_KEYS))
    out = attention(K, K, V, temperature=1.0, exclude_self=True, working_memory=0.01)
    torch.testing.assert_close(out, expected)
    expected, _ = reference_attention(K, K, V, T=0.0, k=3, exclude=torch.arange(N_KEYS))
    out = attention(K, K, V, temperature=0.0, n_neighbors=3, exclude_self=True, working_memory=0.01)
    torch.testing.assert_close(out, expected)
    # an index array: query i excludes key exclude[i]; -1 excludes nothing
    Q = K[:10]
    exclude = torch.tensor([0, 1, 2, 3, 4, -1, -1, -1, -1, -1])
    expected, _ = reference_attention(Q, K, V, T=0.0, exclude=exclude)
    out = attention(Q, K, V, temperature=0.0, exclude_self=exclude)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[5:], V[5:10])  # not excluded: each point is its own nearest key


def test_callable_metric_phi(data):
    Q, K, V, _ = data
    W0 = torch.randn(DIM, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def phi(x):
        return torch.tanh(x @ W0)

    expected, _ = reference_attention(Q, K, V, phi, T=0.3)
    torch.testing.assert_close(attention(Q, K, V, metric=phi, temperature=0.3), expected)
    expected, _ = reference_attention(Q, K, V, phi, T=0.3, k=4)
    torch.testing.assert_close(
        attention(Q, K, V, metric=phi, temperature=0.3, n_neighbors=4), expected
    )


def test_callable_log_prior_relative_position_bias():
    # T5-style relative position bias b(j - i) as a callable prior, evaluated block by block.
    n = 40
    X = torch.randn(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    V = torch.randn(n, 2, dtype=torch.float64)

    def bias(qi, ki):
        rel = (ki - qi).to(torch.float64)
        return torch.where(rel > 0, -math.inf, -0.1 * rel.abs())  # causal mask + decay

    full = bias(torch.arange(n)[:, None], torch.arange(n)[None, :])
    s = -torch.cdist(X, X) ** 2
    expected = torch.softmax(s / 2.0 + full, 1) @ V
    out = attention(X, X, V, temperature=2.0, log_prior=bias, working_memory=0.005)
    torch.testing.assert_close(out, expected)


def test_gradients_match_reference(data):
    Q, K, V, prior = data
    for kwargs in [
        dict(n_neighbors=5),
        dict(log_prior=prior, working_memory=0.01),
        dict(log_prior=prior),
    ]:
        q1 = Q.clone().requires_grad_()
        attention(q1, K, V, temperature=2.0, **kwargs).sum().backward()
        q2 = Q.clone().requires_grad_()
        ref_kwargs = dict(k=kwargs.get("n_neighbors"), log_prior=kwargs.get("log_prior"))
        reference_attention(q2, K, V, T=2.0, **ref_kwargs)[0].sum().backward()
        torch.testing.assert_close(q1.grad, q2.grad)


def test_learned_temperature_gets_a_gradient(data):
    Q, K, V, _ = data
    T = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    attention(Q, K, V, temperature=T).sum().backward()
    T2 = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    reference_attention(Q, K, V, T=T2)[0].sum().backward()
    torch.testing.assert_close(T.grad, T2.grad)


def test_gradcheck_tiny_case():
    g = torch.Generator().manual_seed(3)
    Q = torch.randn(4, 2, dtype=torch.float64, generator=g, requires_grad=True)
    K = torch.randn(6, 2, dtype=torch.float64, generator=g, requires_grad=True)
    V = torch.randn(6, 2, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: attention(q, k, v, temperature=1.5, backend="stream"), (Q, K, V)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: attention(q, k, v, temperature=1.5, n_neighbors=3), (Q, K, V)
    )


def test_numpy_in_numpy_out_and_1d_values():
    rng = np.random.default_rng(0)
    K = rng.normal(size=(50, 3))
    out = attention(K[:5], K, np.arange(50.0), temperature=1.0)
    assert isinstance(out, np.ndarray) and out.shape == (5,) and out.dtype == np.float32
    out64 = attention(K[:5], K, np.arange(50.0), temperature=1.0, dtype="float64")
    assert out64.dtype == np.float64
    # float64 values at temperature 0 or inf (the exact selections) are averaged, and
    # returned, in float64 whatever the compute dtype; float32 values in float32
    out = attention(K[:5], K, np.arange(50.0), temperature=0)
    assert isinstance(out, np.ndarray) and out.shape == (5,) and out.dtype == np.float64
    np.testing.assert_array_equal(out, np.arange(5.0))
    out32 = attention(K[:5], K, np.arange(50.0, dtype=np.float32), temperature=0)
    assert out32.dtype == np.float32


def test_kneighbors_matches_sorted_distances():
    rng = np.random.default_rng(0)
    K = rng.normal(size=(500, 4))
    Q = rng.normal(size=(30, 4))
    d, i = kneighbors(Q, K, 6, dtype="float64", working_memory=0.01)
    full = ((Q[:, None] - K[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(i, np.argsort(full, 1)[:, :6])
    np.testing.assert_allclose(d, np.sort(full, 1)[:, :6], rtol=1e-10, atol=1e-10)
    d, i = kneighbors(K, K, 2, exclude_self=True, dtype="float64")
    assert not np.any(i[:, 0] == np.arange(500))


@pytest.mark.parametrize("scale", [1e-15, 1e15])
@pytest.mark.parametrize("temperature", [1e-3, 1.0, 1e3])
def test_stable_when_distances_are_tiny_or_huge(scale, temperature):
    rng = np.random.default_rng(0)
    K = rng.normal(size=(200, 3)) * scale
    V = rng.normal(size=(200, 2))
    out = attention(K[:20] * 1.0001, K, V, temperature=temperature)
    assert np.all(np.isfinite(out))
    if scale == 1e15:  # scores are hugely separated: exactly the nearest key's value
        np.testing.assert_allclose(out, V[:20], rtol=1e-5)
    else:  # scores are all ~0 at float32 precision: uniform weights
        np.testing.assert_allclose(out, np.broadcast_to(V.mean(0), out.shape), rtol=1e-4, atol=1e-5)


def test_fully_masked_rows_raise_or_fall_back():
    K = np.array([[0.0], [1.0]])
    Q = np.array([[0.5], [10.0]])
    V = np.array([1.0, 3.0])
    with pytest.raises(ValueError, match=r"no unmasked key within radius=1.0 \(first: \[1\]\)"):
        attention(Q, K, V, radius=1.0)
    out, w, idx = attention(
        Q, K, V, radius=1.0, temperature=np.inf, on_empty="zero", return_weights=True
    )
    np.testing.assert_allclose(out, [2.0, 0.0])
    np.testing.assert_array_equal(w[1], [0.0, 0.0])
    np.testing.assert_array_equal(idx[1], [-1, -1])
    with pytest.raises(ValueError, match="no unmasked key"):
        attention(Q, K, V, log_prior=[-np.inf, -np.inf])
    with pytest.raises(ValueError, match="no unmasked key"):
        attention(Q, K, V, n_neighbors=1, log_prior=[-np.inf, -np.inf])


@pytest.mark.parametrize("temperature", [0.7, 0.0, math.inf])
@pytest.mark.parametrize("n_neighbors", [None, 4])
@pytest.mark.parametrize("working_memory", [None, 0.01])
def test_per_point_radii_give_the_symmetric_knn_mask(
    data, temperature, n_neighbors, working_memory
):
    Q, K, V, prior = data
    rng = np.random.default_rng(1)
    query_r = torch.as_tensor(rng.uniform(1.5, 3.0, N_QUERIES))
    key_r = torch.as_tensor(rng.uniform(0.5, 3.5, N_KEYS))
    d2 = torch.cdist(Q, K) ** 2
    keep = d2 <= torch.maximum(query_r[:, None], key_r[None, :]) ** 2
    # The reference with the mask as a -inf log-prior per (query, key) pair.
    expected = []
    for i in range(N_QUERIES):
        row_prior = torch.where(keep[i], prior, -math.inf)
        out, _ = reference_attention(
            Q[i : i + 1], K, V, "sqeuclidean", temperature, n_neighbors, None, row_prior
        )
        expected.append(out)
    expected = torch.cat(expected)
    out = attention(
        Q, K, V, temperature=temperature, n_neighbors=n_neighbors, radius=(query_r, key_r),
        log_prior=prior, working_memory=working_memory,
    )
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="pair needs shapes"):
        attention(Q, K, V, radius=(query_r[:3], key_r))
    with pytest.raises(ValueError, match="radii must be >= 0"):
        attention(Q, K, V, radius=(-query_r, key_r))


def test_working_memory_config_is_honoured_and_too_small_budget_is_clear():
    K = np.random.default_rng(0).normal(size=(100, 2))
    with skattention.config_context(working_memory=1e-5):
        with pytest.raises(MemoryError, match="working_memory"):
            attention(K, K, K, n_neighbors=50)
    with pytest.raises(MemoryError, match="n_neighbors"):
        attention(K, K, K, n_neighbors=50, working_memory=1e-5)


def test_empty_queries_give_empty_output():
    K = np.ones((3, 2))
    assert attention(np.zeros((0, 2)), K, np.ones((3, 4))).shape == (0, 4)
    out, w, idx = attention(np.zeros((0, 2)), K, np.ones(3), n_neighbors=2, return_weights=True)
    assert out.shape == (0,) and w.shape == idx.shape == (0, 2)


@pytest.mark.parametrize("with_prior", [False, True])
def test_sdpa_path_is_differentiable(with_prior):
    # The SDPA path fills a preallocated key buffer when nothing needs gradients; with gradients it
    # must build it out of place (autograd cannot record out= writes), and agree with streaming.
    gen = torch.Generator().manual_seed(0)
    Q = torch.randn(40, 4, dtype=torch.float64, generator=gen)
    V = torch.randn(50, 3, dtype=torch.float64, generator=gen)
    K0 = torch.randn(50, 4, dtype=torch.float64, generator=gen)
    grads = {}
    for backend in ("sdpa", "stream"):
        K = K0.clone().requires_grad_(True)
        prior = torch.zeros(50, dtype=torch.float64, requires_grad=True) if with_prior else None
        out = attention(Q, K, V, temperature=1.0, log_prior=prior, backend=backend, device="cpu")
        (out ** 2).sum().backward()
        grads[backend] = (out.detach(), K.grad, None if prior is None else prior.grad)
    for a, b in zip(grads["sdpa"], grads["stream"]):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("metric", ["manhattan", ("minkowski", 3), ("minkowski", np.int64(2))])
def test_pairwise_metrics_in_half_precision_on_the_cpu(metric, dtype):
    # torch's CPU cdist has no half kernel (a raw NotImplementedError); NumPy's integer p was
    # refused where its float was accepted
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 3, generator=g) for n in (5, 50, 50))
    out = attention(q.to(dtype), k.to(dtype), v.to(dtype), metric=metric)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), attention(q, k, v, metric=metric), atol=2e-2,
                               rtol=0)
    _, idx = kneighbors(q.to(dtype), k.to(dtype), 3, metric=metric)
    assert idx.shape == (5, 3)


def test_a_radius_of_zero_holds_the_keys_at_distance_zero_and_numpy_bools_exclude_self():
    X, y = np.array([[0.0], [0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 5.0, 7.0])
    out = attention([[0.0], [1.0], [0.5]], X, y, radius=0.0, temperature=math.inf,
                    dtype="float64", on_empty="zero")
    np.testing.assert_array_equal(out, [2.0, 5.0, 0.0])
    np.testing.assert_array_equal(kneighbors(X, X, 2, exclude_self=np.True_)[1],
                                  kneighbors(X, X, 2, exclude_self=True)[1])


def test_values_whose_sum_overflows_are_named_as_the_cause():
    # the scores were blamed ("at this temperature"), which no temperature fixes
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 2, generator=g), torch.randn(5, 2, generator=g)
    with pytest.raises(ValueError, match="the values .* summed over the keys overflow"):
        attention(q, k, torch.full((5,), 3e38))


@pytest.mark.parametrize("call", [attention, kneighbors])
def test_progress_is_a_bool_or_an_int(call):
    args = ([[0.0]], [[1.0]], [1.0]) if call is attention else ([[0.0]], [[1.0]], 1)
    with pytest.raises(TypeError, match="progress must be a bool or an int, got 'yes'"):
        call(*args, progress="yes")
    call(*args, progress=np.True_)
    call(*args, progress=0)


def test_inputs_beyond_the_compute_dtype_are_named_as_such():
    X = np.array([[1e50, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="queries: values of magnitude 1e.50 are beyond "
                                         "float32"):
        attention(X, X, [1.0, 2.0], dtype="float32")
    with pytest.raises(ValueError, match="queries contains NaN or infinity"):
        attention(np.where(X > 1, np.inf, X), X, [1.0, 2.0], dtype="float32")


@pytest.mark.parametrize("kwargs", [
    dict(n_neighbors=2, temperature=float("inf")), dict(radius=1.0, temperature=float("inf")),
    dict(temperature=1.0), dict(temperature=0.0),
])
def test_no_queries_give_empty_outputs(kwargs):
    keys, values = np.ones((5, 3)), np.ones((5, 2))
    out = attention(np.zeros((0, 3)), keys, values, **kwargs)
    assert out.shape == (0, 2)
    out, weights, indices = attention(np.zeros((0, 3)), keys, values, return_weights=True,
                                      n_weights=2, **kwargs)
    assert out.shape == (0, 2) and weights.shape == (0, 2) and indices.shape == (0, 2)
    assert indices.dtype == np.int64
