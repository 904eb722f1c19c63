"""The engine's exact special cases (``attention``, ``kneighbors``, ``ball_counts``) against
scikit-learn's ``NearestNeighbors`` and direct formulas, on every backend and block size."""

import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors

import skattention
from skattention import attention, kneighbors
from skattention._engine import ball_counts

from ._cases import INF, kth_tie, make_data, nearest_by_index

DTYPES = ["float64", "float32"]


def knn_cases():
    out = []
    for data in ("continuous", "integer_grid", "duplicated_rows", "one_hot"):
        for dtype in DTYPES:
            out.append(pytest.param(data, dtype, id=f"{data}-{dtype}"))
    return out


@pytest.mark.parametrize("data, dtype", knn_cases())
@pytest.mark.parametrize("working_memory", [None, 0.001])
def test_kneighbors_is_nearest_neighbors(data, dtype, working_memory):
    # Distances as scikit-learn's; indices in (distance, index) order (scikit-learn's order
    # among tied neighbours is its heap's, see _cases._ByIndex), the same set where no tie
    # straddles the 4th distance.
    X, _, _, Xq = make_data(data)
    dist, sk_idx = NearestNeighbors(n_neighbors=4, algorithm="brute").fit(X).kneighbors(Xq)
    _, idx = nearest_by_index(X, Xq, 4)
    clear = ~kth_tie(X, Xq, 4)
    np.testing.assert_array_equal(np.sort(idx[clear], 1), np.sort(sk_idx[clear], 1))
    with skattention.config_context(
        working_memory=working_memory or skattention.get_config()["working_memory"]
    ):
        d2, ours = kneighbors(Xq, X, 4, dtype=dtype)
    np.testing.assert_allclose(
        np.sqrt(d2), dist, rtol=1e-5 if dtype == "float32" else 1e-10, atol=1e-6
    )
    np.testing.assert_array_equal(ours, idx)


def test_equidistant_kth_neighbour():
    # scikit-learn's test_query_equidistant_kth_nn
    points = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=float)
    _, idx = kneighbors(np.zeros((1, 2)), points, 2)
    np.testing.assert_array_equal(np.sort(idx), [[0, 1]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_knn_attention_weights_are_kneighbors(dtype):
    X, _, y, Xq = make_data("continuous")
    out, w, idx = attention(
        Xq, X, y, n_neighbors=5, temperature=INF, return_weights=True, dtype=dtype
    )
    _, ref = NearestNeighbors(n_neighbors=5).fit(X).kneighbors(Xq)
    np.testing.assert_array_equal(idx, ref)
    np.testing.assert_allclose(w, 0.2, rtol=1e-6)
    # float64 values are averaged in float64 whatever the compute dtype (averaging_dtype)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, y[ref].mean(1), rtol=1e-12, atol=0)


def radius_cases():
    out = []
    for data in ("continuous", "integer_grid", "one_hot"):
        for dtype in DTYPES:
            out.append(pytest.param(data, dtype, id=f"{data}-{dtype}"))
    return out


@pytest.mark.parametrize("data, dtype", radius_cases())
def test_ball_counts_are_radius_neighbors(data, dtype):
    X, _, _, Xq = make_data(data)
    ref = [
        len(i)
        for i in NearestNeighbors(radius=2.0).fit(X).radius_neighbors(Xq, return_distance=False)
    ]
    np.testing.assert_array_equal(ball_counts(Xq, X, 2.0, dtype=dtype), ref)


@pytest.mark.parametrize("data, dtype", radius_cases())
def test_radius_attention_averages_the_radius_neighbours(data, dtype):
    X, _, y, Xq = make_data(data)
    neighbours = NearestNeighbors(radius=2.0).fit(X).radius_neighbors(Xq, return_distance=False)
    has = np.array([len(i) > 0 for i in neighbours])
    expected = np.array([y[i].mean() for i, h in zip(neighbours, has) if h])
    out = attention(Xq[has], X, y, radius=2.0, temperature=INF, dtype=dtype)
    np.testing.assert_allclose(out, expected, rtol=1e-5 if dtype == "float32" else 1e-12)


def test_attention_radius_agrees_with_ball_counts():
    # The case: ball_counts counts a key that attention(radius=3) leaves out (the two
    # round the same squared distances differently).
    rng = np.random.default_rng(0)
    X = rng.integers(0, 10, size=(200, 2)).astype(float)
    Xq = rng.integers(0, 10, size=(100, 2)).astype(float)
    counts = ball_counts(Xq, X, 3.0, dtype="float64")
    _, w, _ = attention(
        Xq,
        X,
        np.zeros(len(X)),
        radius=3.0,
        temperature=INF,
        return_weights=True,
        on_empty="zero",
        dtype="float64",
    )
    np.testing.assert_array_equal((w > 0).sum(1), counts)


def test_zero_temperature_takes_the_first_of_tied_keys():
    keys = np.array([[-1.0], [1.0], [-5.0], [5.0]])
    out = attention(
        np.zeros((1, 1)), keys, np.array([3.0, 1.0, 2.0, 2.0]), temperature=0, dtype="float64"
    )
    np.testing.assert_array_equal(out, [3.0])


@pytest.mark.parametrize("backend", ["stream", "sdpa"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("working_memory", [None, 0.001])
def test_gaussian_attention_is_nadaraya_watson_on_every_backend(backend, dtype, working_memory):
    X, _, y, Xq = make_data("integer_grid")
    T = 1.5
    d2 = ((Xq[:, None, :] - X[None]) ** 2).sum(2)
    w = np.exp(-(d2 - d2.min(1, keepdims=True)) / T)
    expected = w @ y / w.sum(1)
    budget = working_memory or skattention.get_config()["working_memory"]
    if backend == "sdpa" and working_memory is not None:
        budget = 0.05  # the padded keys and values must fit the budget
    with skattention.config_context(working_memory=budget):
        try:
            out = attention(Xq, X, y, temperature=T, backend=backend, dtype=dtype)
        except RuntimeError as exc:  # no O(n)-memory fused kernel for this dtype on this machine
            pytest.skip(f"scaled_dot_product_attention unavailable: {exc}")
    np.testing.assert_allclose(out, expected, rtol=1e-4 if dtype == "float32" else 1e-10, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_in_dense_attention_are_repetition(dtype):
    X, _, y, Xq = make_data("duplicated_rows")
    w = np.random.default_rng(0).integers(1, 4, len(X))
    weighted = attention(Xq, X, y, temperature=0.7, log_prior=np.log(w), dtype=dtype)
    repeated = attention(Xq, np.repeat(X, w, axis=0), np.repeat(y, w), temperature=0.7, dtype=dtype)
    np.testing.assert_allclose(
        weighted, repeated, rtol=1e-12, atol=1e-6 if dtype == "float32" else 1e-14
    )
