"""AttentionDiffusionEmbedding at scale: the swiss roll from 20,000 to 1,000,000 points (issue 36).

Each fit runs in a child process of its own, so that its exit status (a crash is a negative
signal number) and its peak resident memory (``ru_maxrss``) are its own.

1. ``--sizes``: the swiss roll (3-D, noise 0.05) with default settings: fit time, the time of
   each step (k-NN graph, with the bandwidth rule's search of its sampled points since the two
   share it; bandwidth; operator; eigenpairs), peak memory, the operator chosen,
   and the quality: the largest |correlation| of a component with the roll's parameter ``t``
   and the trustworthiness (10 neighbours) on 2,000 sampled points; the same for
   ``SpectralEmbedding(affinity="nearest_neighbors")`` with the same number of neighbours up to
   ``--spectral-max-n`` points.
2. ``--crash``: the case of issue 33, the dense operator with the shift-invert solver at 20,000
   points (``n_neighbors=None, eigen_solver="arpack"``: 3.2 GB, a Cholesky of 20,000 x 20,000),
   and the root cause on its own: SciPy's ``cho_factor`` of a 16,000 x 16,000 matrix with
   OpenBLAS on its default threads and on one, without torch imported.

Usage: python benchmarks/bench_diffusion_scale.py [--sizes 20000 100000 1000000] [--crash]
Writes benchmarks/results/diffusion_scale.json (the rows of this run, merged by name).
"""

import argparse
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "diffusion_scale.json"
STEPS = ("knn_graph_and_reference", "auto_epsilon", "diffusion_operator", "top_eigenpairs")


def swiss_roll(n):
    from sklearn.datasets import make_swiss_roll

    return make_swiss_roll(n, noise=0.05, random_state=0)


def cpu_seconds():
    """CPU time of this process so far (user and system, all threads): on a machine shared with
    other work it varies less than the wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def quality(embedding, X, t):
    import numpy as np
    from sklearn.manifold import trustworthiness

    corr = max(abs(np.corrcoef(embedding[:, i], t)[0, 1]) for i in range(embedding.shape[1]))
    sample = np.random.default_rng(0).choice(len(X), min(2000, len(X)), replace=False)
    trust = trustworthiness(X[sample], embedding[sample], n_neighbors=10)
    return dict(t_correlation=float(corr), trustworthiness=float(trust))


def child_fit(args):
    """One fit in this process; prints one JSON line."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from skattention.manifold import AttentionDiffusionEmbedding, _embedding

    steps = {}

    def timed(name, function):
        def run(*a, **k):
            start = time.perf_counter()
            out = function(*a, **k)
            steps[name] = steps.get(name, 0.0) + time.perf_counter() - start
            return out

        return run

    for name in STEPS:  # time each step where the estimator calls it
        setattr(_embedding, name, timed(name, getattr(_embedding, name)))
    X, t = swiss_roll(args.child)
    params = json.loads(args.params)
    est = AttentionDiffusionEmbedding(n_components=2, random_state=0, **params)
    start, cpu = time.perf_counter(), cpu_seconds()
    embedding = est.fit_transform(X)
    fit_s = time.perf_counter() - start
    row = dict(n=args.child, params=params, fit_s=fit_s, fit_cpu_s=cpu_seconds() - cpu,
               steps_s=steps,
               n_neighbors_=est.n_neighbors_, epsilon_=est.epsilon_,
               eigenvalues_=est.eigenvalues_.tolist(), **quality(embedding, X, t))
    if args.transform:
        start, cpu = time.perf_counter(), cpu_seconds()
        new = est.transform(X[: args.transform] + 0.01)
        row["transform_s"] = time.perf_counter() - start
        row["transform_cpu_s"] = cpu_seconds() - cpu
        row["transform_rows"] = len(new)
        row["transform_max_abs_vs_embedding"] = float(np.abs(new - embedding[: len(new)]).max())
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(row), flush=True)


def child_spectral(args):
    import torch
    from sklearn.manifold import SpectralEmbedding

    torch.set_num_threads(args.threads)
    X, t = swiss_roll(args.child)
    se = SpectralEmbedding(n_components=2, affinity="nearest_neighbors",
                           n_neighbors=args.k, random_state=0)
    start, cpu = time.perf_counter(), cpu_seconds()
    embedding = se.fit_transform(X)
    row = dict(n=args.child, spectral_embedding_n_neighbors=args.k,
               fit_s=time.perf_counter() - start, fit_cpu_s=cpu_seconds() - cpu,
               **quality(embedding, X, t),
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(row), flush=True)


def child_cholesky(args):
    """SciPy's Cholesky of an n x n matrix alone (no torch): the root cause of the crash."""
    import numpy as np
    from scipy.linalg import cho_factor
    from threadpoolctl import threadpool_info, threadpool_limits

    n = args.child
    A = np.full((n, n), 1.0 / n)
    A.flat[:: n + 1] += 1.0
    threads = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    start = time.perf_counter()
    if args.blas_threads:
        with threadpool_limits(args.blas_threads, user_api="blas"):
            cho_factor(A, overwrite_a=True, check_finite=False)
    else:
        cho_factor(A, overwrite_a=True, check_finite=False)
    print(json.dumps(dict(n=n, blas_threads=args.blas_threads or threads,
                          seconds=time.perf_counter() - start)), flush=True)


def run_child(extra, timeout):
    """Run this script as a child; ``(exit status, JSON row or None, seconds)``, the status
    ``"timeout"`` for a child stopped after ``timeout`` seconds."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, *extra], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:  # recorded as such, not a crash of the benchmark
        return "timeout", {"timeout_s": timeout}, time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
    return proc.returncode, json.loads(lines[-1]) if lines else None, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[20000, 100000, 1000000])
    parser.add_argument("--spectral-max-n", type=int, default=50000)
    parser.add_argument("--neighbors", type=int, default=15,
                        help="SpectralEmbedding's n_neighbors (the default graph's k)")
    parser.add_argument("--transform", type=int, default=0,
                        help="also time transform of this many perturbed training points")
    parser.add_argument("--crash", action="store_true")
    parser.add_argument("--spectral-only", action="store_true",
                        help="only SpectralEmbedding at --sizes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=3600)
    # child modes
    parser.add_argument("--child", type=int)
    parser.add_argument("--mode", default="fit")
    parser.add_argument("--params", default="{}")
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--blas-threads", type=int, default=0)
    args = parser.parse_args()
    if args.child is not None:
        {"fit": child_fit, "spectral": child_spectral, "cholesky": child_cholesky}[args.mode](
            args)
        return
    rows = {}

    def record(name, extra):
        status, row, seconds = run_child(extra, args.timeout)
        rows[name] = dict(exit_status=status, wall_s=seconds, **(row or {}))
        print(name, json.dumps(rows[name]), flush=True)

    common = ["--threads", str(args.threads)]
    for n in args.sizes:
        if not args.spectral_only:
            record(f"default-{n}", ["--child", str(n), "--transform", str(args.transform),
                                    *common])
        if n <= args.spectral_max_n:
            record(f"spectral-{n}", ["--child", str(n), "--mode", "spectral", "--k",
                                     str(args.neighbors), *common])
    if args.crash:
        record("dense-arpack-20000", ["--child", "20000", "--params",
                                      json.dumps(dict(n_neighbors=None, eigen_solver="arpack")),
                                      *common])
        for blas in (0, 1):
            record(f"cho_factor-16000-blas{blas or 'default'}",
                   ["--child", "16000", "--mode", "cholesky", "--blas-threads", str(blas)])
    previous = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else {}
    previous.update(rows)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(dict(
        machine=platform.processor() or platform.machine(), threads=args.threads,
        load_average_at_end=os.getloadavg(), rows=previous), indent=2))


if __name__ == "__main__":
    main()
