"""AttentionKMeans: exactness against Lloyd's k-means, annealing, weights, interfaces, errors,
sparse input, progress."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.base import clone
from sklearn.cluster import KMeans, kmeans_plusplus
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

import skattention
from skattention.cluster import AttentionKMeans


@pytest.fixture(scope="module")
def blobs():
    return make_blobs(n_samples=600, centers=5, cluster_std=1.5, random_state=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_zero_is_lloyd(blobs, seed):
    X, _ = blobs
    init, _ = kmeans_plusplus(X, 6, random_state=seed)
    ours = AttentionKMeans(6, temperature=0, init=init, n_init=1, device="cpu").fit(X)
    ref = KMeans(6, init=init, n_init=1, algorithm="lloyd").fit(X)
    assert adjusted_rand_score(ours.labels_, ref.labels_) == 1.0
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-6)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    assert ours.n_iter_ == ref.n_iter_


def test_temperature_zero_same_seed_as_kmeans(blobs):
    X, _ = blobs
    for seed in range(3):
        ours = AttentionKMeans(5, temperature=0, random_state=seed, device="cpu").fit(X)
        ref = KMeans(5, random_state=seed, algorithm="lloyd").fit(X)
        np.testing.assert_array_equal(ours.labels_, ref.labels_)
        np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-6)


def test_lloyd_relocates_empty_clusters_like_kmeans():
    X = np.array([[0.0, 0], [0.1, 0], [0, 0.1], [5, 5], [5.1, 5], [9, 9]])
    init = np.array([[0.0, 0], [100, 100], [5, 5]])  # the second centre gets no point
    ours = AttentionKMeans(3, temperature=0, init=init, device="cpu").fit(X)
    ref = KMeans(3, init=init, n_init=1).fit(X)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, atol=1e-12)


def test_float32_stays_float32(blobs):
    X = blobs[0].astype(np.float32)
    km = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    assert km.cluster_centers_.dtype == np.float32
    assert km.transform(X).shape == (X.shape[0], 3)


@pytest.mark.parametrize("temperature", ["auto", 0, 1.0])
def test_float32_queries_to_a_float64_model_compute_in_float64(blobs, temperature):
    """As KMeans: a model fitted on float64 keeps its centroids exact for float32 queries and
    gives float64 distances (they were rounded to float32)."""
    X = blobs[0]
    km = AttentionKMeans(3, temperature=temperature, random_state=0, device="cpu").fit(X)
    X32 = X[:50].astype(np.float32)
    as64 = X32.astype(np.float64)
    distances = km.transform(X32)
    assert distances.dtype == KMeans(3, n_init=1).fit(X).transform(X32).dtype == np.float64
    np.testing.assert_array_equal(distances, km.transform(as64))
    np.testing.assert_array_equal(km.predict(X32), km.predict(as64))
    np.testing.assert_array_equal(km.predict_proba(X32), km.predict_proba(as64))
    assert km.score(X32) == km.score(as64)


def test_annealing_finds_the_blobs_whatever_the_seed():
    # 8 blobs where k-means++ with one init often merges two of them
    X, y = make_blobs(n_samples=4000, n_features=10, centers=8, cluster_std=2.0, random_state=0)
    aris, inertias = [], []
    for seed in range(4):
        km = AttentionKMeans(8, random_state=seed, device="cpu").fit(X)
        aris.append(adjusted_rand_score(y, km.labels_))
        inertias.append(km.inertia_)
        ref = KMeans(8, random_state=seed, algorithm="lloyd").fit(X)
        assert km.inertia_ <= ref.inertia_ * (1 + 1e-9)
    assert min(aris) > 0.99
    assert np.ptp(inertias) <= 1e-6 * inertias[0]


def test_annealing_ends_at_a_lloyd_fixed_point(blobs):
    X, _ = blobs
    km = AttentionKMeans(5, tol=0, random_state=0, device="cpu").fit(X)
    again = AttentionKMeans(5, temperature=0, tol=0, init=km.cluster_centers_, device="cpu").fit(X)
    np.testing.assert_array_equal(again.labels_, km.labels_)
    np.testing.assert_allclose(again.cluster_centers_, km.cluster_centers_, atol=1e-10)
    assert km.inertia_ == pytest.approx(-km.score(X))


def test_fixed_temperature_is_soft_kmeans(blobs):
    X, _ = blobs
    km = AttentionKMeans(5, temperature=4.0, tol=1e-12, random_state=0, device="cpu").fit(X)
    # fixed point: centres are the responsibility-weighted means at that temperature
    R = km.soft_assignments(X)
    np.testing.assert_allclose(R.sum(1), 1.0)
    centres = (R.T @ X) / R.sum(0)[:, None]
    np.testing.assert_allclose(centres, km.cluster_centers_, atol=1e-4)
    assert km.temperature_ == 4.0
    np.testing.assert_array_equal(km.predict(X), R.argmax(1))


def test_interfaces(blobs):
    X, _ = blobs
    km = AttentionKMeans(4, random_state=0, device="cpu").fit(X)
    D = km.transform(X)
    expected = np.sqrt(((X[:, None, :] - km.cluster_centers_[None]) ** 2).sum(2))
    np.testing.assert_allclose(D, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(km.predict(X), D.argmin(1))
    np.testing.assert_array_equal(km.labels_, km.predict(X))
    assert km.score(X) == pytest.approx(-(D.min(1) ** 2).sum())
    assert km.inertia_ == pytest.approx(-km.score(X))
    proba = km.predict_proba(X)
    assert proba.shape == (X.shape[0], 4)
    np.testing.assert_allclose(proba.sum(1), 1.0)
    np.testing.assert_array_equal(proba.argmax(1), km.labels_)
    np.testing.assert_array_equal(km.soft_assignments(X, temperature=0), np.eye(4)[km.labels_])
    np.testing.assert_array_equal(clone(km).fit_predict(X), km.labels_)
    assert list(km.get_feature_names_out()) == [f"attentionkmeans{i}" for i in range(4)]
    loaded = pickle.loads(pickle.dumps(km))
    np.testing.assert_array_equal(loaded.predict(X), km.predict(X))
    assert isinstance(loaded.cluster_centers_, np.ndarray)


@pytest.mark.parametrize("temperature", [0, "auto"])
def test_responsibilities_are_over_the_fitted_centroids_after_set_params(blobs, temperature):
    X, _ = blobs
    km = AttentionKMeans(3, temperature=temperature, random_state=0, device="cpu").fit(X)
    km.set_params(n_clusters=5)  # not refitted: the model still has its 3 centroids
    proba = km.predict_proba(X[:20])
    assert proba.shape == (20, 3)
    np.testing.assert_array_equal(proba.argmax(1), km.predict(X[:20]))

@pytest.mark.parametrize("temperature", [0, "auto"])
def test_sample_weight_equals_repetition(blobs, temperature):
    X, _ = blobs
    X = X[:200]
    rng = np.random.RandomState(0)
    w = rng.randint(0, 4, size=X.shape[0])
    init = X[w > 0][:5]
    weighted = AttentionKMeans(5, temperature=temperature, init=init, random_state=0, device="cpu")
    weighted.fit(X, sample_weight=w)
    repeated = AttentionKMeans(5, temperature=temperature, init=init, random_state=0, device="cpu")
    repeated.fit(np.repeat(X, w, axis=0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, atol=1e-8)
    assert weighted.inertia_ == pytest.approx(repeated.inertia_)


def test_memory_is_bounded_by_working_memory():
    # a tiny budget forces many blocks; the result must not change
    X, _ = make_blobs(n_samples=3000, centers=3, random_state=1)
    ref = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    with skattention.config_context(working_memory=0.05):
        small = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    np.testing.assert_array_equal(small.labels_, ref.labels_)
    np.testing.assert_allclose(small.cluster_centers_, ref.cluster_centers_, atol=1e-8)


def test_errors(blobs):
    X, _ = blobs
    with pytest.raises(ValueError, match="n_samples=3 should be >= n_clusters=4"):
        AttentionKMeans(4).fit(X[:3])
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        AttentionKMeans(2).fit(Xn)
    with pytest.raises(ValueError, match="0 sample"):
        AttentionKMeans(2).fit(np.empty((0, 2)))
    with pytest.raises(ValueError, match="shape of the initial centers"):
        AttentionKMeans(3, init=X[:2]).fit(X)
    with pytest.raises(ValueError, match="non-zero"):
        AttentionKMeans(2).fit(X, sample_weight=np.zeros(X.shape[0]))
    with pytest.raises(ValueError, match="temperature"):
        AttentionKMeans(2, temperature=-1.0).fit(X)
    with pytest.raises(ValueError, match="metric"):
        AttentionKMeans(2, metric="cosine").fit(X)
    km = AttentionKMeans(2, random_state=0, device="cpu").fit(X)
    with pytest.raises(ValueError, match="features"):
        km.predict(X[:, :1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_gpu_is_a_clear_error(blobs):
    with pytest.raises(ValueError, match="CUDA is not available"):
        AttentionKMeans(2, device="cuda").fit(blobs[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_matches_cpu(blobs):
    X, _ = blobs
    init, _ = kmeans_plusplus(X, 5, random_state=0)
    cpu = AttentionKMeans(5, temperature=0, init=init, device="cpu").fit(X)
    gpu = AttentionKMeans(5, temperature=0, init=init, device="cuda").fit(X)
    np.testing.assert_array_equal(cpu.labels_, gpu.labels_)
    assert isinstance(gpu.cluster_centers_, np.ndarray)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_labels_of_points_near_a_boundary_do_not_depend_on_the_batch(dtype):
    # Points a hair from the bisector of two centres: their labels turn on the last bits of
    # the distances, which the product rounded otherwise for one or two rows than for a block
    # of them (20 of 3,000 float32 single-row predictions differed from the batch's).
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(600, 6)) * 3 + 50).astype(dtype)
    km = AttentionKMeans(8, random_state=0).fit(X)
    C = km.cluster_centers_.astype(np.float64)
    normal, middle = C[1] - C[0], (C[0] + C[1]) / 2
    P = C[0] + rng.uniform(0.45, 0.55, size=(1500, 1)) * normal
    P += rng.normal(size=P.shape) * 1e-3
    P -= ((P - middle) @ normal / (normal @ normal))[:, None] * normal
    P = (P + rng.normal(size=(1500, 1)) * 1e-6 * normal).astype(dtype)
    whole = km.predict(P)
    assert 0 < np.mean(whole == whole[0]) < 1  # both sides of the boundary
    singles = np.array([km.predict(P[i : i + 1])[0] for i in range(len(P))])
    np.testing.assert_array_equal(singles, whole)
    pairs = np.concatenate([km.predict(P[i : i + 2]) for i in range(0, len(P), 2)])
    np.testing.assert_array_equal(pairs, whole)


# ----------------------------------------------------------------------------- sparse input

FITTED = ("cluster_centers_", "labels_", "inertia_", "n_iter_", "temperature_")


def sparse_blobs(dtype, n=600, d=12):
    """Blobs with 60% of the entries zeroed: what one-hot and count data look like."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d)) * 2 + rng.integers(0, 4, size=(n, 1)) * 3
    X[rng.random(X.shape) < 0.6] = 0
    return X.astype(dtype)


def assert_same_model(dense, sparse_fit, X, Xs, exact=True):
    compare = np.testing.assert_array_equal if exact else np.testing.assert_allclose
    for name in FITTED:
        compare(getattr(sparse_fit, name), getattr(dense, name))
    for method in ("predict", "transform", "predict_proba", "score"):
        compare(getattr(sparse_fit, method)(Xs), getattr(dense, method)(X))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("settings", [
    dict(temperature=0),
    dict(temperature=0, init="random", n_init=3),
    dict(temperature=1.5, n_init=2),
    dict(temperature="auto"),
    dict(temperature=0.5, init="random", n_init=2, tol=0, max_iter=20),
], ids=["lloyd", "lloyd-random-3", "soft-2", "anneal", "soft-random-tol0"])
def test_csr_input_equals_the_dense_array(dtype, settings):
    # The same model bit for bit: block-wise column moments in NumPy's order, the same
    # k-means++ draws and rows, the mean subtracted from each densified block.
    X = sparse_blobs(dtype, n=300)
    w = np.random.default_rng(1).integers(0, 3, size=X.shape[0]).astype(dtype)
    for weights in (None, w):
        dense = AttentionKMeans(4, random_state=0, **settings).fit(X, sample_weight=weights)
        Xs = sp.csr_matrix(X)
        model = AttentionKMeans(4, random_state=0, **settings).fit(Xs, sample_weight=weights)
        assert model.cluster_centers_.dtype == dtype
        assert_same_model(dense, model, X, Xs)
        np.testing.assert_array_equal(
            AttentionKMeans(4, random_state=0, **settings).fit_predict(
                sp.csc_matrix(X), sample_weight=weights
            ),
            dense.labels_,
        )
    np.testing.assert_array_equal(model.fit_transform(Xs), dense.fit_transform(X))


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "bsr", "dia"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_every_sparse_format_and_index_width(fmt, index_dtype):
    # what scikit-learn's check_estimator_sparse_* would run (it stops at predict_proba, which
    # it expects of classifiers only; see tests/test_common.py)
    X = sparse_blobs(np.float64, n=80, d=5)
    Xs = sp.csr_matrix(X).asformat(fmt)
    if fmt in ("csr", "csc", "coo"):
        for name in ("indices", "indptr", "row", "col"):
            if hasattr(Xs, name):
                setattr(Xs, name, getattr(Xs, name).astype(index_dtype))
    dense = AttentionKMeans(3, temperature=0, random_state=0).fit(X)
    model = AttentionKMeans(3, temperature=0, random_state=0).fit(Xs)
    assert_same_model(dense, model, X, Xs)
    assert model.predict_proba(Xs).shape == (80, 3)


@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=1.0),
                                      dict(temperature="auto")], ids=["lloyd", "soft", "anneal"])
def test_sparse_input_is_densified_only_in_budget_sized_blocks(monkeypatch, settings):
    # Every dense block made from the sparse matrix (by the engine's row blocks or SciPy's
    # toarray) is recorded: none may exceed the working-memory budget, and the matrix is never
    # dense whole.
    from skattention._engine._rows import RowBlocks

    largest = []
    densified, toarray = RowBlocks._densified, sp.csr_matrix.toarray

    def record(block):
        largest.append(block.shape[0] * block.shape[1] * block.dtype.itemsize)
        return block

    monkeypatch.setattr(RowBlocks, "_densified", lambda self, *a: record(densified(self, *a)))
    monkeypatch.setattr(sp.csr_matrix, "toarray", lambda self, *a, **k: record(
        toarray(self, *a, **k)))
    X = sparse_blobs(np.float64, n=1200, d=20)
    budget_mib = 0.05
    with skattention.config_context(working_memory=budget_mib):
        model = AttentionKMeans(3, random_state=0, **settings).fit(sp.csr_matrix(X))
        for method in ("predict", "transform", "predict_proba", "score"):
            getattr(model, method)(sp.csr_matrix(X))
    assert len(largest) > 10  # many blocks
    assert max(largest) <= budget_mib * 2**20 < X.nbytes
    dense = AttentionKMeans(3, random_state=0, **settings).fit(X)
    np.testing.assert_array_equal(model.labels_, dense.labels_)
    np.testing.assert_allclose(model.cluster_centers_, dense.cluster_centers_, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("temperature", [0, 1.5, "auto"])
def test_csr_input_on_the_gpu_equals_the_dense_array(temperature):
    X = sparse_blobs(np.float64, n=300)
    dense = AttentionKMeans(4, temperature=temperature, random_state=0, device="cuda").fit(X)
    model = AttentionKMeans(4, temperature=temperature, random_state=0, device="cuda").fit(
        sp.csr_matrix(X)
    )
    np.testing.assert_array_equal(model.labels_, dense.labels_)
    np.testing.assert_allclose(model.cluster_centers_, dense.cluster_centers_, rtol=1e-10)
    np.testing.assert_array_equal(model.predict(sp.csr_matrix(X)), dense.predict(X))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 7])
def test_column_moments_of_a_sparse_matrix_are_numpys(dtype, d):
    from skattention.cluster._inputs import column_moments

    X = sparse_blobs(dtype, n=2000, d=d) * 1000 + 0.1
    X[::3] = 0
    with skattention.config_context(working_memory=0.01):  # many blocks
        mean, variance = column_moments(sp.csr_matrix(X))
    np.testing.assert_array_equal(mean, X.mean(axis=0))
    assert variance == np.mean(np.var(X, axis=0)) and variance.dtype == dtype


def test_callable_init_gets_the_sparse_matrix_as_kmeans_does():
    X = sparse_blobs(np.float64, n=100, d=4)
    seen = []

    def first_rows(data, n_clusters, random_state):
        seen.append(type(data))
        return data[:n_clusters].toarray() if sp.issparse(data) else data[:n_clusters]

    model = AttentionKMeans(3, temperature=0, init=first_rows).fit(sp.csr_matrix(X))
    # KMeans passes dense data centred and sparse data as it is: the same rows either way
    dense = AttentionKMeans(3, temperature=0, init=first_rows).fit(X)
    assert seen == [sp.csr_matrix] * 10 + [np.ndarray] * 10
    assert_same_model(dense, model, X, sp.csr_matrix(X))


# ----------------------------------------------------------------------------- progress


@pytest.mark.parametrize("settings", [dict(temperature=0, init="random", n_init=3), dict()])
def test_verbose_draws_the_last_progress_line_once(monkeypatch, capfd, settings):
    # Every update drawn, as when each run outlasts tqdm's minimum interval: the update that
    # completed the bar drew its final state and close() drew it again.
    pytest.importorskip("tqdm")
    from skattention._engine import _progress

    monkeypatch.setattr(_progress, "_MININTERVAL", 0.0)
    X = sparse_blobs(np.float64, n=200, d=3)
    AttentionKMeans(3, random_state=0, verbose=1, **settings).fit(X)
    err = capfd.readouterr().err
    total = settings.get("n_init", 1)
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1].startswith("AttentionKMeans fit: 100%")
    for done in range(total + 1):
        assert sum(f"| {done}/{total} [" in line for line in lines) == 1, err


def test_labels_have_kmeans_dtype(blobs):
    X, _ = blobs
    km = AttentionKMeans(3, random_state=0, device="cpu").fit(X)
    ref = KMeans(3, n_init=1, random_state=0).fit(X)
    assert km.labels_.dtype == ref.labels_.dtype == np.int32
    assert km.predict(X).dtype == ref.predict(X).dtype
    assert km.fit_predict(X).dtype == np.int32


@pytest.mark.parametrize("temperature", [0, 1.0, "auto"])
@pytest.mark.parametrize(("dtype", "weight"), [
    (np.float64, 1e300), (np.float64, 1e306), (np.float64, 1.7e308), (np.float32, 1e37),
])
def test_huge_sample_weights_fit_as_their_ratios(blobs, temperature, dtype, weight):
    # the weighted sums overflowed: garbage centroids, k-means++ failing inside NumPy on an
    # infinite sum ("probabilities do not sum to 1"), annealing's float32 weights infinite
    X = blobs[0][:50].astype(dtype)
    w = np.random.RandomState(0).randint(1, 4, size=50)
    big = AttentionKMeans(3, temperature=temperature, random_state=0).fit(
        X, sample_weight=w * (dtype(weight) / 4))
    ref = AttentionKMeans(3, temperature=temperature, random_state=0).fit(X, sample_weight=w)
    np.testing.assert_allclose(big.cluster_centers_, ref.cluster_centers_, rtol=1e-5)
    np.testing.assert_array_equal(big.labels_, ref.labels_)
    assert big.temperature_ == pytest.approx(ref.temperature_, rel=1e-5)
    with np.errstate(over="ignore"):  # an inertia beyond float64's largest is infinite
        expected = np.float64(ref.inertia_) * (float(weight) / 4)
    assert big.inertia_ == pytest.approx(expected, rel=1e-5)


def test_verbose_lines_show_the_inertia_in_the_weights_units(blobs, capfd):
    # weights summing beyond 2**32 are scaled inside the fit; the runs' lines showed the
    # scaled inertia where inertia_ is in the user's units
    X = blobs[0][:50]
    km = AttentionKMeans(3, temperature=0, n_init=2, random_state=0, verbose=2).fit(
        X, sample_weight=np.full(50, 1e12))
    err = capfd.readouterr().err
    shown = [float(part.split("inertia ")[1].split(",")[0])
             for part in err.splitlines() if "AttentionKMeans run" in part]
    assert len(shown) == 2
    assert min(shown) == pytest.approx(km.inertia_, rel=1e-5)


@pytest.mark.parametrize(("dtype", "temperature", "works"), [
    (np.float64, 1e-307, 1e-300), (np.float64, 5e-324, 1e-300), (np.float32, 1e-37, 1e-30),
    (np.float32, 1e-40, 1e-30),
])
def test_temperature_too_small_for_the_data_is_a_clear_error(blobs, dtype, temperature, works):
    # the soft steps' scores overflowed: float64 kept the initial centroids (silently), float32
    # failed inside torch ("value cannot be converted to type float without overflow")
    X = blobs[0][:100].astype(dtype)
    with pytest.raises(ValueError, match=r"temperature=.* too small .* use temperature=0"):
        AttentionKMeans(3, temperature=temperature, random_state=0).fit(X)
    # a small temperature that fits the dtype: soft k-means there is Lloyd's
    soft = AttentionKMeans(3, temperature=works, random_state=0).fit(X)
    lloyd = AttentionKMeans(3, temperature=0, random_state=0).fit(X)
    np.testing.assert_allclose(soft.cluster_centers_, lloyd.cluster_centers_, rtol=1e-5)


def test_points_far_from_the_origin_with_a_modest_spread_fit_at_a_small_temperature():
    # the scores are of centred points: a check on max|x| rejected these (nothing overflows)
    rng = np.random.default_rng(0)
    X = (1e16 + rng.normal(size=(300, 10)) * 1e12
         + np.repeat([[0.0], [5e12], [-5e12]], 100, 0)).astype(np.float32)
    km = AttentionKMeans(3, temperature=1e-5, n_init=1, random_state=0).fit(X)
    assert sorted(np.bincount(km.labels_)) == [100, 100, 100]


@pytest.mark.parametrize(("dtype", "temperature"), [(np.float32, 1e-40), (np.float64, 1e-310)])
def test_overflowing_soft_assignments_advise_what_kmeans_has(blobs, dtype, temperature):
    # the engine's advice named dtype=torch.float64 (an estimator's dtype='float64'), an option
    # AttentionKMeans does not have
    X = blobs[0][:100].astype(dtype)
    km = AttentionKMeans(3, random_state=0).fit(X)
    with pytest.raises(ValueError, match="pass a larger temperature to soft_assignments") as info:
        km.soft_assignments(X, temperature=temperature)
    assert "dtype=" not in str(info.value)
    assert ("pass X as float64" in str(info.value)) == (dtype == np.float32)
