"""``AttentionDiffusionEmbedding`` against ``SpectralEmbedding`` and the Laplace–Beltrami spectrum.

Written after scikit-learn 1.9's ``sklearn/manifold/tests/test_spectral_embedding.py`` (its
blobs ``S`` and RBF affinities) and pyDiffMap's ``tests/test_diffusionmap.py`` (the strip of
length 2 pi sampled at 81 points and the 60 x 31 latitude-longitude sphere, ``alpha=1``, with
their ``n_neighbors``), with ``epsilon="auto"`` instead of their hand-picked bandwidths.
"""

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.manifold import SpectralEmbedding

from skattention.manifold import AttentionDiffusionEmbedding

CENTERS = np.array(
    [[0.0, 5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 4.0, 0.0, 0.0], [1.0, 0.0, 0.0, 5.0, 1.0]]
)


@pytest.fixture(scope="module")
def S():
    return make_blobs(n_samples=100, centers=CENTERS, cluster_std=1.0, random_state=42)[0]


def unit_columns(A):
    return A / np.linalg.norm(A, axis=0)


@pytest.mark.parametrize("gamma", [1.0, 0.2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_alpha_zero_without_self_affinity_is_spectral_embedding(S, gamma, dtype):
    # test_spectral_embedding_precomputed_affinity's data and RBF affinity: the same components
    # up to a scale (sign included) each.
    X = S.astype(dtype)
    # The reference gets the same values in float64: scikit-learn computes a float32 input in
    # float32 (how closely depends on its version), the embedding computes in float64.
    se = SpectralEmbedding(n_components=2, affinity="rbf", gamma=gamma, random_state=36)
    se.fit(X.astype(np.float64))
    ours = AttentionDiffusionEmbedding(
        n_components=2, alpha=0.0, epsilon=1 / gamma, include_self=False, random_state=0
    ).fit(X)
    a, b = unit_columns(ours.embedding_), unit_columns(se.embedding_)
    a *= np.sign((a * b).sum(0))
    np.testing.assert_allclose(a, b, atol=1e-8)


def test_self_affinity_changes_the_space(S):
    # The default keeps each point's affinity with itself (attention over all points): a
    # different operator, whose components are not SpectralEmbedding's.
    se = SpectralEmbedding(n_components=2, affinity="rbf", gamma=1.0, random_state=36).fit(S)
    ours = AttentionDiffusionEmbedding(n_components=2, alpha=0.0, epsilon=1.0, random_state=0).fit(
        S
    )
    a, b = unit_columns(ours.embedding_), unit_columns(se.embedding_)
    a *= np.sign((a * b).sum(0))
    assert np.abs(a - b).max() > 1e-4


def test_blobs_separate_in_the_embedding(S):
    # test_pipeline_spectral_clustering: the blobs are apart in the first two components
    y = make_blobs(n_samples=100, centers=CENTERS, cluster_std=1.0, random_state=42)[1]
    emb = AttentionDiffusionEmbedding(
        n_components=2, alpha=0.0, include_self=False, random_state=0
    ).fit_transform(S)
    centres = np.array([emb[y == c].mean(0) for c in range(3)])
    spread = max(emb[y == c].std(0).max() for c in range(3))
    gaps = [np.linalg.norm(centres[i] - centres[j]) for i in range(3) for j in range(i)]
    assert min(gaps) > 3 * spread


def strip():
    x = np.linspace(0.0, 1.0, 81) * 2.0 * np.pi
    return x[:, None], x, 0.25 * np.array([1.0, 4.0, 9.0, 16.0])  # Neumann: (k / 2)^2


def lat_long_sphere():
    phi = np.pi * np.linspace(-1, 1, 61)[1:]
    theta = np.pi * np.linspace(-1, 1, 33)[1:-1]
    P, T = (a.ravel() for a in np.meshgrid(phi, theta))
    return np.c_[np.cos(T) * np.cos(P), np.cos(T) * np.sin(P), np.sin(T)], np.array(
        [2.0, 2.0, 2.0, 6.0]
    )


@pytest.mark.parametrize("n_neighbors", [None, 20])
def test_strip_eigenvalues_and_eigenvectors(n_neighbors):
    # pyDiffMap's test_1Dstrip_evals (k = 20) and test_1Dstrip_evecs
    X, x, expected = strip()
    emb = AttentionDiffusionEmbedding(
        n_components=4, alpha=1.0, n_neighbors=n_neighbors, diffusion_time=0, random_state=0
    ).fit(X)
    np.testing.assert_allclose(emb.laplacian_eigenvalues_, expected, rtol=0.1)
    for k in range(4):
        assert abs(np.corrcoef(np.cos(0.5 * (k + 1) * x), emb.embedding_[:, k])[0, 1]) > 1 - 0.003
    assert emb.intrinsic_dimension_ == pytest.approx(1.0, abs=0.1)


def test_sphere_eigenvalues():
    # pyDiffMap's test_sphere_evals: l (l + 1) = 2, 2, 2, 6 with k = 400
    X, expected = lat_long_sphere()
    emb = AttentionDiffusionEmbedding(
        n_components=4, alpha=1.0, n_neighbors=400, random_state=0
    ).fit(X)
    np.testing.assert_allclose(emb.laplacian_eigenvalues_, expected, rtol=0.1)


@pytest.mark.parametrize("sampling", ["grid", "uniform"])
def test_circle_eigenvalues(sampling):
    # k^2 = 1, 1, 4, 4 on the unit circle, dense operator
    n = 300
    theta = (
        np.linspace(0, 2 * np.pi, n, endpoint=False)
        if sampling == "grid"
        else np.random.default_rng(0).uniform(0, 2 * np.pi, n)
    )
    emb = AttentionDiffusionEmbedding(n_components=4, alpha=1.0, random_state=0).fit(
        np.c_[np.cos(theta), np.sin(theta)]
    )
    np.testing.assert_allclose(emb.laplacian_eigenvalues_, [1.0, 1.0, 4.0, 4.0], rtol=0.1)


def test_circle_eigenvalues_with_a_small_knn_graph():
    # n_neighbors much smaller than the dense rule's neighbourhood: the kernel is nearly flat
    # over the k-NN ball and the estimate is corrected for the truncation (it was 8x too small).
    theta = np.random.default_rng(0).uniform(0, 2 * np.pi, 1000)
    emb = AttentionDiffusionEmbedding(n_components=4, alpha=1.0, n_neighbors=30, random_state=0)
    emb.fit(np.c_[np.cos(theta), np.sin(theta)])
    np.testing.assert_allclose(emb.laplacian_eigenvalues_, [1.0, 1.0, 4.0, 4.0], rtol=0.2)
