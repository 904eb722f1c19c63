"""Dense attention over several key blocks by shifted logits (``OnlineSoftmax.add_shifted``):
after a row's first key block, one product gives a block's logits less the row's running shift.
A row whose later keys score far above its first block's (beyond exp's range) is redone the
plain way; a row whose sums grow large folds them into its shift. Each row depends on its own
data only."""

import numpy as np
import pytest
import torch

from skattention import attention
from skattention._engine import _softmax, _stream

from .reference import reference_attention


def _keys_in_groups():
    """The first key block (1,024 keys) near x=0, then keys near x=10 and x=40: a query at
    x=40 scores its later keys 1,600 / T above its first block's (beyond exp's range in float32
    and float64), one at x=6.5 about 30 / T above (a large sum, no overflow)."""
    rng = np.random.default_rng(0)
    centres = np.repeat([0.0, 10.0, 40.0], [1024, 8000, 8000])
    K = np.column_stack([centres, np.zeros_like(centres)]) + rng.normal(0, 0.05, (centres.size, 2))
    Q = np.array([[1.0, 0.0], [6.5, 0.1], [10.0, 0.0], [40.0, -0.1], [20.0, 0.0], [0.0, 0.0]])
    V = rng.normal(size=(centres.size, 3))
    prior = rng.normal(0, 0.5, centres.size)
    return Q, K, V, prior


@pytest.fixture
def plain_updates(monkeypatch):
    """Row counts of the plain (max-shifting) updates of OnlineSoftmax."""
    seen = []
    original = _softmax.OnlineSoftmax.update

    def counting(self, z, v, inplace):
        seen.append(z.shape[0])
        return original(self, z, v, inplace)

    monkeypatch.setattr(_softmax.OnlineSoftmax, "update", counting)
    return seen


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-10), ("float32", 2e-5)])
@pytest.mark.parametrize("with_prior", [False, True])
def test_shifted_blocks_match_the_reference_and_do_not_depend_on_the_batch(
    dtype, tol, with_prior, plain_updates
):
    Q, K, V, prior = _keys_in_groups()
    prior = prior if with_prior else None
    expected, _ = reference_attention(Q, K, V, "sqeuclidean", 1.0, log_prior=prior)
    kw = dict(temperature=1.0, log_prior=prior, backend="stream", dtype=dtype)
    out = attention(Q, K, V, **kw)
    np.testing.assert_allclose(out, expected.numpy(), rtol=tol, atol=tol)
    # the first key block plainly (all rows), then the overflowing rows redone plainly: the
    # query at x=40 (and in float32 the one at x=10) on the blocks near x=40 (and x=10)
    assert plain_updates[0] == len(Q) and min(plain_updates) < len(Q)
    for i in range(len(Q)):
        np.testing.assert_array_equal(attention(Q[i : i + 1], K, V, **kw)[0], out[i])
    np.testing.assert_array_equal(attention(Q[::-1].copy(), K, V, **kw), out[::-1])


def test_self_exclusion_on_shifted_blocks():
    Q, K, V, prior = _keys_in_groups()
    Q = K[[3, 2000, 12000, 16999]]
    exclude = np.array([3, 2000, 12000, 16999])
    expected, _ = reference_attention(Q, K, V, "sqeuclidean", 0.5, log_prior=prior,
                                      exclude=torch.as_tensor(exclude))
    out = attention(Q, K, V, temperature=0.5, log_prior=prior, exclude_self=exclude,
                    backend="stream", dtype="float64")
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-10, atol=1e-10)


def test_auto_takes_the_shifted_stream_in_float64_on_the_cpu_over_many_keys(monkeypatch):
    Q, K, V, prior = _keys_in_groups()
    calls = []
    original = _stream.shifted_logit_keys
    monkeypatch.setattr(_stream, "shifted_logit_keys",
                        lambda *a: calls.append(1) or original(*a))
    a = attention(Q, K, V, temperature=2.0, log_prior=prior, dtype="float64")
    assert calls  # not SDPA
    b = attention(Q, K, V, temperature=2.0, log_prior=prior, dtype="float64", backend="sdpa")
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype, gap, value", [("float32", 82.0, 1e4), ("float64", 700.0, 1e6)])
def test_weights_just_below_exp_overflow_times_large_values_stay_finite(dtype, gap, value):
    # a later key scores `gap` above the first block's best: exp stays finite but exp * value
    # would overflow; such a row is redone with its new maximum (found in review)
    rng = np.random.default_rng(0)
    n = 17024
    K = np.zeros((n, 2))
    K[:1024, 0] = rng.normal(0, 0.01, 1024)
    K[1024:, 0] = -50.0 + rng.normal(0, 0.01, n - 1024)
    x = np.sqrt(gap) + 10.0  # the first block ~x^2 away, the key at 5000 closer by gap
    K[5000, 0] = x - np.sqrt(x * x - gap)
    V = np.full((n, 1), value)
    out = attention(np.array([[x, 0.0]]), K, V, temperature=1.0, backend="stream", dtype=dtype)
    np.testing.assert_allclose(out, [[value]], rtol=1e-5)
