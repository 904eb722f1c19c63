"""The sparse LU of shift-invert Lanczos held to the memory: its size estimated from trial
factorisations, "auto" taking LOBPCG where it would not fit the working memory, an explicit
"arpack" refused with a clear MemoryError where it would not fit the memory available."""

import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components
from sklearn.utils import check_random_state

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


def test_auto_keeps_arpack_on_a_manifold_and_takes_lobpcg_on_high_dimensional_data():
    roll, high_dim = knn_operator(swiss_roll(5000)).A, knn_operator(cube(4000, 6)).A
    with skattention.config_context(working_memory=32):
        assert resolve(roll) == "arpack"
        assert resolve(high_dim) == "lobpcg"
        # an explicit "arpack" is held to the memory available, not the working memory
        assert resolve(high_dim, eigen_solver="arpack") == "arpack"
    # both decisions were right: the 2-D roll's LU is 4 MiB, the 6-D cube's 50 MiB
    assert lu_bytes(roll) <= 32 * MIB < lu_bytes(high_dim)
    with skattention.config_context(working_memory=256):
        assert resolve(high_dim) == "arpack"


def test_the_memory_available_bounds_auto_and_explicit_arpack(monkeypatch):
    roll = knn_operator(swiss_roll(5000)).A  # its LU: 4 MiB
    assert resolve(roll) == "arpack" == resolve(roll, eigen_solver="arpack")
    monkeypatch.setattr(_eigen, "available_memory", lambda: 2 * MIB)
    assert resolve(roll) == "lobpcg"
    with pytest.raises(MemoryError, match=r"may need up to .* MiB but only 2\.0 MiB of memory "
                                          r"is available; use eigen_solver='lobpcg'"):
        resolve(roll, eigen_solver="arpack")


def test_swiss_roll_keeps_arpack_and_its_results(monkeypatch):
    X = swiss_roll(6000)
    A = knn_operator(X).A
    # the trial factorisations draw nothing from the random state: "auto" is the arpack path
    mu, v = _eigen.top_eigenpairs(A.copy(), 3, "auto", "cpu", check_random_state(0))
    tol = 0.0
    expected = _eigen._shift_invert(A.copy(), 3, tol, check_random_state(0), False, None)
    order = np.argsort(-expected[0], kind="stable")
    np.testing.assert_array_equal(mu, expected[0][order])
    np.testing.assert_array_equal(v, expected[1][:, order])
    calls = []
    shift_invert = _eigen._shift_invert
    monkeypatch.setattr(_eigen, "_shift_invert",
                        lambda *args: calls.append(1) or shift_invert(*args))
    auto = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)
    assert calls == [1]
    arpack = AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="arpack",
                                         random_state=0).fit(X)
    np.testing.assert_array_equal(auto.embedding_, arpack.embedding_)


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
    assert max(factorised) <= 1000  # "auto" took LOBPCG after the same trials
    assert np.all(np.isfinite(auto.embedding_))


def test_explicit_arpack_is_not_held_to_the_working_memory():
    A = knn_operator(cube(4000, 4)).A
    with skattention.config_context(working_memory=1):
        assert resolve(A) == "lobpcg"
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
