"""Clustering benchmark: AttentionKMeans vs KMeans, AttentionMeanShift vs MeanShift, spectral.

Quality: ARI and NMI against the true labels on synthetic sets (blobs with unequal variances,
anisotropic blobs, 8 blobs in 10-D, moons, circles) and real labelled sets (iris, wine, digits,
MNIST 5k), 10 seeds for the seeded methods (mean and standard deviation). Mean shift is
deterministic (one run). Times are ratios against the scikit-learn counterpart in the same run
(median over seeds). Speed: fit time at n = 100,000, d = 10 (median of 3). Memory: peak RSS of
AttentionKMeans fitting 1,000,000 2-D points, in a fresh subprocess. Sparse input: a text-like
CSR matrix (20,000 documents, 2,000 words, 1% non-zero, rows l2-normalised): fit times of
AttentionKMeans(temperature=0) on it, on the same matrix dense, and of KMeans on it (median of
3), their agreement, and the peak RSS the CSR fit adds (fresh subprocess, at working_memory 256
and 32 MiB) against the dense array's size.

Run from the repository root, one thread:

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_cluster.py [--quick] \
        [--only quality|speed|memory|sparse]

Writes ``benchmarks/results/cluster.json``.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch
from sklearn.cluster import KMeans, MeanShift, SpectralClustering, estimate_bandwidth
from sklearn.datasets import make_blobs, make_circles, make_moons
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from skattention.cluster import AttentionKMeans, AttentionMeanShift  # noqa: E402
from skattention.manifold import spectral_cluster_count as manifold_cluster_count  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "cluster.json"
SEEDS = list(range(10))


def spectral_cluster_count(X, bandwidth, threshold=1e-2, max_samples=1000, random_state=0):
    """Clusters the attention flow forms: eigenvalues of ``I - S`` below ``threshold``.

    :func:`skattention.manifold.spectral_cluster_count` with the mean-shift kernel
    ``exp(-||x_i - x_j||^2 / (2 h^2))`` (``epsilon = 2 h^2``, ``alpha = 0``: raw self-attention)
    on a subsample of at most ``max_samples`` points.
    """
    rng = np.random.RandomState(random_state)
    if X.shape[0] > max_samples:
        X = X[rng.choice(X.shape[0], max_samples, replace=False)]
    return manifold_cluster_count(
        X, epsilon=2 * bandwidth**2, threshold=threshold, max_clusters=len(X), random_state=0,
    )


def datasets(quick=False):
    out = {}
    X, y = make_blobs(n_samples=1500, cluster_std=[1.0, 2.5, 0.5], random_state=170)
    out["blobs_varied"] = (X, y, 3)
    X, y = make_blobs(n_samples=1500, random_state=170)
    out["aniso"] = (X @ np.array([[0.6, -0.6], [-0.4, 0.8]]), y, 3)
    X, y = make_blobs(n_samples=4000, n_features=10, centers=8, cluster_std=2.0, random_state=0)
    out["blobs8_10d"] = (X, y, 8)
    X, y = make_moons(n_samples=1000, noise=0.05, random_state=0)
    out["moons"] = (X, y, 2)
    X, y = make_circles(n_samples=1000, factor=0.5, noise=0.05, random_state=0)
    out["circles"] = (X, y, 2)
    import datasets as real  # benchmarks/datasets.py

    for name in ["iris", "wine", "digits"] + ([] if quick else ["mnist5k"]):
        X, y = real.load(name)
        if name == "wine":
            X = StandardScaler().fit_transform(X)
        out[name] = (X, y, len(np.unique(y)))
    return out


def _timed(fn):
    t = time.perf_counter()
    est = fn()
    return est, time.perf_counter() - t


def _summary(values):
    return {
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
        "values": [float(v) for v in values],
    }


def quality(quick=False):
    res = {}
    for name, (X, y, k) in datasets(quick).items():
        print(f"[{name}] n={X.shape[0]} d={X.shape[1]} k={k}", flush=True)
        r = {"n": int(X.shape[0]), "d": int(X.shape[1]), "k": int(k)}
        seeds = SEEDS[:3] if quick else SEEDS
        for label, make in [
            ("KMeans", lambda s: KMeans(k, random_state=s)),
            ("AttentionKMeans", lambda s: AttentionKMeans(k, random_state=s, device="cpu")),
            ("SpectralClustering", lambda s: SpectralClustering(
                k, affinity="nearest_neighbors", n_neighbors=10, random_state=s)),
        ]:
            aris, nmis, times, inertias = [], [], [], []
            for s in seeds:
                est, t = _timed(lambda: make(s).fit(X))
                aris.append(adjusted_rand_score(y, est.labels_))
                nmis.append(normalized_mutual_info_score(y, est.labels_))
                times.append(t)
                if hasattr(est, "inertia_"):
                    inertias.append(est.inertia_)
            r[label] = {
                "ari": _summary(aris),
                "nmi": _summary(nmis),
                "time_median_s": float(np.median(times)),
            }
            if inertias:
                r[label]["inertia"] = _summary(inertias)
            print(
                f"  {label:20s} ARI {np.mean(aris):.3f}+-{np.std(aris):.3f}  "
                f"NMI {np.mean(nmis):.3f}+-"
                f"{np.std(nmis):.3f}  t {np.median(times):.3f}s",
                flush=True,
            )
        r["time_ratio_AttentionKMeans_vs_KMeans"] = (
            r["AttentionKMeans"]["time_median_s"] / r["KMeans"]["time_median_s"]
        )
        if X.shape[0] <= 2000:  # scikit-learn's MeanShift runs one Python loop per seed
            for label, make in [
                ("MeanShift", lambda: MeanShift()),
                ("AttentionMeanShift", lambda: AttentionMeanShift(device="cpu")),
                (
                    "AttentionMeanShift_flat",
                    lambda: AttentionMeanShift(kernel="flat", device="cpu"),
                ),
            ]:
                est, t = _timed(lambda: make().fit(X))
                h = (
                    est.bandwidth
                    if isinstance(est, MeanShift) and est.bandwidth
                    else getattr(est, "bandwidth_", None)
                )
                if h is None:
                    h = estimate_bandwidth(X)
                entry = {
                    "ari": float(adjusted_rand_score(y, est.labels_)),
                    "nmi": float(normalized_mutual_info_score(y, est.labels_)),
                    "n_clusters": int(len(est.cluster_centers_)),
                    "time_s": t,
                    "bandwidth": float(h),
                }
                if label == "AttentionMeanShift":
                    entry["spectral_count"] = spectral_cluster_count(X, est.bandwidth_)
                r[label] = entry
                print(
                    f"  {label:20s} ARI {entry['ari']:.3f}  NMI {entry['nmi']:.3f}  "
                    f"clusters {entry['n_clusters']}"
                    + (
                        f" (spectral count {entry['spectral_count']})"
                        if "spectral_count" in entry
                        else ""
                    )
                    + f"  h {h:.3g}  t {t:.3f}s",
                    flush=True,
                )
            r["time_ratio_AttentionMeanShift_vs_MeanShift"] = (
                r["AttentionMeanShift"]["time_s"] / r["MeanShift"]["time_s"]
            )
            r["time_ratio_AttentionMeanShift_flat_vs_MeanShift"] = (
                r["AttentionMeanShift_flat"]["time_s"] / r["MeanShift"]["time_s"])
        res[name] = r
    return res


def speed(n=100_000, d=10, k=8, repeats=3):
    X, _ = make_blobs(n_samples=n, n_features=d, centers=k, cluster_std=2.0, random_state=0)
    out = {"n": n, "d": d, "k": k}
    for label, make in [
        ("KMeans", lambda s: KMeans(k, random_state=s)),
        ("AttentionKMeans", lambda s: AttentionKMeans(k, random_state=s, device="cpu")),
        (
            "AttentionKMeans_T0",
            lambda s: AttentionKMeans(k, temperature=0, random_state=s, device="cpu"),
        ),
    ]:
        make(0).fit(X[:2000])  # warm-up
        times = [_timed(lambda: make(s).fit(X))[1] for s in range(repeats)]
        out[label] = {"times_s": times, "median_s": float(np.median(times))}
        print(f"  speed {label:20s} median {np.median(times):.3f}s {times}", flush=True)
    out["ratio_AttentionKMeans_vs_KMeans"] = (
        out["AttentionKMeans"]["median_s"] / out["KMeans"]["median_s"]
    )
    out["ratio_AttentionKMeans_T0_vs_KMeans"] = (
        out["AttentionKMeans_T0"]["median_s"] / out["KMeans"]["median_s"]
    )
    return out


_MEMORY_CHILD = r"""
import numpy as np, torch, time, threading
torch.set_num_threads(1)
from skattention.cluster import AttentionKMeans
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
peak = [0.0]; stop = [False]
def sample():
    while not stop[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.005)
X = np.random.RandomState(0).normal(size=(1_000_000, 2))
X += np.repeat(np.arange(8), 125_000)[:, None] * 3.0
AttentionKMeans(8, random_state=0, device="cpu").fit(X[:1000])  # import and warm-up costs
base = rss()
th = threading.Thread(target=sample); th.start()
t = time.perf_counter()
km = AttentionKMeans(8, random_state=0, device="cpu").fit(X)
t = time.perf_counter() - t
stop[0] = True; th.join()
print({"baseline_rss_mib": base, "peak_rss_mib": peak[0], "fit_extra_mib": peak[0] - base,
       "data_mib": X.nbytes / 2**20, "fit_s": t})
"""


def memory():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(pathlib.Path(__file__).resolve().parents[1]),
    )
    if out.returncode:
        raise RuntimeError(out.stderr)
    res = eval(out.stdout.strip().splitlines()[-1])
    print(f"  memory {res}", flush=True)
    return res


def text_like(n=20_000, d=2_000, k=8, words=20, seed=0):
    """A CSR matrix like TF-IDF rows: each document draws ``words`` word counts, 70% from its
    topic's slice of the vocabulary, rows l2-normalised; and the topics."""
    import scipy.sparse as sp

    rng = np.random.RandomState(seed)
    topics = rng.randint(k, size=n)
    own = rng.rand(n, words) < 0.7
    cols = np.where(own, topics[:, None] * (d // k) + rng.randint(d // k, size=(n, words)),
                    rng.randint(d, size=(n, words)))
    X = sp.csr_matrix((1.0 + rng.poisson(1.0, size=n * words), cols.ravel(),
                       np.arange(0, n * words + 1, words)), shape=(n, d))
    X.sum_duplicates()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(1))).ravel()
    return sp.diags(1 / norms) @ X, topics


_SPARSE_MEMORY_CHILD = r"""
import sys, time, threading, torch
torch.set_num_threads(1)
sys.path.insert(0, "benchmarks")
from bench_cluster import text_like
from skattention.cluster import AttentionKMeans
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
X, _ = text_like()
AttentionKMeans(8, temperature=0, random_state=0).fit(X[:500])  # import and warm-up costs
base, peak, stop = rss(), [0.0], [False]
def sample():
    while not stop[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.005)
th = threading.Thread(target=sample); th.start()
AttentionKMeans(8, temperature=0, random_state=0).fit(X)
stop[0] = True; th.join()
print({"fit_extra_mib": peak[0] - base, "dense_mib": X.shape[0] * X.shape[1] * 8 / 2**20,
       "csr_mib": (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 2**20})
"""


def sparse_input(k=8, repeats=3):
    X, topics = text_like(k=k)
    dense = X.toarray()
    out = {"n": X.shape[0], "d": X.shape[1], "k": k, "nnz": int(X.nnz)}
    fits = {}
    for label, make, data in [
        ("KMeans_csr", lambda s: KMeans(k, random_state=s, algorithm="lloyd"), X),
        ("AttentionKMeans_T0_csr", lambda s: AttentionKMeans(k, temperature=0, random_state=s),
         X),
        ("AttentionKMeans_T0_dense", lambda s: AttentionKMeans(k, temperature=0,
                                                               random_state=s), dense),
    ]:
        make(0).fit(data[:500])  # warm-up
        runs = [_timed(lambda s=s: make(s).fit(data)) for s in range(repeats)]
        fits[label] = runs[0][0]
        times = [t for _, t in runs]
        out[label] = {"times_s": times, "median_s": float(np.median(times)),
                      "ari_topics": float(adjusted_rand_score(topics, runs[0][0].labels_))}
        print(f"  sparse {label:26s} median {np.median(times):.3f}s {times}", flush=True)
    ours, ref = fits["AttentionKMeans_T0_csr"], fits["KMeans_csr"]
    out["csr_equals_dense_bitwise"] = bool(
        np.array_equal(ours.cluster_centers_, fits["AttentionKMeans_T0_dense"].cluster_centers_)
    )
    out["ari_csr_vs_KMeans_csr"] = float(adjusted_rand_score(ref.labels_, ours.labels_))
    # a document sharing no word with several centres is equally far from them: each fit
    # breaks such ties by its rounding, KMeans too between the CSR matrix and the dense array
    ref_dense = KMeans(k, random_state=0, algorithm="lloyd").fit(dense)
    out["ari_KMeans_csr_vs_KMeans_dense"] = float(adjusted_rand_score(ref.labels_,
                                                                      ref_dense.labels_))
    for budget in ("256", "32"):  # MiB of working memory: the default, and a small one
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   SKATTENTION_WORKING_MEMORY=budget)
        child = subprocess.run([sys.executable, "-c", _SPARSE_MEMORY_CHILD], capture_output=True,
                               text=True, env=env,
                               cwd=str(pathlib.Path(__file__).resolve().parents[1]))
        if child.returncode:
            raise RuntimeError(child.stderr)
        out[f"memory_working_memory_{budget}"] = eval(child.stdout.strip().splitlines()[-1])
        print(f"  sparse memory at {budget} MiB {out[f'memory_working_memory_{budget}']}",
              flush=True)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["quality", "speed", "memory", "sparse"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["setting"] = {"torch_threads": 1, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                          "torch": torch.__version__}
    if args.only in (None, "speed"):
        results["speed"] = speed()
    if args.only in (None, "memory"):
        results["memory_1M_2d"] = memory()
    if args.only in (None, "sparse"):
        results["sparse_text_like"] = sparse_input()
    if args.only in (None, "quality"):
        results["quality"] = quality(args.quick)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
