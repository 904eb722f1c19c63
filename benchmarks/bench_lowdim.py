"""Exact k nearest neighbours from low to high dimension: skattention against scikit-learn's
default (``NearestNeighbors()``: a k-d tree at low dimension, brute force above) and FAISS's
flat index.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_lowdim.py
    python benchmarks/bench_lowdim.py --quick        # a small smoke run
    python benchmarks/bench_lowdim.py --dims 3 8     # some dimensions only

For each dimension and data kind (20 Gaussian clusters, one Gaussian cloud), ``--keys`` keys
and ``--queries`` other points as queries (float32), ``kneighbors`` with k = 5 of:

* skattention's k-NN configuration, ``MetricAttentionClassifier("euclidean", n_neighbors=5,
  temperature=inf)`` fitted on the keys (its first call also builds the key tree or cells,
  remembered on the fitted keys: reported apart as ``first_call``);
* scikit-learn's ``NearestNeighbors(n_neighbors=5)`` with its default ``algorithm="auto"``
  (the method ``KNeighborsClassifier()`` uses), its fit reported apart;
* FAISS ``IndexFlatL2`` when ``faiss`` imports (``pip install faiss-cpu``; optional).

Times are medians of ``--repeats`` calls in one process, the contenders interleaved; the
neighbours are checked equal to scikit-learn's (up to float32 near ties: counted). Then
``radius_neighbors`` at d = 3 against scikit-learn's, and the fit of
``AttentionDiffusionEmbedding`` on a 10,000-point swiss roll with the key tree and without.
Each row records the load average before and after it (the machine may be shared), and the
run records the thread pools (threadpoolctl) and the CPU.
"""

import argparse
import importlib
import json
import os
import pathlib
import platform
import statistics
import time

import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "lowdim.json"


def make_data(kind, n, d, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "clusters":
        centres = rng.normal(scale=10, size=(20, d))
        X = centres[rng.integers(0, 20, n)] + rng.normal(size=(n, d))
    else:
        X = rng.normal(size=(n, d))
    return X.astype(np.float32)


def timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def thread_pools():
    from threadpoolctl import threadpool_info

    return [f"{p.get('user_api')}:{p.get('internal_api')} {p.get('version')} "
            f"arch={p.get('architecture')} threads={p.get('num_threads')}"
            for p in threadpool_info()]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def knn_row(kind, d, n_keys, n_queries, repeats):
    from sklearn.neighbors import NearestNeighbors

    from skattention import MetricAttentionClassifier

    X = make_data(kind, n_keys + n_queries, d, seed=d)
    keys, queries = X[:n_keys], X[n_keys:]
    y = np.arange(n_keys) % 2
    row = {"kind": kind, "d": d, "keys": n_keys, "queries": n_queries,
           "loadavg_start": os.getloadavg()}
    model = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf)
    start = time.perf_counter()
    model.fit(keys, y)
    row["skattention_fit"] = time.perf_counter() - start
    start = time.perf_counter()
    model.kneighbors(queries)
    row["skattention_first_call"] = time.perf_counter() - start
    start = time.perf_counter()
    sk = NearestNeighbors(n_neighbors=5).fit(keys)
    row["sklearn_fit"] = time.perf_counter() - start
    row["sklearn_method"] = sk._fit_method
    row["skattention"], (dist, idx) = timed(lambda: model.kneighbors(queries), repeats)
    row["sklearn"], (sk_dist, sk_idx) = timed(lambda: sk.kneighbors(queries), repeats)
    row["rows_differing_from_sklearn"] = int((idx != sk_idx).any(1).sum())
    row["max_distance_difference"] = float(np.abs(dist - sk_dist).max())
    try:
        import faiss
    except ImportError:
        row["faiss_flat"] = None
    else:
        index = faiss.IndexFlatL2(d)
        index.add(keys)
        row["faiss_flat"], _ = timed(lambda: index.search(queries, 5), repeats)
    row["loadavg_end"] = os.getloadavg()
    return row


def radius_row(n_keys, n_queries, repeats, radius=0.1):
    from sklearn.neighbors import NearestNeighbors

    from skattention import MetricAttentionClassifier

    X = make_data("gaussian", n_keys + n_queries, 3, seed=3)
    keys, queries = X[:n_keys], X[n_keys:]
    row = {"kind": "gaussian", "d": 3, "radius": radius, "keys": n_keys,
           "queries": n_queries, "loadavg_start": os.getloadavg()}
    model = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf)
    model.fit(keys, np.arange(n_keys) % 2)
    sk = NearestNeighbors().fit(keys)
    row["skattention"], (_, ind) = timed(lambda: model.radius_neighbors(queries, radius),
                                         repeats)
    row["sklearn"], (_, sk_ind) = timed(lambda: sk.radius_neighbors(queries, radius), repeats)
    row["rows_differing_from_sklearn"] = int(sum(
        not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(ind, sk_ind, strict=True)))
    row["loadavg_end"] = os.getloadavg()
    return row


def diffusion_row(n, repeats):
    """``AttentionDiffusionEmbedding`` fit on a swiss roll, with the key tree and without (its
    k-NN graph takes the engine's selection)."""
    from sklearn.datasets import make_swiss_roll

    from skattention.manifold import AttentionDiffusionEmbedding

    # the engine's private selection module, switched off for the comparison the way
    # bench_tabular's --set reaches module constants (by name, not through the door)
    _knn = importlib.import_module("skattention._engine._knn")

    X = make_swiss_roll(n, random_state=0)[0]
    row = {"n": n, "loadavg_start": os.getloadavg()}

    def fit():
        return AttentionDiffusionEmbedding(random_state=0).fit_transform(X)

    row["with_tree"], with_tree = timed(fit, repeats)
    tree_for = _knn.tree_for
    _knn.tree_for = lambda *args: None
    try:
        row["without_tree"], without = timed(fit, repeats)
    finally:
        _knn.tree_for = tree_for
    row["same_embedding"] = bool(np.array_equal(with_tree, without))
    row["loadavg_end"] = os.getloadavg()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[3, 8, 16, 64])
    parser.add_argument("--kinds", nargs="+", default=["clusters", "gaussian"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20k keys, 2k queries, 1 repeat")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.keys, args.queries, args.repeats = 20_000, 2_000, 1
    import torch

    run = {"cpu": cpu_name(), "torch_threads": torch.get_num_threads(),
           "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE",
                                                           "OPENBLAS_L2_SIZE")},
           "kneighbors": [], "radius_neighbors": [], "diffusion": []}
    for d in args.dims:
        for kind in args.kinds:
            row = knn_row(kind, d, args.keys, args.queries, args.repeats)
            run["kneighbors"].append(row)
            print(json.dumps(row), flush=True)
    if 3 in args.dims:
        run["radius_neighbors"].append(radius_row(args.keys, args.queries, args.repeats))
        print(json.dumps(run["radius_neighbors"][-1]), flush=True)
    run["diffusion"].append(diffusion_row(2_000 if args.quick else 10_000, args.repeats))
    print(json.dumps(run["diffusion"][-1]), flush=True)
    run["thread_pools"] = thread_pools()
    if not args.no_save:
        RESULTS.write_text(json.dumps(run, indent=1) + "\n")


if __name__ == "__main__":
    main()
