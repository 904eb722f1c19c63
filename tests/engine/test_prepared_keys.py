"""Keys prepared once (``prepare_keys``) give the results of raw keys, in every backend."""

import numpy as np
import pytest
import torch

from skattention import attention, kneighbors
from skattention._engine import prepare_keys


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    # integer coordinates with duplicated rows: ties everywhere
    keys = rng.integers(0, 4, size=(300, 3)).astype(np.float64)
    keys[100:150] = keys[:50]
    queries = rng.integers(0, 4, size=(40, 3)).astype(np.float64)
    values = rng.normal(size=(300, 2))
    return queries, keys, values


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=2.0),
        dict(temperature=2.0, backend="sdpa"),
        dict(temperature=2.0, backend="stream"),
        dict(temperature=0.0),
        dict(temperature=np.inf, n_neighbors=5),
        dict(temperature=1.0, n_neighbors=7, radius=1.5, on_empty="zero"),
        dict(temperature=1.0, metric="dot"),
    ],
)
def test_prepared_keys_equal_raw_keys(data, dtype, kwargs):
    queries, keys, values = data
    metric = kwargs.pop("metric", "sqeuclidean")
    prepared = prepare_keys(keys, metric=metric, device="cpu", dtype=dtype)
    raw = attention(queries, keys, values, metric=metric, dtype=dtype, **kwargs)
    # twice: a prepared object is reused, never modified by a call
    for _ in range(2):
        got = attention(queries, prepared, values, metric=metric, dtype=dtype, **kwargs)
        np.testing.assert_array_equal(got, raw)


def test_prepared_keys_in_kneighbors(data):
    queries, keys, _ = data
    prepared = prepare_keys(keys, dtype="float64")
    for a, b in zip(kneighbors(queries, prepared, 6), kneighbors(queries, keys, 6, dtype="float64"),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_prepared_keys_dtype_follows_the_keys(data):
    queries, keys, values = data
    prepared = prepare_keys(torch.as_tensor(keys))
    out = attention(torch.as_tensor(queries), prepared, values)
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(metric="dot"), "metric='dot' differs"),
        (dict(dtype="float32"), "dtype='float32' differs"),
        (dict(device="meta"), "not supported|differs"),
    ],
)
def test_prepared_keys_mismatch_is_a_clear_error(data, kwargs, match):
    queries, keys, values = data
    prepared = prepare_keys(keys, dtype="float64")
    with pytest.raises(ValueError, match=match):
        attention(queries, prepared, values, **kwargs)


def test_prepare_keys_validates_once(data):
    _, keys, _ = data
    bad = keys.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="keys contains NaN"):
        prepare_keys(bad)
    with pytest.raises(ValueError, match="metric='chebyshev' is not supported"):
        prepare_keys(keys, metric="chebyshev")


def test_prepared_keys_wrong_feature_count(data):
    queries, keys, values = data
    prepared = prepare_keys(keys)
    with pytest.raises(ValueError, match="queries have 2 features but keys have 3"):
        attention(queries[:, :2], prepared, values)


@pytest.mark.parametrize("log_prior", [False, True])
def test_prepared_keys_see_values_and_prior_changed_in_place(data, log_prior):
    # prepared keys remember the per-key tensors they were called with, checked; a tensor
    # changed in place (its version counter) or another tensor is checked and used again
    queries, keys, values = data
    prepared = prepare_keys(keys, dtype="float64")
    V = torch.as_tensor(values.copy())
    prior = torch.zeros(keys.shape[0], dtype=torch.float64) if log_prior else None
    first = attention(queries, prepared, V, temperature=2.0, log_prior=prior)
    np.testing.assert_array_equal(
        first, attention(queries, keys, values, temperature=2.0, dtype="float64",
                         log_prior=None if prior is None else prior.numpy()))
    V.mul_(3.0)
    if log_prior:
        prior[:10] = -torch.inf
    second = attention(queries, prepared, V, temperature=2.0, log_prior=prior)
    expected = attention(queries, keys, V.numpy(), temperature=2.0, dtype="float64",
                         log_prior=None if prior is None else prior.numpy())
    np.testing.assert_array_equal(second, expected)
    assert not np.array_equal(first, second)
    # a NaN written in place is caught, not remembered as checked
    V[0, 0] = torch.nan
    with pytest.raises(ValueError, match="values contains NaN"):
        attention(queries, prepared, V, temperature=2.0, log_prior=prior)


def test_prepared_keys_check_numpy_values_on_every_call(data):
    queries, keys, values = data
    prepared = prepare_keys(keys, dtype="float64")
    values = values.copy()
    attention(queries, prepared, values)
    values[3, 1] = np.inf  # NumPy has no version counter: never remembered
    with pytest.raises(ValueError, match="values contains NaN or infinity"):
        attention(queries, prepared, values)


def test_prepared_keys_with_inference_mode_tensors(data):
    # inference-mode tensors have no version counter: used, never remembered
    queries, keys, values = (torch.as_tensor(a) for a in data)
    expected = attention(queries, keys, values, temperature=2.0)
    with torch.inference_mode():
        V = values.clone()
        prepared = prepare_keys(keys)
        for _ in range(2):
            torch.testing.assert_close(attention(queries, prepared, V, temperature=2.0),
                                       expected, rtol=0, atol=0)
    outside = prepare_keys(keys)
    for _ in range(2):
        torch.testing.assert_close(attention(queries, outside, V, temperature=2.0), expected,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_rows", [1, 3, 4, 5])
@pytest.mark.parametrize("with_prior", [False, True])
@pytest.mark.parametrize("vector_values", [False, True])
def test_a_few_rows_over_prepared_keys_equal_the_general_path(
        data, dtype, n_rows, with_prior, vector_values):
    """A few query tensors over prepared "euclidean" keys take attention()'s short lane (no
    spec, no planning): the same numbers as raw keys through the general path, as a tensor,
    including every row of the same queries in a larger batch."""
    queries, keys, values = data
    Q = torch.as_tensor(queries[:n_rows], dtype=dtype)
    V = torch.as_tensor(values[:, 0] if vector_values else values, dtype=dtype)
    prior = torch.as_tensor(np.log(np.arange(1, 301) / 300.0), dtype=dtype) if with_prior else None
    prepared = prepare_keys(keys, metric="euclidean", device="cpu", dtype=dtype)
    kwargs = dict(metric="euclidean", temperature=0.7, log_prior=prior)
    fast = attention(Q, prepared, V, **kwargs)
    general = attention(Q, torch.as_tensor(keys, dtype=dtype), V, **kwargs)
    assert isinstance(fast, torch.Tensor) and fast.shape == general.shape
    assert torch.equal(fast, general)
    batch = attention(torch.as_tensor(queries, dtype=dtype), prepared, V, **kwargs)
    assert torch.equal(fast, batch[:n_rows])


def test_the_short_lane_returns_an_ordinary_tensor_and_remembers_none_of_inference_mode(data):
    """The short lane computes in inference mode; what it returns, and what it remembers on
    the keys for later calls, are ordinary tensors that autograd may use (an inference
    tensor cannot be saved for a backward pass)."""
    queries, keys, values = data
    prepared = prepare_keys(keys, metric="euclidean", device="cpu", dtype="float32")
    V = torch.as_tensor(values, dtype=torch.float32)
    Q = torch.as_tensor(queries, dtype=torch.float32)
    out = attention(Q[:1], prepared, V, metric="euclidean", temperature=0.7)
    assert torch.equal(out, attention(Q, prepared, V, metric="euclidean", temperature=0.7)[:1])
    assert not out.is_inference()
    weight = torch.ones(1, requires_grad=True)
    (weight * out * out).sum().backward()  # saves `out` for the backward pass
    torch.testing.assert_close(weight.grad, (out * out).sum().reshape(1))
    remembered = [entry[3] for entry in prepared._remembered.values()]
    tensors = [t for entry in remembered for t in (entry if isinstance(entry, tuple)
                                                   else (entry,))
               if isinstance(t, torch.Tensor)]
    assert tensors and not any(t.is_inference() for t in tensors)
    # a differentiable call over the same prepared keys and values after the short lane
    Q = Q[:7].clone().requires_grad_()
    attention(Q, prepared, V, metric="euclidean", temperature=0.7).sum().backward()
    assert Q.grad is not None and bool(torch.isfinite(Q.grad).all())


def test_a_few_bad_rows_over_prepared_keys_are_reported_by_the_general_path(data):
    queries, keys, values = data
    prepared = prepare_keys(keys, metric="euclidean", device="cpu", dtype="float32")
    Q = torch.as_tensor(queries[:1], dtype=torch.float32)
    V = torch.as_tensor(values, dtype=torch.float32)
    with pytest.raises(ValueError, match="queries contains NaN"):
        attention(Q * np.nan, prepared, V, metric="euclidean", temperature=0.7)
    with pytest.raises(ValueError, match="features"):
        attention(Q[:, :2], prepared, V, metric="euclidean", temperature=0.7)
    with pytest.raises(ValueError, match="values has 299 rows"):
        attention(Q, prepared, V[1:], metric="euclidean", temperature=0.7)
    with pytest.raises(ValueError, match="dtype"):
        attention(Q, prepared, V, metric="euclidean", temperature=0.7, dtype="float64")


def test_the_short_lane_leaves_to_the_general_path_what_it_does_not_cover(data):
    """Keys that require grad, a bad on_empty, no keys, several bad arguments at once: the
    general path's result or error, as without the short lane."""
    queries, keys, values = data
    Q = torch.as_tensor(queries[:1], dtype=torch.float32)
    V = torch.as_tensor(values, dtype=torch.float32)
    K = torch.as_tensor(keys, dtype=torch.float32).requires_grad_()
    out = attention(Q, prepare_keys(K, metric="euclidean"), V, metric="euclidean",
                    temperature=0.7)
    assert out.requires_grad  # the general path's differentiable one-block softmax
    torch.testing.assert_close(out, attention(Q, K, V, metric="euclidean", temperature=0.7),
                               rtol=0, atol=0)
    prepared = prepare_keys(keys, metric="euclidean", device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="on_empty"):
        attention(Q, prepared, V, metric="euclidean", temperature=0.7, on_empty="bogus")
    with pytest.raises(ValueError, match="keys is empty"):
        attention(Q, prepare_keys(torch.zeros((0, 3)), metric="euclidean"),
                  torch.zeros((0, 2)), metric="euclidean", temperature=0.7)
    with pytest.raises(ValueError, match="queries contains NaN"):
        attention(Q * np.nan, prepared, V * np.nan, metric="euclidean", temperature=0.7)


def test_prepared_keys_remember_values_per_averaging_dtype(data):
    """The same float64 values over the same float32 keys: averaged in float64 at temperature
    inf, converted to float32 at a finite one; what the keys remember for one call is not
    handed to the other."""
    queries, keys, values = data
    prepared = prepare_keys(keys, dtype="float32")
    V = torch.as_tensor(values, dtype=torch.float64)
    Q = torch.as_tensor(queries, dtype=torch.float32)
    for _ in range(2):
        exact = attention(Q, prepared, V, n_neighbors=3, temperature=np.inf)
        soft = attention(Q, prepared, V, temperature=1.0)
        assert exact.dtype == torch.float64 and soft.dtype == torch.float32
        assert torch.equal(exact, attention(Q, keys, V, n_neighbors=3, temperature=np.inf,
                                            dtype="float32"))
        assert torch.equal(soft, attention(Q, keys, V, temperature=1.0, dtype="float32"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
def test_keys_prepared_by_chunks_of_rows_give_the_same_bits(monkeypatch, dtype, metric):
    # outside autograd the keys are centred in place in their transposed copy and their offsets
    # computed by chunks of rows: the same numbers as from one centred copy of every key
    from skattention._engine import _scores

    g = torch.Generator().manual_seed(3)
    keys = torch.randn(1001, 7, generator=g, dtype=dtype) * 5 + 2
    whole = _scores.PreparedKeys(keys, metric)
    monkeypatch.setattr(_scores, "KEY_CHUNK_ROWS", 10)
    chunked = _scores.PreparedKeys(keys, metric)
    assert torch.equal(chunked.wide_t, whole.wide_t)  # the keys, their offsets, the zeros
    centred = keys - keys.mean(0)
    assert torch.equal(chunked.keys, centred)
    assert torch.equal(chunked.key_offset, -(centred * centred).sum(1))
    # under autograd the centred keys are a tensor of the graph, as before
    grad_keys = keys.clone().requires_grad_()
    prepared = _scores.PreparedKeys(grad_keys, metric)
    assert torch.equal(prepared.key_offset.detach(), whole.key_offset)
    prepared.key_offset.sum().backward()
    assert torch.allclose(grad_keys.grad, -2 * centred + 2 * centred.mean(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "cosine", "dot"])
def test_a_block_row_does_not_depend_on_its_place_among_the_rows(dtype, metric):
    # products of some numbers of key columns round a row by its place among the rows on some
    # CPUs' kernels (MKL on AMD processors: float32 5-7 and 9-11, float64 odd ones): every key
    # block is computed over a span of whole multiples and sliced
    rng = np.random.default_rng(0)
    keys = torch.as_tensor(rng.normal(size=(263, 24)), dtype=dtype)
    queries = torch.as_tensor(rng.normal(size=(16, 24)), dtype=dtype)
    prior = torch.as_tensor(rng.normal(size=263), dtype=dtype)
    prepared = prepare_keys(keys, metric=metric)
    q = prepared.centre(prepared.map_queries(queries))
    rolled = torch.roll(q, 5, 0)
    for start, stop in [(0, 263), (0, 5), (3, 9), (3, 14), (250, 263), (100, 111), (7, 262)]:
        for kwargs in (dict(), dict(scale=0.7, log_prior=prior)):
            block = prepared.block(q, start, stop, **kwargs)
            assert block.shape == (16, stop - start)
            moved = prepared.block(rolled, start, stop, **kwargs)
            assert torch.equal(torch.roll(block, 5, 0), moved)
            assert torch.equal(block[3:4], prepared.block(q[3:4], start, stop, **kwargs))


@pytest.mark.parametrize("metric", ["dot", "cosine", "sqeuclidean", "euclidean"])
@pytest.mark.parametrize("backend", [None, "stream"])
def test_a_learned_temperature_over_prepared_keys_of_any_count(metric, backend):
    # a key count that is not a multiple of the blocks' span (prepared keys are padded)
    g = torch.Generator().manual_seed(0)
    keys, queries = torch.randn(263, 8, generator=g), torch.randn(10, 8, generator=g)
    values = torch.randn(263, 2, generator=g)
    kwargs = {} if backend is None else {"backend": backend}
    temperature = torch.tensor(0.7, requires_grad=True)
    out = attention(queries, prepare_keys(keys, metric=metric), values, metric=metric,
                    temperature=temperature, **kwargs)
    out.sum().backward()
    expected = attention(queries, keys, values, metric=metric, temperature=0.7, **kwargs)
    torch.testing.assert_close(out.detach(), expected, rtol=1e-5, atol=1e-5)
    assert temperature.grad is not None and bool(torch.isfinite(temperature.grad))
