"""Bad input to the engine gets a clear error naming the problem."""

import math

import numpy as np
import pytest
import torch

from skattention import attention, kneighbors, resolve_device

K = np.random.default_rng(0).normal(size=(20, 3))
V = np.ones(20)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(queries=K[:, :2]), ValueError, "queries have 2 features but keys have 3"),
        (dict(queries=K[0]), ValueError, "queries must be 2-D"),
        (dict(queries=np.float64(1.0)), ValueError, r"queries must be 2-D, got .* shape \(\)"),
        (dict(values=np.float64(1.0)), ValueError, r"values must be 1-D or 2-D, got .* \(\)"),
        (dict(keys=K[:0]), ValueError, "keys is empty"),
        (dict(values=np.ones(5)), ValueError, "values has 5 rows but there are 20 keys"),
        (dict(queries=np.where(K > 1, np.nan, K)), ValueError, "queries contains NaN or infinity"),
        (dict(keys=np.where(K > 1, np.inf, K)), ValueError, "keys contains NaN or infinity"),
        (dict(queries=np.array([["a"] * 3])), TypeError, "queries must be numeric"),
        (dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
        (dict(temperature=float("nan")), ValueError, "temperature must be >= 0"),
        (dict(temperature="hot"), ValueError, "temperature must be a number"),
        (dict(n_neighbors=21), ValueError, "n_neighbors=21 is larger than the number of keys"),
        (dict(n_neighbors=0), ValueError, "n_neighbors must be a positive integer"),
        (dict(n_neighbors=2.5), ValueError, "n_neighbors must be a positive integer"),
        (dict(radius=-1.0), ValueError, "radius must be a number >= 0"),
        (dict(radius=1.0, metric="dot"), ValueError, "radius needs a distance metric"),
        (dict(metric="chebyshev"), ValueError, "metric='chebyshev' is not supported"),
        (dict(log_prior=np.ones(3)), ValueError, r"log_prior must have shape \(n_keys,\)"),
        (dict(log_prior=np.full(20, np.nan)), ValueError, "log_prior contains NaN"),
        (
            dict(queries=K[:5], exclude_self=True),
            ValueError,
            "exclude_self=True needs the queries to be the keys",
        ),
        (dict(exclude_self=np.full(20, 99)), ValueError, "exclude_self indices"),
        (dict(on_empty="nan"), ValueError, "on_empty must be"),
        (dict(backend="flash"), ValueError, "backend must be"),
        (dict(n_weights=3), ValueError, "pass return_weights=True"),  # (silently ignored)
        (dict(dtype="int32"), ValueError, "dtype='int32' is not supported"),
        (dict(return_weights=True, n_weights=50), ValueError, "n_weights=50 is larger"),
        (dict(working_memory=-1), ValueError, "working_memory must be a positive number"),
        (dict(device="tpu"), ValueError, "device='tpu' is not"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, error, match):
    args = dict(queries=K, keys=K, values=V)
    args.update(kwargs)
    q, k, v = args.pop("queries"), args.pop("keys"), args.pop("values")
    with pytest.raises(error, match=match):
        attention(q, k, v, **args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        attention(K, K, V, device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:1")
    assert resolve_device("auto") == torch.device("cpu")


def test_kneighbors_needs_n_neighbors():
    with pytest.raises(ValueError, match="n_neighbors must be a positive integer"):
        kneighbors(K, K, None)


def test_callable_errors_are_reported():
    with pytest.raises(ValueError, match="metric callable failed on the keys"):
        attention(K, K, V, metric=lambda x: x @ torch.ones(7, 2))
    with pytest.raises(ValueError, match="metric callable must map"):
        attention(K, K, V, metric=lambda x: x.sum())
    with pytest.raises(ValueError, match="log_prior callable returned NaN"):
        attention(K, K, V, log_prior=lambda qi, ki: torch.full((1, 1), math.nan), backend="stream")


def test_overflowing_coordinates_are_reported():
    big = K * 1e30  # squared norms overflow float32
    with pytest.raises(ValueError, match="overflow"):
        attention(big, big, V)
    out = attention(big, big, V, dtype=torch.float64)  # fine in float64
    assert np.all(np.isfinite(out))


def test_overflow_advises_float64_only_below_it():
    """Advising dtype=torch.float64 to a computation in float64 sent its user in circles."""
    with pytest.raises(ValueError, match=r"\(float32\) once squared; .*dtype=torch.float64"):
        attention(K * 1e30, K * 1e30, V)
    with pytest.raises(ValueError, match=r"\(float64\) once squared; rescale the data\.$"):
        attention(K * 1e160, K * 1e160, V, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\(float64\) at this temperature; rescale the data "
                                         r"or raise the temperature\.$"):
        attention(K, K, V, temperature=1e-320, dtype=torch.float64)


@pytest.mark.parametrize("scalar", [np.float32, np.float64, np.int64, float])
def test_temperatures_accept_numpy_scalars_everywhere(scalar):
    from skattention._engine import ball_counts, gaussian_kernel, gaussian_kernel_log_sums
    from skattention.cluster import AttentionKMeans

    T = scalar(2)
    X = K[:, :2]
    expected = np.exp(-((X[:, None] - X[None]) ** 2).sum(-1) / 2.0)
    np.testing.assert_allclose(gaussian_kernel(X, X, T, dtype="float64"), expected, rtol=1e-12)
    np.testing.assert_allclose(
        gaussian_kernel_log_sums(X, X, T, dtype="float64"), np.log(expected.sum(1)), rtol=1e-12
    )
    assert ball_counts(X, X, scalar(1)).shape == (20,)
    out = attention(K, K, V, temperature=T)
    np.testing.assert_allclose(out, attention(K, K, V, temperature=2.0))
    km = AttentionKMeans(2, random_state=0, device="cpu").fit(X)
    np.testing.assert_allclose(km.soft_assignments(X, temperature=T), km.soft_assignments(X, 2.0))


def test_a_zero_dimensional_array_is_a_temperature():
    # (np.asarray(2.0), a value read back from a saved array: it was refused)
    np.testing.assert_array_equal(attention(K, K, V, temperature=np.array(2.0)),
                                  attention(K, K, V, temperature=2.0))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), True, "hot"])
def test_kernel_temperatures_must_be_positive_and_finite(bad):
    from skattention._engine import gaussian_kernel_log_sums

    with pytest.raises(ValueError, match="temperature must be a positive finite number"):
        gaussian_kernel_log_sums(K, K, bad)
