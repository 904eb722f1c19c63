"""AttentionDiffusionEmbedding's operator and eigen-solver at each size, its connectivity
warning, the Nystrom extension of its k-NN operator, and no crash from the dense Cholesky."""

import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_s_curve
from sklearn.exceptions import ConvergenceWarning
from sklearn.manifold import SpectralEmbedding

from skattention.manifold import AttentionDiffusionEmbedding

# --- the operator and eigen-solver chosen at each size (issue 36) ---


def test_auto_operator_is_dense_within_the_working_memory_and_a_knn_graph_beyond():
    import skattention

    X, _ = make_s_curve(400, random_state=0)
    dense = AttentionDiffusionEmbedding(random_state=0).fit(X)
    explicit = AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    assert dense.n_neighbors_ is None
    np.testing.assert_array_equal(dense.embedding_, explicit.embedding_)
    # 8 * 400^2 bytes = 1.2 MiB: one MiB of working memory no longer holds the dense operator
    with skattention.config_context(working_memory=1):
        knn = AttentionDiffusionEmbedding(random_state=0).fit(X)
    assert knn.n_neighbors_ == 15
    reference = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)
    np.testing.assert_allclose(knn.embedding_, reference.embedding_, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("n_neighbors", [None, "auto", 10])
def test_a_small_fit_counts_only_the_scratch_its_blocks_can_take(monkeypatch, n_neighbors):
    # the check counted the whole working memory (256 MiB) beside 100 points' 0.08 MiB
    # operator: with 200 MiB available (a small container) every such fit was refused
    from skattention.manifold import _operator

    monkeypatch.setattr(_operator, "available_memory", lambda: 200 * 2**20)
    X, _ = make_s_curve(100, random_state=0)
    assert AttentionDiffusionEmbedding(n_neighbors=n_neighbors).fit_transform(X).shape == (100, 2)


def test_explicit_dense_operator_that_cannot_fit_is_a_clear_memory_error(monkeypatch):
    from skattention.manifold import _operator

    monkeypatch.setattr(_operator, "available_memory", lambda: 2**20)
    X, _ = make_s_curve(600, random_state=0)
    with pytest.raises(MemoryError, match="dense 600 x 600 operator.*n_neighbors"):
        AttentionDiffusionEmbedding(n_neighbors=None).fit(X)
    with pytest.raises(MemoryError, match="eigen-decomposition.*eigen_solver"):
        AttentionDiffusionEmbedding(n_neighbors=10, eigen_solver="dense").fit(X)
    # the default takes the k-NN operator where the system has too little memory left
    assert AttentionDiffusionEmbedding(random_state=0).fit(X).n_neighbors_ == 15


@pytest.mark.parametrize("n_neighbors", [None, 15])
def test_lobpcg_agrees_with_shift_invert_lanczos_and_is_deterministic(n_neighbors):
    # 3,000 points: the k-NN operator's multilevel cascade has two coarser levels
    X, _ = make_s_curve(3000, random_state=0)
    settings = dict(n_components=3, n_neighbors=n_neighbors, random_state=0)
    arpack = AttentionDiffusionEmbedding(eigen_solver="arpack", **settings).fit(X)
    lobpcg = AttentionDiffusionEmbedding(eigen_solver="lobpcg", eigen_tol=1e-9, **settings).fit(X)
    np.testing.assert_allclose(1 - lobpcg.eigenvalues_, 1 - arpack.eigenvalues_, rtol=1e-6)
    np.testing.assert_allclose(lobpcg.embedding_, arpack.embedding_, atol=1e-4)
    again = AttentionDiffusionEmbedding(eigen_solver="lobpcg", eigen_tol=1e-9, **settings).fit(X)
    np.testing.assert_array_equal(again.embedding_, lobpcg.embedding_)


def test_lobpcg_that_does_not_reach_eigen_tol_warns(monkeypatch):

    from skattention.manifold import _eigen

    monkeypatch.setattr(_eigen, "_MAX_ITER", 2)
    X, _ = make_s_curve(1500, random_state=0)
    with pytest.warns(ConvergenceWarning, match="LOBPCG stopped after 2 iterations"):
        AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="lobpcg", eigen_tol=1e-12,
                                    random_state=0).fit(X)


def test_amg_agrees_with_lanczos():
    pytest.importorskip("pyamg")
    X, _ = make_s_curve(2000, random_state=0)
    settings = dict(n_components=2, n_neighbors=15, random_state=0)
    arpack = AttentionDiffusionEmbedding(eigen_solver="arpack", **settings).fit(X)
    amg = AttentionDiffusionEmbedding(eigen_solver="amg", eigen_tol=1e-9, **settings).fit(X)
    np.testing.assert_allclose(1 - amg.eigenvalues_, 1 - arpack.eigenvalues_, rtol=1e-6)
    np.testing.assert_allclose(amg.embedding_, arpack.embedding_, atol=1e-4)


def test_amg_without_pyamg_is_a_clear_import_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyamg(name, *args, **kwargs):
        if name.startswith("pyamg"):
            raise ImportError("No module named 'pyamg'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyamg)
    X, _ = make_s_curve(300, random_state=0)
    with pytest.raises(ImportError, match="pip install pyamg"):
        AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="amg").fit(X)


# --- the connectivity warning (scikit-learn's wording) ---

NOT_CONNECTED = "Graph is not fully connected, spectral embedding may not work as expected."


@pytest.mark.parametrize(
    "params",
    [dict(), dict(n_neighbors=10), dict(n_neighbors=10, eigen_solver="lobpcg")],
)
def test_disconnected_graph_warns_as_spectral_embedding_does(params):
    X, _ = make_blobs(400, centers=[[0, 0], [100, 0]], random_state=0)
    with pytest.warns(UserWarning, match=NOT_CONNECTED):
        AttentionDiffusionEmbedding(n_components=2, random_state=0, **params).fit(X)
    with pytest.warns(UserWarning, match=NOT_CONNECTED):  # the reference's own warning
        SpectralEmbedding(n_components=2, n_neighbors=10, random_state=0).fit(X)


def test_connected_graph_does_not_warn():

    X, _ = make_s_curve(400, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AttentionDiffusionEmbedding(random_state=0).fit(X)
        AttentionDiffusionEmbedding(n_neighbors=10, random_state=0).fit(X)


# --- the Nyström extension of the k-NN operator ---


@pytest.mark.filterwarnings("ignore:Graph is not fully connected")  # the outlier
@pytest.mark.parametrize("tree_dims", [0, 8])
def test_knn_transform_equals_the_engines_radius_masked_attention(monkeypatch, tree_dims):
    """The candidates (nearest training points and widest balls) hold every adjacent training
    point: the same result as attention over all training points under the radius prior,
    with an outlier among the training points (a ball wider than most queries' distances);
    the wide points adjacent to a query found by ball queries (``tree_dims`` 8) or all of them
    scored (0)."""
    import skattention
    from skattention import attention
    from skattention.manifold import _nystrom

    monkeypatch.setattr(_nystrom, "_TREE_DIMS", tree_dims)

    rng = np.random.default_rng(0)
    X, _ = make_s_curve(1500, random_state=0)
    X = np.r_[X, [[6.0, 6.0, 6.0]]]
    emb = AttentionDiffusionEmbedding(n_components=3, n_neighbors=12, random_state=0).fit(X)
    queries = np.r_[X[rng.choice(len(X), 300)] + rng.normal(scale=0.05, size=(300, 3)),
                    [[4.0, 4.0, 4.0], [30.0, 0.0, 0.0]]]
    d2, _ = skattention.kneighbors(queries, X, 12, dtype="float64")
    slack = 1 + 1e-6
    expected = attention(queries, X, emb._nystrom_values, temperature=emb.epsilon_,
                         log_prior=emb._log_prior, dtype="float64",
                         radius=(np.sqrt(d2[:, -1]) * slack, emb._radius * slack))
    np.testing.assert_allclose(emb.transform(queries), expected, rtol=1e-9, atol=1e-12)
    with skattention.config_context(working_memory=0.2):  # many small query blocks
        np.testing.assert_allclose(emb.transform(queries), expected, rtol=1e-9, atol=1e-12)


# --- no crash: the dense Cholesky never runs on OpenBLAS's threads (issues 33 and 36) ---

_CHOLESKY_CHILD = """
import numpy as np
from sklearn.datasets import make_swiss_roll
from threadpoolctl import threadpool_info

import skattention
from skattention.manifold import AttentionDiffusionEmbedding, _eigen

def blas_threads():
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

assert blas_threads() == {2}, blas_threads()
seen = []
factorise = _eigen.cho_factor

def recording(*args, **kwargs):
    seen.append(blas_threads())
    return factorise(*args, **kwargs)

_eigen.cho_factor = recording
X = make_swiss_roll(1500, noise=0.05, random_state=0)[0]
AttentionDiffusionEmbedding(n_neighbors=None, eigen_solver="arpack", random_state=0).fit(X)
assert seen == [{1}], seen
# beyond the working memory the default builds the k-NN graph: no dense factorisation at all
with skattention.config_context(working_memory=8):
    emb = AttentionDiffusionEmbedding(random_state=0).fit(X)
assert emb.n_neighbors_ == 15 and len(seen) == 1, (emb.n_neighbors_, seen)
assert blas_threads() == {2}, blas_threads()  # the limit is lifted afterwards
print("done")
"""


def test_dense_cholesky_runs_on_one_blas_thread_in_a_subprocess():
    """OpenBLAS's multithreaded Cholesky (dpotrf) kills the process with a segmentation fault
    from about 16,000 x 16,000 (the 20,000-point fit of issue 33; reproduced with SciPy's and
    NumPy's OpenBLAS without torch, benchmarks/bench_diffusion_scale.py --crash). The child
    checks the mechanism that removes it at a size that runs in seconds: the factorisation
    sees one BLAS thread though the process has two, and the default leaves the dense operator
    for the k-NN graph beyond the working memory. Its exit status says it did not crash."""
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OPENBLAS_NUM_THREADS="2")
    child = subprocess.run([sys.executable, "-c", _CHOLESKY_CHILD], capture_output=True,
                           text=True, env=env, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().endswith("done")
