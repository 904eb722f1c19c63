"""The continuous limit of attention: generator convergence and the spectral cluster count."""

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from skattention.manifold import attention_generator, spectral_cluster_count


def circle_sample(n, rng):
    """Angles with density proportional to 1 + 0.5 cos(theta) (rejection sampling)."""
    theta = np.empty(0)
    while len(theta) < n:
        t = rng.uniform(0, 2 * np.pi, 4 * n)
        theta = np.r_[theta, t[rng.uniform(0, 1.5, 4 * n) < 1 + 0.5 * np.cos(t)]]
    return theta[:n]


def circle_case(n, seed=0):
    theta = circle_sample(n, np.random.default_rng(seed))
    X = np.c_[np.cos(theta), np.sin(theta)]
    f = np.sin(theta)
    laplacian = -np.sin(theta)  # d^2/dtheta^2 sin
    # <grad log p, grad f> = (p'/p) f' with p = 1 + 0.5 cos
    drift = (-0.5 * np.sin(theta) / (1 + 0.5 * np.cos(theta))) * np.cos(theta)
    return X, f, laplacian, drift


def sphere_case(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(4 * n, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    X = X[rng.uniform(0, 1.5, 4 * n) < 1 + 0.5 * X[:, 2]][:n]  # density 1 + 0.5 z
    z = X[:, 2]
    laplacian = -2 * z  # z is a degree-1 spherical harmonic: Lap z = -l (l + 1) z
    drift = 0.5 * (1 - z**2) / (1 + 0.5 * z)  # grad log p . grad z, |grad z|^2 = 1 - z^2
    return X, z, laplacian, drift


def rms(a):
    return float(np.sqrt(np.mean(a**2)))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_generator_converges_on_the_circle_with_non_uniform_density(alpha):
    def error(n, eps):  # mean over two samples: one sample's error is noisy
        errors = []
        for seed in range(2):
            X, f, laplacian, drift = circle_case(n, seed)
            errors.append(
                rms(
                    attention_generator(X, f, epsilon=2 * eps, alpha=alpha)
                    - (laplacian + 2 * (1 - alpha) * drift)
                )
            )
        return np.mean(errors)

    errors = [error(n, eps) for n, eps in [(500, 0.3), (2000, 0.2), (8000, 0.1)]]
    # the estimate approaches Lap f + 2 (1 - alpha) <grad log p, grad f> as n grows and eps shrinks
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < (0.12 if alpha == 0 else 0.08)
    # the drift term is real: without it the alpha=0 estimate is far off
    if alpha == 0:
        X, f, laplacian, _ = circle_case(8000)
        assert rms(attention_generator(X, f, epsilon=0.2) - laplacian) > 3 * errors[2]


def test_generator_converges_on_the_sphere():
    errors = []
    for n, eps in [(2000, 0.2), (8000, 0.1)]:
        X, f, laplacian, drift = sphere_case(n)
        errors.append(rms(attention_generator(X, f, epsilon=2 * eps) - (laplacian + 2 * drift)))
    assert errors[1] < errors[0] and errors[1] < 0.25


def test_generator_accepts_several_functions_and_validates():
    X, f, _, _ = circle_case(300)
    both = attention_generator(X, np.c_[f, 2 * f], epsilon=0.2)
    np.testing.assert_allclose(both[:, 1], 2 * both[:, 0], rtol=1e-12)
    with pytest.raises(ValueError, match="f_values must have shape"):
        attention_generator(X, f[:10], epsilon=0.2)
    with pytest.raises(ValueError, match="epsilon"):
        attention_generator(X, f, epsilon=-1.0)


def test_generator_eps_is_deprecated_for_epsilon_the_temperature():
    # one convention: epsilon is the attention temperature, as in AttentionDiffusionEmbedding;
    # the former eps was half of it
    X, f, _, _ = circle_case(300)
    new = attention_generator(X, f, epsilon=0.2)
    with pytest.warns(FutureWarning, match="epsilon = 2 \\* eps"):
        old = attention_generator(X, f, 0.1)
    np.testing.assert_array_equal(old, new)
    with pytest.warns(FutureWarning):
        np.testing.assert_array_equal(attention_generator(X, f, eps=0.1), new)
    with pytest.raises(ValueError, match="eps"):
        attention_generator(X, f, -1.0)
    with pytest.raises(ValueError, match="epsilon only"):
        attention_generator(X, f, 0.1, epsilon=0.2)
    with pytest.raises(TypeError, match="epsilon"):
        attention_generator(X, f)


def test_spectral_cluster_count_counts_separated_blobs():
    for n_blobs in (2, 3, 5):
        centers = [[12.0 * i, 6.0 * (i % 2)] for i in range(n_blobs)]
        X, _ = make_blobs(100 * n_blobs, centers=centers, random_state=n_blobs)
        assert spectral_cluster_count(X, random_state=0) == n_blobs
        assert spectral_cluster_count(X, n_neighbors=15, random_state=0) == n_blobs


def test_spectral_cluster_count_sees_one_cluster_when_blobs_merge_and_returns_the_spectrum():
    X, _ = make_blobs(400, centers=[[0, 0], [1.0, 0]], random_state=0)
    count, gaps = spectral_cluster_count(X, max_clusters=6, return_eigenvalues=True, random_state=0)
    assert count == 1
    assert gaps.shape == (6,) and gaps[0] == pytest.approx(0.0, abs=1e-9)
    assert np.all(np.diff(gaps) >= 0)
