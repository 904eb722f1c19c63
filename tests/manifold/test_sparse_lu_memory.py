"""The sparse LU of shift-invert Lanczos held to the memory: its size estimated from trial
factorisations, an explicit "arpack" refused with a clear MemoryError where it would not fit
the memory available; "auto" takes LOBPCG on k-NN operators (no LU)."""

import warnings

import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

import skattention
from skattention.manifold import AttentionDiffusionEmbedding, _eigen

from .operators import knn_operator, swiss_roll

MIB = 2**20


def cube(n, d):
    """Uniform in the unit cube of ``d`` dimensions: intrinsic dimension ``d``."""
    return np.random.default_rng(0).uniform(size=(n, d))


def lu_bytes(A):
    return _eigen._LU_ENTRY_BYTES * _eigen._sparse_lu(A).nnz


def resolve(A, k=3, eigen_solver="auto"):
    return _eigen.resolve_eigen_solver(eigen_solver, A.shape[0], k, True, A=A)


def plane_beside_cube(seed):
    """A 2-D plane of 6,000 points in 8-D with a 2,000-point 8-D cube at its corner (one
    component), rows in a random order: data whose intrinsic dimension differs between
    regions."""
    rng = np.random.default_rng(seed)
    plane = np.zeros((6000, 8))
    plane[:, :2] = rng.uniform(size=(6000, 2)) * 8.0
    X = np.r_[plane, rng.uniform(size=(2000, 8)) * 1.5]
    return X[rng.permutation(len(X))]


DATA = {
    "roll": lambda: swiss_roll(8000),
    "cube": lambda: cube(5000, 4),
    "two rolls": lambda: np.r_[swiss_roll(4000), swiss_roll(4000) + 100.0],
    # a far component of higher dimension than the largest one
    "roll and far cube": lambda: np.r_[np.c_[swiss_roll(8000), np.zeros((8000, 5))],
                                       cube(1500, 8) * 5 + 100.0],
    **{f"plane beside cube {seed}": lambda seed=seed: plane_beside_cube(seed)
       for seed in range(3)},
}


@pytest.mark.parametrize("data", DATA)
def test_the_estimate_covers_the_lu(data):
    A = knn_operator(DATA[data]()).A
    if data.startswith("plane"):
        assert connected_components(A, directed=False)[0] == 1
    actual = lu_bytes(A)
    # refined as far as it goes against the LU's own size
    estimate = _eigen._sparse_lu_estimate(A, actual)
    assert estimate >= actual
    if data in ("roll", "cube"):
        assert estimate < 12 * actual  # a prediction, not the dense bound (12 n^2 bytes)


def test_auto_takes_lobpcg_on_knn_operators_without_factorising(monkeypatch):
    factorised = []
    sparse_lu = _eigen._sparse_lu
    monkeypatch.setattr(_eigen, "_sparse_lu",
                        lambda A: factorised.append(A.shape[0]) or sparse_lu(A))
    for X in (swiss_roll(5000), cube(4000, 6)):
        assert resolve(knn_operator(X).A) == "lobpcg"
    assert factorised == []  # no trial LU either
    # a dense operator keeps arpack, and a few points the dense solver
    assert _eigen.resolve_eigen_solver("auto", 5000, 3, False) == "arpack"
    assert _eigen.resolve_eigen_solver("auto", 150, 3, True) == "dense"


def test_auto_keeps_arpack_for_many_eigenpairs_where_the_lu_fits():
    # LOBPCG's block grows with the eigenpairs wanted: beyond ten components Lanczos was faster
    roll, high_dim = knn_operator(swiss_roll(5000)).A, knn_operator(cube(4000, 6)).A
    many = _eigen._LOBPCG_AUTO_PAIRS + 1
    with skattention.config_context(working_memory=32):
        assert resolve(roll, k=many) == "arpack"
        assert resolve(high_dim, k=many) == "lobpcg"  # its LU: 50 MiB
        assert resolve(roll, k=_eigen._LOBPCG_AUTO_PAIRS) == "lobpcg"


@pytest.mark.parametrize("eigen_solver", ["auto", "lobpcg"])
def test_an_eigen_tolerance_of_zero_asks_lobpcg_for_the_rounding_s_accuracy(eigen_solver):
    # a tolerance below the rounding's residuals: LOBPCG's step emptied and it raised
    # IndexError (with "auto" since LOBPCG became its solver on k-NN operators)
    X = swiss_roll(6000)
    fit = AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver=eigen_solver, eigen_tol=0.0,
                                      random_state=0).fit(X)
    arpack = AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="arpack", eigen_tol=0.0,
                                         random_state=0).fit(X)
    np.testing.assert_allclose(fit.eigenvalues_, arpack.eigenvalues_, rtol=0, atol=1e-13)


def test_the_memory_available_bounds_auto_and_explicit_arpack(monkeypatch):
    roll = knn_operator(swiss_roll(5000)).A  # its LU: 4 MiB
    assert resolve(roll, eigen_solver="arpack") == "arpack"
    monkeypatch.setattr(_eigen, "available_memory", lambda: 2 * MIB)
    assert resolve(roll, k=_eigen._LOBPCG_AUTO_PAIRS + 1) == "lobpcg"
    with pytest.raises(MemoryError, match=r"may need up to .* MiB but only 2\.0 MiB of memory "
                                          r"is available; use eigen_solver='lobpcg'"):
        resolve(roll, eigen_solver="arpack")


@pytest.mark.parametrize("data", ["roll", "cube"])
def test_auto_and_arpack_find_the_same_eigenpairs(data):
    X = swiss_roll(6000) if data == "roll" else cube(6000, 3)
    auto = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)
    arpack = AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="arpack",
                                         random_state=0).fit(X)
    np.testing.assert_allclose(auto.eigenvalues_, arpack.eigenvalues_, rtol=0, atol=1e-12)
    for a, b in zip(auto.embedding_.T, arpack.embedding_.T, strict=True):
        assert abs(np.corrcoef(a, b)[0, 1]) > 1 - 1e-8


def test_auto_finds_the_repeated_eigenvalue_of_a_graph_of_many_components():
    # small groups of near-duplicate rows far apart: eigenvalue 1 once per component, as
    # arpack finds it
    rng = np.random.default_rng(0)
    centres = rng.uniform(size=(400, 4)) * 100.0
    X = np.repeat(centres, 16, axis=0) + rng.uniform(size=(6400, 4)) * 1e-3
    A = knn_operator(X).A
    assert connected_components(A, directed=False)[0] > 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not fully connected"
        emb = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)
        arpack = AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="arpack",
                                             random_state=0).fit(X)
    np.testing.assert_allclose(emb.eigenvalues_, 1.0, atol=1e-10)
    np.testing.assert_allclose(arpack.eigenvalues_, 1.0, atol=1e-10)
    assert np.all(np.isfinite(emb.embedding_))


def test_explicit_arpack_beyond_the_memory_available_is_refused_before_factorising(
        monkeypatch):
    X = cube(4000, 6)  # its LU: 50 MiB
    factorised = []
    sparse_lu = _eigen._sparse_lu
    monkeypatch.setattr(_eigen, "_sparse_lu",
                        lambda A: factorised.append(A.shape[0]) or sparse_lu(A))
    monkeypatch.setattr(_eigen, "available_memory", lambda: 8 * MIB)
    with pytest.raises(MemoryError) as info:
        AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="arpack",
                                    random_state=0).fit(X)
    message = str(info.value)
    assert "eigen_solver='arpack'" in message and "sparse LU" in message
    assert "8.0 MiB of memory is available" in message
    assert "eigen_solver='lobpcg'" in message
    need = float(message.split("may need up to ")[1].split(" MiB")[0])
    assert need > 8
    assert max(factorised) <= 1000  # trial balls only, never the whole graph
    factorised.clear()
    auto = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)
    assert factorised == []  # "auto" took LOBPCG: no LU
    assert np.all(np.isfinite(auto.embedding_))


def test_explicit_arpack_is_not_held_to_the_working_memory():
    A = knn_operator(cube(4000, 4)).A
    with skattention.config_context(working_memory=1):
        assert resolve(A, eigen_solver="arpack") == "arpack"


def test_lobpcg_taken_for_the_budget_finds_the_dense_solvers_eigenpairs(monkeypatch):
    # a box of five unequal sides: distinct eigenvalues, eigenvectors defined to sign
    X = cube(1500, 5) * np.array([4.0, 2.5, 1.6, 1.2, 1.0])
    used = []
    lobpcg_pairs = _eigen._lobpcg_pairs
    monkeypatch.setattr(_eigen, "_lobpcg_pairs",
                        lambda *args: used.append(args[4]) or lobpcg_pairs(*args))
    settings = dict(n_components=3, n_neighbors=15, random_state=0)
    # 1,500 points: too few for trials, the LU is bounded by the dense 27 MiB
    with skattention.config_context(working_memory=16):
        switched = AttentionDiffusionEmbedding(**settings).fit(X)
    assert used == ["lobpcg"]
    dense = AttentionDiffusionEmbedding(eigen_solver="dense", **settings).fit(X)
    lam, lam_dense = 1.0 - switched.eigenvalues_, 1.0 - dense.eigenvalues_
    assert np.all(np.diff(lam_dense) > 0.05 * lam_dense[1:])  # separated
    np.testing.assert_allclose(lam, lam_dense, rtol=1e-6)
    np.testing.assert_allclose(switched.embedding_, dense.embedding_, atol=1e-4)
