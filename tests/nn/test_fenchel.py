"""The Fenchel (Gibbs) view of attention, checked with a generic convex solver (docs/theory.md,
"Attention solves a convex problem").

For scores ``s``, a temperature ``T`` and a prior ``p0 >= 0`` (zeros are masks), the attention
weights are the maximiser of ``<a, s> - T KL(a || p0)`` over the probability simplex, and the
maximum is ``T logsumexp(s / T + log p0)``. Here ``scipy.optimize.minimize`` (SLSQP, which knows
nothing about softmax) solves the problem on the support of ``p0``, and its answer is compared
with the weights :func:`skattention.attention` returns.
"""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp, xlogy

from skattention import attention
from skattention.nn import CausalMask, RelativePositionBias

# SLSQP (ftol 1e-15) finds the maximiser to about 1e-9 here; a 10% error in T moves it by 1e-3.
SOLVER_ATOL = 1e-7


def _objective(a, s, temperature, log_p0):
    """``<a, s> - T KL(a || p0)`` (``0 log 0 = 0``; ``-inf`` when ``a`` leaves p0's support)."""
    support = np.isfinite(log_p0)
    if np.any(a[~support] > 0):
        return -math.inf
    a, s, log_p0 = a[support], s[support], log_p0[support]
    return float(a @ s - temperature * (xlogy(a, a).sum() - a @ log_p0))


def _solve(s, temperature, log_p0):
    """The maximiser over the simplex by SLSQP, on the support of p0 (zero elsewhere)."""
    support = np.isfinite(log_p0)
    s_in, lp_in = s[support], log_p0[support]
    m = int(support.sum())
    a = np.zeros_like(s)
    if m == 1:
        a[support] = 1.0
        return a

    def loss(x):
        return -_objective(x, s_in, temperature, lp_in)

    def grad(x):
        return -(s_in - temperature * (np.log(np.maximum(x, 1e-300)) + 1.0 - lp_in))

    result = minimize(
        loss, np.full(m, 1.0 / m), jac=grad, method="SLSQP",
        bounds=[(1e-12, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0,
                      "jac": lambda x: np.ones_like(x)}],
        options={"ftol": 1e-15, "maxiter": 2000},
    )
    assert result.success, result.message
    a[support] = result.x
    return a


def _engine_weights(queries, keys, temperature, log_prior):
    """The engine's weights as a dense (n_queries, n_keys) array."""
    _, w, idx = attention(
        queries, keys, torch.zeros(keys.shape[0], dtype=torch.float64), metric="dot",
        temperature=temperature, log_prior=log_prior, return_weights=True, working_memory=1e-3,
    )
    dense = torch.zeros(queries.shape[0], keys.shape[0], dtype=torch.float64)
    dense.scatter_add_(1, idx.clamp(min=0), torch.where(idx >= 0, w, 0.0))
    return dense.numpy()


def _check(a_engine, s, temperature, log_p0, rng):
    value = temperature * logsumexp(s / temperature + log_p0)
    # the engine's weights attain the closed-form optimum exactly...
    assert _objective(a_engine, s, temperature, log_p0) == pytest.approx(value, abs=1e-10)
    assert np.all(a_engine[~np.isfinite(log_p0)] == 0)
    # ...and the generic solver finds the same maximiser and the same maximum
    a_solver = _solve(s, temperature, log_p0)
    np.testing.assert_allclose(a_engine, a_solver, rtol=0, atol=SOLVER_ATOL)
    assert _objective(a_solver, s, temperature, log_p0) == pytest.approx(value, abs=1e-7)
    assert _objective(a_solver, s, temperature, log_p0) <= value + 1e-10
    # no point of the simplex on the support does better
    support = np.isfinite(log_p0)
    for _ in range(20):
        a = np.zeros_like(s)
        a[support] = rng.dirichlet(np.full(int(support.sum()), 0.5))
        assert _objective(a, s, temperature, log_p0) <= value + 1e-10


@pytest.mark.parametrize("temperature", [0.1, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("seed", range(3))
def test_weights_maximise_score_minus_kl_to_the_prior(temperature, seed):
    rng = np.random.default_rng(seed)
    n_keys = 9
    queries = torch.from_numpy(rng.normal(size=(4, 3)))
    keys = torch.from_numpy(rng.normal(size=(n_keys, 3)))
    log_p0 = rng.normal(size=n_keys)  # an unnormalised prior: the maximiser does not care
    log_p0[rng.choice(n_keys, size=3, replace=False)] = -math.inf  # masked keys
    a_engine = _engine_weights(queries, keys, temperature, torch.from_numpy(log_p0))
    s = (queries @ keys.T).numpy()
    for i in range(queries.shape[0]):
        _check(a_engine[i], s[i], temperature, log_p0, rng)


@pytest.mark.parametrize("temperature", [0.3, 2.0])
def test_relative_position_bias_and_mask_are_the_prior(temperature):
    """T5's learned bias plus the causal mask, row by row, is the ``log p0`` of the problem."""
    rng = np.random.default_rng(7)
    bias = RelativePositionBias(1, num_buckets=8, max_distance=16, bidirectional=False).double()
    with torch.no_grad():
        bias.weight.copy_(torch.from_numpy(rng.normal(size=(8, 1))))
    prior = bias + CausalMask(dtype=torch.float64)
    queries = torch.from_numpy(rng.normal(size=(6, 2)))
    a_engine = _engine_weights(queries, queries, temperature, prior.as_log_prior())
    s = (queries @ queries.T).numpy()
    table = prior(6, 6)[0].detach().numpy()
    for i in range(6):
        _check(a_engine[i], s[i], temperature, table[i], rng)


def test_single_allowed_key():
    s = np.array([0.3, -2.0, 5.0])
    log_p0 = np.array([-math.inf, 0.7, -math.inf])
    queries, keys = torch.ones(1, 1, dtype=torch.float64), torch.from_numpy(s[:, None])
    a_engine = _engine_weights(queries, keys, 0.5, torch.from_numpy(log_p0))[0]
    np.testing.assert_array_equal(a_engine, [0.0, 1.0, 0.0])
    _check(a_engine, s, 0.5, log_p0, np.random.default_rng(0))
