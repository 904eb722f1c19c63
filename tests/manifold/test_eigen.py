"""The LOBPCG solver of large k-NN operators and its multigrid preconditioner."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils import check_random_state

from skattention.manifold import AttentionDiffusionEmbedding, _eigen
from skattention.manifold._multigrid import laplacian_multigrid

from .operators import knn_operator, swiss_roll


def laplacian_and_null_vector(op):
    n = op.A.shape[0]
    top = np.sqrt(op.degree)
    return (sp.identity(n, format="csr") - op.A).tocsr(), top / np.linalg.norm(top)


def solve(op, k=3, eigen_tol="auto"):
    """``top_eigenpairs`` by LOBPCG, and the number of its iterations."""
    count = []
    mu, v = _eigen.top_eigenpairs(
        op.A, k, "lobpcg", "cpu", check_random_state(0), sqrt_degree=np.sqrt(op.degree),
        eigen_tol=eigen_tol, on_solve=lambda: count.append(1),
    )
    return mu, v, len(count)


def test_multigrid_is_a_symmetric_positive_approximate_inverse_of_the_laplacian():
    op = knn_operator(swiss_roll(6000))
    L, top = laplacian_and_null_vector(op)
    M = laplacian_multigrid(L, top, check_random_state(0))
    assert len(M.levels) >= 2  # 6,000 nodes -> ... -> at most 600
    rng = np.random.default_rng(0)
    X = rng.standard_normal((L.shape[0], 2))
    X -= top[:, None] * (top @ X)[None, :]
    MX = M(X)
    np.testing.assert_allclose(X[:, 0] @ MX[:, 1], X[:, 1] @ MX[:, 0], rtol=1e-9)
    assert np.all(np.einsum("ij,ij->j", X, MX) > 0)
    # M approximates the pseudo-inverse on the whole spectrum: L's Rayleigh quotients range
    # from about 1e-4 (the smoothest eigenvector) to about 1 (noise), those of M L stay O(1)
    mu, V = _eigen.top_eigenpairs(op.A.copy(), 2, "arpack", "cpu", check_random_state(0))
    smooth = V[:, 1]
    lam = 1.0 - mu[1]
    assert lam < 1e-3
    assert 0.3 < lam * (smooth @ M(smooth[:, None])[:, 0]) < 1.5
    for x in X.T:
        assert 0.1 < (x @ M(L @ x[:, None])[:, 0]) / (x @ x) < 1.5


@pytest.mark.parametrize("n", [3000, 12000])
def test_lobpcg_reaches_the_relative_tolerance_in_a_bounded_number_of_iterations(n):
    op = knn_operator(swiss_roll(n))
    L, _ = laplacian_and_null_vector(op)
    mu, v, iterations = solve(op)
    # "auto": each residual norm at most 1e-5 of its eigenvalue of L, whatever n (the
    # eigenvalues shrink with n; a fixed residual norm would mean less and less)
    lam = 1.0 - mu[1:]
    residual = np.linalg.norm(L @ v[:, 1:] - v[:, 1:] * lam, axis=0)
    assert np.all(residual <= _eigen._RELATIVE_TOL * lam)
    # without the preconditioner LOBPCG needs 10 to 20 times as many on these operators
    assert iterations <= 40
    reference, _ = _eigen.top_eigenpairs(op.A.copy(), 3, "arpack", "cpu", check_random_state(0))
    np.testing.assert_allclose(lam, 1.0 - reference[1:], rtol=1e-8)


def test_fixed_eigen_tol_bounds_the_residual_norm():
    op = knn_operator(swiss_roll(3000))
    L, _ = laplacian_and_null_vector(op)
    for tol in (1e-4, 1e-10):
        mu, v, _ = solve(op, eigen_tol=tol)
        residual = np.linalg.norm(L @ v[:, 1:] - v[:, 1:] * (1.0 - mu[1:]), axis=0)
        assert residual.max() <= tol


@pytest.mark.filterwarnings("ignore:Graph is not fully connected")
def test_disconnected_graph_with_a_multigrid_hierarchy_separates_its_parts():
    # two far-apart swiss rolls of 1,500 points: the aggregation coarsens each part apart
    X = np.r_[swiss_roll(1500), swiss_roll(1500) + 100.0]
    emb = AttentionDiffusionEmbedding(n_components=1, n_neighbors=15, eigen_solver="lobpcg",
                                      random_state=0)
    with pytest.warns(UserWarning, match="Graph is not fully connected"):
        emb.fit(X)
    assert emb.eigenvalues_[0] > 1 - 1e-10
    first, second = np.sign(emb.embedding_[:1500, 0]), np.sign(emb.embedding_[1500:, 0])
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]
