"""AttentionDiffusionEmbedding against scikit-learn's SpectralEmbedding (issue 4).

1. Fit time on the S-curve (3-D) with the same k-NN graph size, n = 2,000, 10,000, 50,000:
   ratio AttentionDiffusionEmbedding / SpectralEmbedding (median of ``--repeats``).
2. Eigenvalue error on the unit circle (k-NN mode with the same k, and with a larger
   ``--eigen-neighbors`` graph; dense mode up to n = 10,000): the first four non-trivial
   eigenvalues should be in the ratio 1 : 1 : 4 : 4 (k^2); the error is the largest relative error
   of lambda_i / mean(lambda_1, lambda_2) against that. SpectralEmbedding does not expose its
   eigenvalues: they are the Rayleigh quotients of its eigenvectors with the normalised
   Laplacian of its own affinity matrix.

pydiffmap (``pip install pydiffmap``) is timed and scored too when it is installed; datafold
would downgrade numpy and scikit-learn here, so it is not.

Usage: python benchmarks/bench_diffusion.py [--sizes 2000 10000 50000] [--repeats 3] [--threads 2]
Writes benchmarks/results/diffusion.json.
"""

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import ArpackNoConvergence
from sklearn.datasets import make_s_curve
from sklearn.manifold import SpectralEmbedding
from threadpoolctl import threadpool_limits

try:  # optional: pip install pydiffmap (not a dependency of skattention)
    from pydiffmap.diffusion_map import DiffusionMap
except ImportError:
    DiffusionMap = None

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from skattention.manifold import AttentionDiffusionEmbedding  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "diffusion.json"
K_SQUARED = np.array([1.0, 1.0, 4.0, 4.0])


def timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def circle(n, seed=0):
    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, n)
    return np.c_[np.cos(theta), np.sin(theta)]


def ratio_error(eigenvalues):
    lam = np.asarray(eigenvalues[:4], dtype=float)
    return float(np.max(np.abs(lam / lam[:2].mean() - K_SQUARED) / K_SQUARED))


def spectral_embedding_eigenvalues(se):
    """Rayleigh quotients of SpectralEmbedding's eigenvectors with its normalised Laplacian."""
    W = sp.csr_matrix(se.affinity_matrix_)
    W = W - sp.diags(W.diagonal())  # scipy's Laplacian ignores self loops
    d = np.asarray(W.sum(1)).ravel()
    v = se.embedding_ * np.sqrt(d)[:, None]  # embedding = D^-1/2 v
    Lv = v - (sp.diags(1 / np.sqrt(d)) @ W @ sp.diags(1 / np.sqrt(d))) @ v
    return (v * Lv).sum(0) / (v * v).sum(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000, 50000])
    parser.add_argument("--n-neighbors", type=int, default=15)
    parser.add_argument("--eigen-neighbors", type=int, default=60,
                        help="a second, larger graph for the circle eigenvalue error")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pydiffmap-max-n",
        type=int,
        default=10000,
        help="skip pydiffmap above this n (at 50,000 it had not finished after 25 minutes)",
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    k = args.n_neighbors
    rows = []
    with threadpool_limits(args.threads):
        # warm-up (imports, first torch kernels)
        AttentionDiffusionEmbedding(n_neighbors=k, random_state=0).fit(
            make_s_curve(500, random_state=0)[0]
        )
        for n in args.sizes:
            repeats = args.repeats if n <= 10000 else 1
            X, _ = make_s_curve(n, random_state=0)
            t_ours, _ = timed(
                lambda: AttentionDiffusionEmbedding(n_neighbors=k, random_state=0).fit(X), repeats
            )
            t_sk, _ = timed(
                lambda: SpectralEmbedding(
                    n_components=2, affinity="nearest_neighbors", n_neighbors=k, random_state=0
                ).fit(X),
                repeats,
            )
            C = circle(n)
            ours = AttentionDiffusionEmbedding(n_components=4, n_neighbors=k, random_state=0).fit(C)
            se = SpectralEmbedding(
                n_components=4, affinity="nearest_neighbors", n_neighbors=k, random_state=0
            ).fit(C)
            # embedding_ already drops the trivial vector
            se_lam = spectral_embedding_eigenvalues(se)[:4]
            k2 = args.eigen_neighbors
            ours_k2 = AttentionDiffusionEmbedding(
                n_components=4, n_neighbors=k2, random_state=0
            ).fit(C)
            se_k2 = SpectralEmbedding(
                n_components=4, affinity="nearest_neighbors", n_neighbors=k2, random_state=0
            ).fit(C)
            row = dict(
                n=n,
                n_neighbors=k,
                fit_s=t_ours,
                spectral_embedding_fit_s=t_sk,
                ratio=t_ours / t_sk,
                circle_eigen_ratio_error=ratio_error(ours.laplacian_eigenvalues_),
                spectral_embedding_circle_eigen_ratio_error=ratio_error(se_lam),
                circle_laplacian_eigenvalues=ours.laplacian_eigenvalues_.tolist(),
                eigen_neighbors=k2,
                circle_eigen_ratio_error_k2=ratio_error(ours_k2.laplacian_eigenvalues_),
                spectral_embedding_circle_eigen_ratio_error_k2=ratio_error(
                    spectral_embedding_eigenvalues(se_k2)[:4]
                ),
            )
            # same k, its BGH bandwidth, alpha=1
            if DiffusionMap is not None and n <= args.pydiffmap_max_n:

                def pdm(data, k_, n_evecs):
                    return DiffusionMap.from_sklearn(
                        n_evecs=n_evecs, k=k_, alpha=1.0, epsilon="bgh"
                    ).fit(data)
                def attempt(fn):  # its ARPACK (non-symmetric, no shift-invert) may not converge
                    try:
                        return fn()
                    except ArpackNoConvergence:
                        return "no convergence"

                t_pdm = attempt(lambda: timed(lambda: pdm(X, k, 2), repeats)[0])
                row["pydiffmap_fit_s"] = t_pdm
                if isinstance(t_pdm, float):
                    row["ratio_vs_pydiffmap"] = t_ours / t_pdm
                # its evals are those of the generator (negative): -evals ~ Laplacian eigenvalues
                row["pydiffmap_circle_eigen_ratio_error_k2"] = attempt(
                    lambda: ratio_error(-pdm(C, k2, 4).evals)
                )
            if n <= 10000:  # the dense operator (n x n) as well
                dense = AttentionDiffusionEmbedding(n_components=4, random_state=0)
                row["dense_fit_s"], dense = timed(lambda: dense.fit(C), 1)
                row["dense_circle_eigen_ratio_error"] = ratio_error(dense.laplacian_eigenvalues_)
            rows.append(row)
            print(json.dumps(row), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(dict(
        machine=platform.processor() or platform.machine(), threads=args.threads,
        torch=torch.__version__, rows=rows,
    ), indent=2))


if __name__ == "__main__":
    main()
