"""AttentionDiffusionEmbedding against mathematics (circle, sphere) and scikit-learn."""

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs, make_s_curve
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.manifold import SpectralEmbedding
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skattention import MetricAttentionTransformer
from skattention.manifold import AttentionDiffusionEmbedding
from skattention.manifold._operator import diffusion_operator, knn_graph


def circle_angles(n, rng, uniform=True):
    """Angles on the unit circle, uniform or with density proportional to 1 + 0.8 cos(theta)."""
    if uniform:
        return rng.uniform(0, 2 * np.pi, n)
    theta = np.empty(0)
    while len(theta) < n:
        t = rng.uniform(0, 2 * np.pi, 4 * n)
        theta = np.r_[theta, t[rng.uniform(0, 1.8, 4 * n) < 1 + 0.8 * np.cos(t)]]
    return theta[:n]


def on_circle(theta):
    return np.c_[np.cos(theta), np.sin(theta)]


def rotation_fit(embedding, target):
    """|correlation| of each target column with its least-squares fit from the embedding."""
    coef, *_ = np.linalg.lstsq(embedding - embedding.mean(0), target - target.mean(0), rcond=None)
    fitted = (embedding - embedding.mean(0)) @ coef
    return np.array(
        [abs(np.corrcoef(fitted[:, i], target[:, i])[0, 1]) for i in range(target.shape[1])]
    )


def canonical_correlations(A, B):
    qa, _ = np.linalg.qr(A - A.mean(0))
    qb, _ = np.linalg.qr(B - B.mean(0))
    return np.linalg.svd(qa.T @ qb, compute_uv=False)


@pytest.mark.parametrize("uniform", [True, False])
def test_circle_gives_cos_sin_and_k_squared_spectrum(uniform):
    rng = np.random.default_rng(0)
    theta = circle_angles(2000, rng, uniform)
    emb = AttentionDiffusionEmbedding(n_components=4, alpha=1.0, random_state=0).fit(
        on_circle(theta)
    )
    assert rotation_fit(emb.embedding_[:, :2], on_circle(theta)).min() > 0.99
    lam = emb.laplacian_eigenvalues_
    # Laplace–Beltrami on the circle: k^2 with multiplicity 2 (1, 1, 4, 4).
    np.testing.assert_allclose(lam[2:] / lam[:2], 4.0, rtol=0.05)
    # absolute scale: the estimate 4 (1 - mu) / eps is noisier than ratios where density is low
    np.testing.assert_allclose(lam[:2], 1.0, rtol=0.25)
    assert emb.intrinsic_dimension_ == pytest.approx(1.0, abs=0.1)
    # Nyström: held-out points of the circle land on cos/sin of their own angles.
    held_out = rng.uniform(0, 2 * np.pi, 300)
    new = emb.transform(on_circle(held_out))[:, :2]
    # the rotation fitted on the training points carries over
    coef, *_ = np.linalg.lstsq(emb.embedding_[:, :2], on_circle(theta), rcond=None)
    np.testing.assert_allclose(new @ coef, on_circle(held_out), atol=0.05)


def test_sphere_spectrum_has_multiplicities_3_then_5_in_ratio_2_to_6():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    emb = AttentionDiffusionEmbedding(n_components=9, alpha=1.0, random_state=0).fit(X)
    lam = emb.laplacian_eigenvalues_
    first, second = lam[:3], lam[3:8]
    # groups: l (l + 1) = 2 (x3) and 6 (x5); the ninth starts the l = 3 group (12).
    np.testing.assert_allclose(first / first.mean(), 1.0, rtol=0.1)
    np.testing.assert_allclose(second / second.mean(), 1.0, rtol=0.1)
    assert second.min() > 2 * first.max() and lam[8] > 1.5 * second.max()  # the groups are apart
    assert second.mean() / first.mean() == pytest.approx(3.0, rel=0.1)
    # the first group spans the coordinate functions x, y, z
    assert canonical_correlations(emb.embedding_[:, :3], X).min() > 0.99
    assert emb.intrinsic_dimension_ == pytest.approx(2.0, abs=0.2)


def test_alpha_zero_spans_the_same_space_as_spectral_embedding():
    X, _ = make_s_curve(600, random_state=0)
    emb = AttentionDiffusionEmbedding(n_components=2, alpha=0.0, random_state=0).fit(X)
    se = SpectralEmbedding(
        n_components=2, affinity="rbf", gamma=1.0 / emb.epsilon_, random_state=0
    ).fit(X)
    assert canonical_correlations(emb.embedding_, se.embedding_).min() > 0.99


def test_knn_operator_on_the_s_curve_agrees_with_spectral_embedding():
    X, t = make_s_curve(1500, random_state=0)
    emb = AttentionDiffusionEmbedding(n_components=2, n_neighbors=15, random_state=0).fit(X)
    se = SpectralEmbedding(n_components=2, n_neighbors=15, random_state=0).fit(X)
    # both unroll the S: the first coordinate follows the position along the curve
    assert abs(np.corrcoef(emb.embedding_[:, 0], t)[0, 1]) > 0.95
    assert canonical_correlations(emb.embedding_[:, :1], se.embedding_[:, :1]).min() > 0.95


@pytest.mark.parametrize("n_neighbors", [None, 10])
@pytest.mark.parametrize("diffusion_time", [0, 1, 2.5])
def test_transform_of_training_points_reproduces_embedding(n_neighbors, diffusion_time):
    X, _ = make_s_curve(400, random_state=1)
    emb = AttentionDiffusionEmbedding(
        n_components=3, n_neighbors=n_neighbors, diffusion_time=diffusion_time, random_state=0,
    )
    fitted = emb.fit_transform(X)
    np.testing.assert_array_equal(fitted, emb.embedding_)
    np.testing.assert_allclose(emb.transform(X), fitted, rtol=1e-7, atol=1e-9)
    # diffusion_time scales component k by eigenvalue_k ** t
    base = AttentionDiffusionEmbedding(
        n_components=3, n_neighbors=n_neighbors, diffusion_time=0, random_state=0
    ).fit(X)
    np.testing.assert_allclose(
        fitted, base.embedding_ * base.eigenvalues_**diffusion_time, rtol=1e-6, atol=1e-12
    )


@pytest.mark.parametrize("n_neighbors", [None, 12])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_operator_is_attention_with_the_density_log_prior(n_neighbors, alpha):
    """Rows of the Markov operator D^-1 K_alpha equal softmax(-d^2/eps - alpha log q_j) on the
    graph."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    eps = 0.7
    knn = None if n_neighbors is None else knn_graph(X, n_neighbors, "cpu")
    op = diffusion_operator(X, eps, alpha, knn, "cpu")
    A = op.A.toarray() if sp.issparse(op.A) else op.A
    markov = A * np.sqrt(op.degree)[None, :] / np.sqrt(op.degree)[:, None]
    d2 = ((X[:, None] - X[None]) ** 2).sum(-1)
    logits = -d2 / eps + op.log_prior[None, :]
    if n_neighbors is not None:
        r2 = np.sort(d2, 1)[:, n_neighbors - 1]
        logits[d2 > np.maximum(r2[:, None], r2[None, :])] = -np.inf
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(markov, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(markov.sum(1), 1.0, rtol=1e-12)


def test_disconnected_blobs_give_near_unit_eigenvalues_and_separate_clusters():
    X, y = make_blobs(300, centers=[[0, 0], [20, 0], [0, 20]], random_state=0)
    # the kernel across the blobs is about exp(-360): positive, but below rounding
    with pytest.warns(UserWarning, match="Graph is not fully connected"):
        emb = AttentionDiffusionEmbedding(n_components=2, random_state=0).fit(X)
    assert np.all(emb.eigenvalues_ > 1 - 1e-6)
    # each blob is a single point in the embedding up to tiny spread
    for label in range(3):
        assert emb.embedding_[y == label].std(0).max() < 1e-3 * np.abs(emb.embedding_).max()


def test_learned_metric_transformer_is_used_fitted_or_not():
    X, y = make_blobs(150, centers=3, n_features=4, cluster_std=3.0, random_state=0)
    metric = MetricAttentionTransformer(metric="linear", max_iter=5, random_state=0)
    unfitted = AttentionDiffusionEmbedding(metric=metric, random_state=0).fit(X, y)
    assert unfitted.metric_ is not metric and not hasattr(metric, "map_")
    Z = unfitted.metric_.transform(X)
    manual = AttentionDiffusionEmbedding(random_state=0).fit(Z)
    np.testing.assert_allclose(unfitted.embedding_, manual.embedding_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        unfitted.transform(X[:10]), manual.transform(Z[:10]), rtol=1e-6, atol=1e-9
    )
    prefit = AttentionDiffusionEmbedding(metric=unfitted.metric_, random_state=0).fit(X)
    assert prefit.metric_ is unfitted.metric_
    np.testing.assert_allclose(prefit.embedding_, unfitted.embedding_, rtol=1e-9, atol=1e-12)
    # any scikit-learn transformer works too
    scaled = AttentionDiffusionEmbedding(metric=StandardScaler(), random_state=0).fit(X)
    np.testing.assert_allclose(
        scaled.embedding_,
        AttentionDiffusionEmbedding(random_state=0).fit(StandardScaler().fit_transform(X)).embedding_,
        rtol=1e-7, atol=1e-10,
    )


def test_transform_reads_the_table_as_the_fitted_metric_did_after_set_params():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": rng.normal(size=60), "b": rng.choice(["u", "v"], 60)})
    y = (table["b"] == "u").to_numpy()
    metric = MetricAttentionTransformer(max_iter=2, hidden_size=4, random_state=0)
    emb = AttentionDiffusionEmbedding(n_components=1, metric=metric, random_state=0)
    expected = emb.fit(table, y).transform(table[:5])
    # not refitted: the fitted metric_ still reads the strings (not as floats, as "euclidean")
    emb.set_params(metric="euclidean")
    np.testing.assert_array_equal(emb.transform(table[:5]), expected)

def test_pandas_output_feature_names_pipeline_and_pickle():
    pd = pytest.importorskip("pandas")
    X, _ = make_s_curve(200, random_state=0)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    emb = AttentionDiffusionEmbedding(n_components=2, random_state=0).set_output(transform="pandas")
    out = emb.fit(frame).transform(frame)
    assert list(out.columns) == ["attentiondiffusionembedding0", "attentiondiffusionembedding1"]
    np.testing.assert_array_equal(emb.get_feature_names_out(), out.columns)
    pipe = make_pipeline(
        StandardScaler(), AttentionDiffusionEmbedding(n_components=2, random_state=0)
    ).fit(X)
    restored = pickle.loads(pickle.dumps(pipe))
    np.testing.assert_array_equal(restored.transform(X[:20]), pipe.transform(X[:20]))


def test_feature_names_out_are_those_of_the_fit_not_of_the_parameters():
    pd = pytest.importorskip("pandas")
    X, _ = make_s_curve(60, random_state=0)
    emb = AttentionDiffusionEmbedding(n_components=2, random_state=0)
    # before fit: NotFittedError, as scikit-learn's transformers (not names from n_components)
    with pytest.raises(NotFittedError):
        emb.get_feature_names_out()
    emb.set_output(transform="pandas").fit(X)
    emb.set_params(n_components=3)  # not refitted: the names and columns are still the fit's
    out = emb.transform(X[:5])
    assert isinstance(out, pd.DataFrame) and out.shape == (5, 2)
    np.testing.assert_array_equal(emb.get_feature_names_out(), out.columns)

def test_memory_budget_is_respected_and_too_small_budget_is_clear():
    import skattention

    X, _ = make_s_curve(300, random_state=0)
    reference = AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    with skattention.config_context(working_memory=0.05):  # a few rows per kernel block
        small = AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    np.testing.assert_allclose(small.embedding_, reference.embedding_, rtol=1e-8, atol=1e-12)
    with skattention.config_context(working_memory=1e-4):
        with pytest.raises(MemoryError, match="working_memory"):
            AttentionDiffusionEmbedding(n_neighbors=None, epsilon=1.0).fit(X)


@pytest.mark.parametrize(
    "params, X, match",
    [
        (
            dict(n_components=5),
            np.random.default_rng(0).normal(size=(5, 2)),
            "n_components=5 must be smaller",
        ),
        (
            dict(n_neighbors=10),
            np.random.default_rng(0).normal(size=(6, 2)),
            "n_neighbors=10 must be at most",
        ),
        (dict(), np.zeros((10, 2)), "every point coincides with the nearest points"),
        # computed in float64 already: the engine's advice of dtype=torch.float64 misled
        (
            dict(),
            np.random.default_rng(0).normal(size=(10, 2)) * 1e200,
            r"\(float64\) once squared; rescale the data\.$",
        ),
        # distinct points whose squared distances underflow: not "every point coincides"
        (
            dict(),
            np.random.default_rng(0).normal(size=(10, 2)) * 1e-200,
            r"squared distances .* underflow to 0 in float64 .*; rescale the data\.$",
        ),
        (dict(), np.array([[0.0, np.nan], [1.0, 2.0], [3.0, 4.0]]), "NaN"),
        (dict(device="cuda:99"), np.random.default_rng(0).normal(size=(10, 2)), "cuda"),
        (dict(alpha=2.0), np.random.default_rng(0).normal(size=(10, 2)), "alpha"),
    ],
)
def test_bad_input_gives_clear_errors(params, X, match):
    with pytest.raises(ValueError, match=match):
        AttentionDiffusionEmbedding(**params).fit(X)


@pytest.mark.parametrize("n_neighbors", [5, 9])
def test_k_nn_graph_of_duplicated_rows_fits_with_the_disconnected_warning(n_neighbors):
    # 100 distinct points, 10 copies each: every k-NN ball holds copies of its point alone;
    # the k-NN cap on the bandwidth raised "all points coincide" and the eigenvalue estimate
    # divided 0 by 0. Now a fit with the graph's warning, as SpectralEmbedding's
    X = np.repeat(np.random.default_rng(0).normal(size=(100, 2)), 10, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.warns(UserWarning, match="not fully connected"):
            model = AttentionDiffusionEmbedding(n_neighbors=n_neighbors, random_state=0).fit(X)
    assert np.isfinite(model.embedding_).all()
    # copies of a point land on one point of the embedding
    np.testing.assert_allclose(model.embedding_[::10], model.embedding_[9::10], atol=1e-8)


@pytest.mark.parametrize("n_neighbors", [None, 10])
def test_arpack_failing_on_eigenvalues_crowded_at_1_falls_back_to_lobpcg(n_neighbors):
    # epsilon far below the spacing: dozens of eigenvalues equal 1 to rounding and ARPACK's
    # shift-invert Lanczos ran its 10 n iterations and raised ArpackNoConvergence;
    # SpectralEmbedding warns and falls back to LOBPCG
    X = np.random.RandomState(0).normal(size=(201, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.warns(RuntimeWarning, match="ARPACK did not converge"):
            emb = AttentionDiffusionEmbedding(
                epsilon=1e-3, n_neighbors=n_neighbors, eigen_solver="arpack", random_state=0
            ).fit(X)
    assert np.isfinite(emb.embedding_).all() and np.all(emb.eigenvalues_ > 1 - 1e-6)
    # LOBPCG stops at its iteration cap in the crowd: the extension holds to its residual
    np.testing.assert_allclose(emb.transform(X[:5]), emb.embedding_[:5], atol=1e-4)


def test_lobpcg_falling_back_from_arpack_does_not_advise_arpack():
    # its ConvergenceWarning advised eigen_solver='arpack', right after ARPACK's failure
    X = np.random.RandomState(0).normal(size=(201, 2))
    with pytest.warns(RuntimeWarning, match="ARPACK did not converge"):
        with pytest.warns(ConvergenceWarning, match="raise eigen_tol or epsilon") as record:
            AttentionDiffusionEmbedding(epsilon=1e-3, random_state=0).fit(X)
    assert not any("eigen_solver='arpack'" in str(w.message) for w in record)


def test_explicit_epsilon_and_dense_solver_agree_with_arpack():
    X, _ = make_s_curve(300, random_state=0)
    dense = AttentionDiffusionEmbedding(
        n_components=3, epsilon=0.5, eigen_solver="dense", random_state=0
    ).fit(X)
    arpack = AttentionDiffusionEmbedding(
        n_components=3, epsilon=0.5, eigen_solver="arpack", random_state=0
    ).fit(X)
    assert dense.epsilon_ == 0.5 and dense.intrinsic_dimension_ is None
    np.testing.assert_allclose(dense.eigenvalues_, arpack.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(dense.embedding_, arpack.embedding_, rtol=1e-6, atol=1e-8)



def test_a_metric_transformer_sees_the_raw_table():
    # a transformer that takes strings, categories and missing values gets the frame itself
    # (its names included); only its output is checked as floats
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"num": rng.normal(size=150), "city": rng.choice(["Oslo", "Rome"], 150)})
    X.loc[::9, "num"] = np.nan
    y = np.where(X["num"].fillna(0) > 0, "yes", "no")
    metric = MetricAttentionTransformer(n_components=3, max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "X does not have valid feature names"
        warnings.simplefilter("ignore", ConvergenceWarning)
        emb = AttentionDiffusionEmbedding(metric=metric, n_neighbors=None, random_state=0)
        emb.fit(X, y)
        np.testing.assert_allclose(emb.transform(X), emb.embedding_, rtol=1e-6, atol=1e-9)
    assert list(emb.feature_names_in_) == ["num", "city"] and emb.n_features_in_ == 2
    assert list(emb.metric_.feature_names_in_) == ["num", "city"]
    manual = AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(
        emb.metric_.transform(X))
    np.testing.assert_allclose(emb.embedding_, manual.embedding_, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="feature names should match"):
        emb.transform(X[["city", "num"]])
    with pytest.raises(ValueError, match="minimum of 2 is required"):
        AttentionDiffusionEmbedding(metric=metric).fit(X[:1], y[:1])


def test_a_single_neighbour_is_refused_by_name():
    # a point's own neighbour alone gives no distance to take a bandwidth from (it said the
    # points all coincide)
    t = np.random.default_rng(0).uniform(0, 6.28, 100)
    with pytest.raises(ValueError, match="n_neighbors"):
        AttentionDiffusionEmbedding(n_neighbors=1).fit(np.c_[np.cos(t), np.sin(t)])


@pytest.mark.parametrize("n_blobs", [2, 3])
def test_lobpcg_finds_every_unit_eigenvalue_of_a_disconnected_graph(n_blobs):
    # one null vector of the Laplacian per connected component: LOBPCG started from the top
    # one missed the others (eigenvalues [0.9704, 0.9649] where arpack gives [1, 0.9704])
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(100 * b, 0.1, (50, 2)) for b in range(n_blobs)])
    settings = dict(n_components=n_blobs, n_neighbors=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Graph is not fully connected"
        arpack = AttentionDiffusionEmbedding(eigen_solver="arpack", **settings).fit(X)
        lobpcg = AttentionDiffusionEmbedding(eigen_solver="lobpcg", eigen_tol=1e-9,
                                             **settings).fit(X)
    np.testing.assert_allclose(lobpcg.eigenvalues_, arpack.eigenvalues_, rtol=0, atol=1e-6)
    # the trivial top eigenvector is not an embedding coordinate: one unit eigenvalue fewer
    assert np.sum(np.isclose(lobpcg.eigenvalues_, 1.0)) == n_blobs - 1


@pytest.mark.parametrize("n_neighbors", [None, 5])
@pytest.mark.parametrize("scale", [1e-155, 1e-158, 1e-160])
def test_points_whose_squared_distances_are_subnormal_are_a_clear_error(scale, n_neighbors):
    # the squared distances (and the bandwidth) lay in float64's subnormal range: the operator
    # came out the identity, eigenvalues 1 and Laplacian eigenvalues 0, with only the warning
    # of a disconnected graph (or an engine error advising a temperature the estimator lacks)
    X = np.random.default_rng(0).normal(size=(60, 3))
    with pytest.raises(ValueError, match=r"below float64's smallest normal .*rescale the data\.$"):
        AttentionDiffusionEmbedding(n_neighbors=n_neighbors, random_state=0).fit(X * scale)
    # a little larger, the embedding is the unscaled data's
    small = AttentionDiffusionEmbedding(n_neighbors=n_neighbors, random_state=0).fit(X * 1e-150)
    ref = AttentionDiffusionEmbedding(n_neighbors=n_neighbors, random_state=0).fit(X)
    np.testing.assert_allclose(np.abs(small.embedding_), np.abs(ref.embedding_), atol=1e-6)


def test_overflowing_attention_advises_a_larger_epsilon():
    # the engine's advice was to "raise the temperature", a parameter the embedding lacks
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.warns(UserWarning, match="not fully connected"):
        emb = AttentionDiffusionEmbedding(epsilon=1e-308, n_neighbors=None).fit(X)
    with pytest.raises(ValueError, match="rescale the data or pass a larger epsilon") as info:
        emb.transform(X + 0.5)
    assert "temperature" not in str(info.value).split(";")[1]
