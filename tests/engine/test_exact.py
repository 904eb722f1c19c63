"""Exact selection (``_engine/_exact.py``): ties, the second pass, multiplicities, ball sums."""

import numpy as np
import pytest
import torch

import skattention
from skattention import attention, kneighbors
from skattention._engine import _knn, ball_sums


def stable_nearest(Q, K, k):
    d2 = ((Q[:, None, :].astype(np.float64) - K[None].astype(np.float64)) ** 2).sum(2)
    idx = np.argsort(d2, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d2, idx, 1), idx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("n_keys", "working_memory"), [(1500, None), (1500, 0.002), (40_000, None), (40_000, 0.05)]
)
def test_many_tied_keys_go_through_the_exact_pass(dtype, working_memory, n_keys):
    # n_keys / 5 copies of each of a few points (offset far from the origin, so the fast scores
    # round): every row's k-th distance is tied with hundreds of keys, the candidates cannot
    # settle it. 40,000 keys: the second pass spans several of its wide key blocks.
    rng = np.random.default_rng(0)
    base = 1000.0 + rng.integers(0, 4, size=(5, 3)).astype(float)
    K = base[rng.integers(0, 5, n_keys)]
    Q = 1000.0 + rng.integers(-1, 5, size=(40, 3)).astype(float)
    budget = working_memory or skattention.get_config()["working_memory"]
    with skattention.config_context(working_memory=budget):
        d2, idx = kneighbors(Q, K, 7, dtype=dtype)
    ref_d2, ref_idx = stable_nearest(Q, K, 7)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_array_equal(d2, ref_d2.astype(dtype))


def test_fractional_weight_counts_fractionally_among_the_k_nearest():
    keys, values = np.array([[0.0], [1.0], [2.0]]), np.array([0.0, 1.0, 10.0])
    weight = np.array([1.5, 1.0, 1.0])
    out, w, idx = attention(
        np.array([[0.1]]), keys, values, n_neighbors=2, temperature=np.inf,
        log_prior=np.log(weight), return_weights=True, dtype="float64",
    )
    # key 0 brings 1.5 of the 2 units, key 1 the remaining 0.5, key 2 nothing
    np.testing.assert_allclose(out, [0.25])
    np.testing.assert_allclose(w, [[0.75, 0.25]])
    np.testing.assert_array_equal(idx, [[0, 1]])


def test_integer_weights_are_repeated_keys_at_every_temperature():
    rng = np.random.default_rng(1)
    K = rng.integers(0, 4, size=(30, 2)).astype(float)
    V = rng.normal(size=30)
    Q = rng.integers(0, 4, size=(20, 2)).astype(float)
    weight = rng.integers(1, 4, 30)
    for T in [0.0, 0.5, np.inf]:
        for k in [1, 4, 9]:
            weighted = attention(
                Q, K, V, n_neighbors=k, temperature=T, log_prior=np.log(weight), dtype="float64"
            )
            repeated = attention(
                Q, np.repeat(K, weight, 0), np.repeat(V, weight), n_neighbors=k, temperature=T,
                dtype="float64",
            )
            np.testing.assert_allclose(weighted, repeated, rtol=1e-12, atol=1e-12)


def test_zero_temperature_takes_the_lowest_index_of_exact_ties_whatever_the_prior():
    keys = np.array([[2.0], [-1.0], [1.0], [-1.0]])
    values = np.array([0.0, 1.0, 2.0, 3.0])
    prior = np.log([1.0, 1.0, 5.0, 9.0])  # a prior does not break a distance tie at T = 0
    out = attention(np.zeros((1, 1)), keys, values, temperature=0, log_prior=prior)
    np.testing.assert_array_equal(out, [1.0])
    masked = attention(
        np.zeros((1, 1)), keys, values, temperature=0, log_prior=[0.0, -np.inf, 0.0, 0.0]
    )
    np.testing.assert_array_equal(masked, [2.0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ball_sums_include_the_boundary(dtype):
    points = torch.tensor([[0.0, 0.0], [3.0, 4.0], [3.0, 4.0001], [6.0, 8.0]], dtype=dtype)
    counts, sums = ball_sums(points[:1], points, 5.0, points, dtype=dtype)
    assert counts.tolist() == [2]
    torch.testing.assert_close(sums, torch.tensor([[3.0, 4.0]], dtype=dtype))


@pytest.mark.parametrize("working_memory", [1, 4])
def test_the_exact_pass_keeps_its_candidates_within_the_budget(monkeypatch, working_memory):
    # Every key tied with the query's nearest: every key of a second-pass block is a
    # candidate, with its exact value, packing and merge (found in review: 8 MiB asked, about
    # 52 MiB used over a million tied keys).
    from skattention._engine import _knn

    widths, inside = [], []
    exact_pass, raw_scores = _knn._exact_pass, _knn.raw_scores

    def recording_pass(*args, **kwargs):
        inside.append(True)
        try:
            return exact_pass(*args, **kwargs)
        finally:
            inside.pop()

    def recording_scores(spec, q, rows, ks, ke, *args, **kwargs):
        if inside:
            widths.append(q.shape[0] * (ke - ks))
        return raw_scores(spec, q, rows, ks, ke, *args, **kwargs)

    monkeypatch.setattr(_knn, "_exact_pass", recording_pass)
    monkeypatch.setattr(_knn, "raw_scores", recording_scores)
    K = np.full((300_000, 1), 1000.0, dtype=np.float32)
    Q = np.full((3, 1), 1000.5, dtype=np.float32)
    d2, idx = kneighbors(Q, K, 2, working_memory=working_memory)
    np.testing.assert_array_equal(idx, [[0, 1]] * 3)
    assert widths  # the second pass ran
    assert max(widths) * _knn._CANDIDATE_BYTES <= working_memory * 2**20


@pytest.mark.parametrize("radius", [None, 1.0])
def test_selection_at_subnormal_squared_distances(radius):
    # coordinates of 1e-160 (squared distances near the subnormal range, where rounding is
    # not relative: the fast scores' margin needs its absolute part), duplicated rows, several
    # key blocks, the key tree left out: the (f, index) order of the exact f
    rng = np.random.default_rng(21)
    scale = 1e-160
    keys = rng.integers(0, 5, size=(6000, 3)) * scale
    queries = keys[:300].copy()
    kwargs = {} if radius is None else {"radius": radius * scale}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_knn, "tree_for", lambda *args: None)
        dist, idx = kneighbors(queries, keys, 5, dtype="float64", **kwargs)
    diff = queries[:, None, :] - keys[None, :, :]
    f = (diff[..., 0] ** 2 + diff[..., 1] ** 2) + diff[..., 2] ** 2
    if radius is not None:
        f = np.where(f <= (radius * scale) ** 2, f, np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(6000), f.shape), f), axis=1)[:, :5]
    best = np.take_along_axis(f, order, 1)
    np.testing.assert_array_equal(idx, np.where(np.isfinite(best), order, -1))
    np.testing.assert_array_equal(dist, best)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_counted_weights_are_the_integers_they_stand_for(dtype):
    from skattention._engine._multiplicity import counted

    w = torch.arange(1, 2**16 + 1, dtype=torch.float64)
    log_w = torch.log(w).to(dtype)
    out = counted(torch.exp(log_w), dtype)
    assert not torch.equal(torch.exp(log_w), w.to(dtype))  # exp(log w) is not always w
    torch.testing.assert_close(out, w.to(dtype), rtol=0, atol=0)
    # other weights as they are
    others = torch.tensor([0.5, 1.25, 2.0 + 1e-3, 1e-9, 0.0, 1000.5], dtype=dtype)
    torch.testing.assert_close(counted(others, dtype), others, rtol=0, atol=0)
    # half precision's units are too coarse to tell an integer (1.1 within 16 of bfloat16's)
    for half in (torch.bfloat16, torch.float16):
        coarse = torch.tensor([1.1, 2.25], dtype=half)
        torch.testing.assert_close(counted(coarse, half), coarse, rtol=0, atol=0)


@pytest.mark.parametrize("n_neighbors", [None, 5])
def test_integer_weights_vote_exactly_as_repeated_keys_in_the_uniform_limit(n_neighbors):
    # one-hot values: the weighted votes are the repeated keys' counts to the bit, ties too
    rng = np.random.default_rng(3)
    K = rng.integers(0, 3, size=(40, 2)).astype(float)
    V = np.eye(2)[rng.integers(0, 2, 40)]
    Q = rng.integers(0, 3, size=(30, 2)).astype(float) + 0.5
    w = rng.integers(1, 5, 40)
    kwargs = dict(temperature=np.inf, n_neighbors=n_neighbors,
                  radius=None if n_neighbors else 1.2, on_empty="zero", dtype="float64")
    weighted = attention(Q, K, V, log_prior=np.log(w), **kwargs)
    repeated = attention(Q, np.repeat(K, w, 0), np.repeat(V, w, 0), **kwargs)
    np.testing.assert_array_equal(weighted, repeated)
