"""The k-NN operator's pieces: the shared neighbour search, the bandwidth rule, the operator."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_swiss_roll
from sklearn.utils import check_random_state

from skattention._engine import kneighbors
from skattention.manifold._operator import (
    auto_epsilon,
    bandwidth_sample,
    diffusion_operator,
    knn_graph,
    knn_graph_and_reference,
    per_point_bandwidth,
    reference_size,
)


def plain_per_point_bandwidth(neighbor_d2, target_degree, quantile=0.9):
    """The rule as first written: every row bisected 40 times, then the quantile."""
    positive = neighbor_d2[neighbor_d2 > 0]
    target = min(max(target_degree, 1.0 + 1e-3), neighbor_d2.shape[1] - 1e-3)
    lo = np.full(len(neighbor_d2), math.log(positive.min()) - 2.0)
    hi = np.full(len(neighbor_d2), math.log(positive.max()) + 4.0)
    for _ in range(40):
        mid = (lo + hi) / 2
        enough = np.exp(-neighbor_d2 / np.exp(mid)[:, None]).sum(1) >= target
        hi, lo = np.where(enough, mid, hi), np.where(enough, lo, mid)
    return float(np.exp(np.quantile(hi, quantile)))


@pytest.mark.parametrize("seed", range(6))
def test_per_point_bandwidth_refines_only_the_rows_the_quantile_reads(seed):
    # Only the rows whose interval holds the order statistics read are bisected further; the
    # result is that of bisecting every row, to the last bit (ties and repeated rows included).
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 1500)), int(rng.integers(3, 70))
    d2 = np.sort(rng.exponential(size=(n, k)) * 10.0 ** rng.uniform(-4, 2), axis=1)
    d2[:, 0] = 0.0
    d2[rng.random(n) < 0.3] = d2[0]
    if seed % 2:
        d2 = np.round(d2, 2)
    for quantile in (0.9, 0.5, 0.0, 1.0):
        target = float(rng.uniform(1.0, k))
        assert per_point_bandwidth(d2, target, quantile) == plain_per_point_bandwidth(
            d2, target, quantile)


@pytest.mark.parametrize(("n", "k"), [(1500, 15), (5000, 15), (5000, 40), (300, 100)])
def test_shared_search_gives_the_graph_and_the_reference_neighbours(n, k):
    # The sampled points' graph rows come from the bandwidth rule's search (their first k in
    # the same exact order): the graph and the bandwidth are those of two separate searches.
    X = make_swiss_roll(n, noise=0.05, random_state=0)[0]
    sample = bandwidth_sample(n, check_random_state(0))
    n_reference = reference_size(n, k)
    knn, reference = knn_graph_and_reference(X, k, sample, n_reference, "cpu")
    separate = knn_graph(X, k, "cpu")
    np.testing.assert_array_equal(knn[0], separate[0])
    np.testing.assert_array_equal(knn[1], separate[1])
    if n_reference < k:  # (300, 100): the rule's neighbourhoods are smaller than the graph's
        assert reference is None
    else:
        d2, idx = kneighbors(X[sample], X, n_reference, dtype="float64")
        np.testing.assert_array_equal(reference[0], d2)
        np.testing.assert_array_equal(reference[1], idx)
    shared = auto_epsilon(X, knn[0], None, "cpu", sample=sample, reference=reference)
    assert shared == auto_epsilon(X, separate[0], check_random_state(0), "cpu")


def test_knn_operator_scaled_in_place_equals_the_diagonal_products():
    # The alpha and degree normalisations are applied to the stored entries in place; they
    # round as diag(s) @ K @ diag(s) does, entry for entry.
    X = make_swiss_roll(2000, noise=0.05, random_state=0)[0]
    knn = knn_graph(X, 10, "cpu")
    for alpha in (0.0, 0.5, 1.0):
        op = diffusion_operator(X, 0.5, alpha, knn, "cpu")
        d2, idx = knn
        rows = np.repeat(np.arange(len(X)), idx.shape[1])
        K = sp.csr_matrix((np.exp(-d2.ravel() / 0.5), (rows, idx.ravel())), shape=op.A.shape)
        K = K.maximum(K.T).tocsr()
        K.setdiag(1.0)
        K.eliminate_zeros()
        q = np.asarray(K.sum(1)).ravel()
        if alpha:
            scale = sp.diags(q**-alpha)
            K = scale @ K @ scale
        d = np.asarray(K.sum(1)).ravel()
        inv_sqrt = sp.diags(1.0 / np.sqrt(d))
        A = (inv_sqrt @ K @ inv_sqrt).tocsr()
        np.testing.assert_array_equal(op.degree, d)
        np.testing.assert_array_equal(op.A.indptr, A.indptr)
        np.testing.assert_array_equal(op.A.indices, A.indices)
        np.testing.assert_array_equal(op.A.data, A.data)
