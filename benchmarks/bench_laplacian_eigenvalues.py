"""Laplace–Beltrami eigenvalue estimates of AttentionDiffusionEmbedding with epsilon="auto".

    python benchmarks/bench_laplacian_eigenvalues.py

``alpha=1``, four components, ``random_state=0``; for each manifold the estimates
``laplacian_eigenvalues_`` divided by the true eigenvalues, the largest relative error, and the
largest error of the ratios to the first estimate. The strip (81 points on ``[0, 2 pi]``, Neumann
eigenvalues ``(k / 2)^2``) and the latitude-longitude sphere (60 x 31 points, half of them
duplicates, ``l (l + 1)``) are pyDiffMap's test data, with its ``n_neighbors``.
"""

import numpy as np

from skattention.manifold import AttentionDiffusionEmbedding


def strip():
    return (np.linspace(0, 1, 81) * 2 * np.pi)[:, None], 0.25 * np.array([1.0, 4, 9, 16])


def lat_long_sphere():
    phi = np.pi * np.linspace(-1, 1, 61)[1:]
    theta = np.pi * np.linspace(-1, 1, 33)[1:-1]
    P, T = (a.ravel() for a in np.meshgrid(phi, theta))
    return np.c_[np.cos(T) * np.cos(P), np.cos(T) * np.sin(P), np.sin(T)], np.array([2.0, 2, 2, 6])


def circle(theta):
    return np.c_[np.cos(theta), np.sin(theta)], np.array([1.0, 1, 4, 4])


def circle_with_density(n, rng):
    theta = np.empty(0)
    while theta.size < n:  # rejection sampling from 1 + 0.8 cos(theta)
        t = rng.uniform(0, 2 * np.pi, 4 * n)
        theta = np.r_[theta, t[rng.uniform(0, 1.8, 4 * n) < 1 + 0.8 * np.cos(t)]]
    return circle(theta[:n])


def random_sphere(n, rng):
    X = rng.normal(size=(n, 3))
    return X / np.linalg.norm(X, axis=1, keepdims=True), np.array([2.0, 2, 2, 6])


def main():
    rng = np.random.default_rng(0)
    cases = [
        ("strip (pyDiffMap)", strip(), [None, 20]),
        ("lat-long sphere (pyDiffMap)", lat_long_sphere(), [None, 400]),
        (
            "circle, 300 evenly spaced",
            circle(np.linspace(0, 2 * np.pi, 300, endpoint=False)),
            [None],
        ),
        ("circle, 2,000 uniform random", circle(rng.uniform(0, 2 * np.pi, 2000)), [None, 15, 100]),
        ("circle, density 1 + 0.8 cos", circle_with_density(2000, rng), [None]),
        ("sphere, 2,000 uniform random", random_sphere(2000, rng), [None]),
    ]
    for name, (X, true), neighbors in cases:
        for k in neighbors:
            emb = AttentionDiffusionEmbedding(
                n_components=4, alpha=1.0, n_neighbors=k, random_state=0
            ).fit(X)
            r = emb.laplacian_eigenvalues_ / true
            error, ratio_error = np.abs(r - 1).max(), np.abs(r / r[0] - 1).max()
            print(
                f"{name:30s} n_neighbors={k!s:5s} estimate/true {np.round(r, 3)}  "
                f"max error {100 * error:4.1f}%  ratio error {100 * ratio_error:4.1f}%"
            )


if __name__ == "__main__":
    main()
