"""``attention(..., leave_out="unit")``: one unit of a repeated key's weight left out."""

import math

import numpy as np
import pytest
import torch

from skattention import attention
from skattention._engine import prepare_keys


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("call", [dict(n_neighbors=4, temperature=0.7),
                                  dict(n_neighbors=4, temperature=math.inf),
                                  dict(n_neighbors=1, temperature=0.0), dict(temperature=0.7),
                                  dict(radius=1.5, temperature=0.7)])
def test_leaving_one_unit_out_is_leaving_one_repeated_copy_out(call, dtype):
    # integer key weights as counts of repeated keys: leaving one unit of a query's own key out
    # is leaving one copy out (exclude_self masked the whole key, and with the k-NN prior a
    # callable bias came after the units were counted: a regressor's check of sample-weight
    # equivalence failed with n_neighbors and temperature="auto")
    rng = np.random.default_rng(0)
    X = np.vstack([rng.integers(0, 3, size=(12, 2)), [[1, 1]]]).astype(float)  # ties
    y, w = rng.normal(size=13), rng.integers(0, 4, size=13)
    w[:3] = [2, 1, 3]
    queries = np.flatnonzero(w > 0)
    with np.errstate(divide="ignore"):
        weighted = attention(X[queries], X, y, log_prior=np.log(w), exclude_self=queries,
                             leave_out="unit", on_empty="zero", dtype=dtype, **call)
    copies = np.repeat(np.arange(13), w)
    first_copy = np.searchsorted(copies, queries)  # any copy: the others stay together
    repeated = attention(X[queries], X[copies], y[copies], exclude_self=first_copy,
                         on_empty="zero", dtype=dtype, **call)
    np.testing.assert_allclose(weighted, repeated, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-6 if dtype == "float32" else 1e-12)
    assert np.abs(weighted - attention(  # the whole key out differs
        X[queries], X, y, log_prior=np.log(np.maximum(w, 1e-300)), exclude_self=queries,
        on_empty="zero", dtype=dtype, **call)).max() > 1e-3


def test_leave_out_is_checked():
    with pytest.raises(ValueError, match="leave_out must be 'key' or 'unit'"):
        attention([[0.0]], [[1.0]], [1.0], leave_out="copy")
    with pytest.raises(ValueError, match="leave_out must be 'key' or 'unit'"):  # one row
        attention(torch.zeros(1, 2), prepare_keys(torch.ones(3, 2), metric="euclidean"),
                  torch.ones(3), metric="euclidean", leave_out="copy")


@pytest.mark.parametrize("n_neighbors", [None, 3])
def test_leaving_one_unit_out_differentiates_through_the_left_out_weight(n_neighbors):
    # the own key's bias log((w - 1) / w) was built from a detached prior: the gradient treated
    # its log weight as log w (0.355 against 0.776 by finite differences)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 2, dtype=torch.float64, generator=g), torch.randn(6, 2,
                                                                           dtype=torch.float64,
                                                                           generator=g)
    v = torch.randn(6, 2, dtype=torch.float64, generator=g)
    own = torch.tensor([0, 1, 2, -1])
    log_w = torch.log(torch.tensor([2.3, 3.4, 1.7, 1.0, 4.1, 2.6], dtype=torch.float64))

    def out(lw):
        return attention(q, k, v, log_prior=lw, exclude_self=own, leave_out="unit",
                         temperature=0.8, n_neighbors=n_neighbors)

    assert torch.autograd.gradcheck(out, (log_w.clone().requires_grad_(),))
