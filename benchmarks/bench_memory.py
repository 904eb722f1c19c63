"""Peak extra memory of prediction and clustering on 1,000,000 points against working_memory.

    python benchmarks/bench_memory.py          # n_train=1,000,000, n_test=2,000, d=16, 256, 64 MiB
    python benchmarks/bench_memory.py --quick  # n_train=100,000, a smoke run

Method: every case runs in a fresh subprocess (``--case``) on one thread. It imports, creates the
data (float32, 10 Gaussian blobs), fits (or loads the pickled learned model, fitted once by the
parent), warms up on 100 queries, then measures one call: resident memory (``/proc/self/statm``)
is sampled every 2 ms by a thread during the call (``_PeakRSS`` of bench_engine.py) and the
figure is the peak minus the resident memory just before the call. ``MALLOC_MMAP_THRESHOLD_=65536``
is set so that glibc returns freed buffers to the system (otherwise the warm-up's freed blocks
are reused without showing in the resident set, and the peak is underestimated). The bound checked
is
``working_memory + model size``, the model size being the bytes of the arrays the fitted
estimator holds (training keys, values, priors; centroids for k-means). For AttentionKMeans.fit
the centred copy of X (like scikit-learn's KMeans with ``copy_x=True``) is added to the bound and
reported separately.
"""

import argparse
import json
import os
import pathlib
import pickle
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "results" / "memory.json"
CASES = ["dense", "knn5", "regressor", "mlp", "kmeans_fit", "kmeans_predict"]


def _data(n, n_test, d, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(10, d))
    y = rng.integers(0, 10, n + n_test)
    X = (centers[y] + rng.normal(size=(n + n_test, d))).astype(np.float32)
    return X[:n], y[:n], X[n:]


def _model_bytes(est):
    total = 0
    for value in vars(est).values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif hasattr(value, "parameters"):
            total += sum(p.numel() * p.element_size() for p in value.parameters())
    return total


def _case(args):
    import torch
    from bench_engine import _PeakRSS

    import skattention
    from skattention import MetricAttentionClassifier, MetricAttentionRegressor
    from skattention.cluster import AttentionKMeans

    torch.set_num_threads(1)
    X, y, Xq = _data(args.n_train, args.n_test, args.d)
    extra_bound = 0
    with skattention.config_context(working_memory=args.budget):
        if args.case == "mlp":
            with open(args.model, "rb") as f:
                est = pickle.load(f)
        elif args.case.startswith("kmeans"):
            est = AttentionKMeans(8, random_state=0, device="cpu")
            if args.case == "kmeans_predict":
                est.fit(X[:100000])
        else:
            Est = (
                MetricAttentionRegressor if args.case == "regressor" else MetricAttentionClassifier
            )
            est = Est(
                metric="euclidean",
                temperature=1.0,
                n_neighbors=5 if args.case == "knn5" else None,
                device="cpu",
            )
            est.fit(X, y.astype(np.float64) if args.case == "regressor" else y)
        if args.case == "kmeans_fit":
            AttentionKMeans(8, random_state=0, device="cpu", max_iter=5).fit(X[:2000])  # warm-up
            call = lambda: est.fit(X)  # noqa: E731
            extra_bound = X.nbytes  # the centred copy
        elif args.case == "kmeans_predict":
            est.predict(X[:100])
            call = lambda: est.predict(X)  # noqa: E731
        else:
            est.predict(Xq[:100])
            call = lambda: est.predict(Xq)  # noqa: E731
        start = time.perf_counter()
        with _PeakRSS() as peak:
            call()
        seconds = time.perf_counter() - start
    print(json.dumps(dict(extra_mib=peak.extra_mib, model_mib=_model_bytes(est) / 2**20,
                          copy_mib=extra_bound / 2**20, seconds=seconds)))


def _fit_mlp(args, path):
    from skattention import MetricAttentionClassifier

    X, y, _ = _data(args.n_train, 0, args.d)
    est = MetricAttentionClassifier(
        metric="mlp", max_iter=1, early_stopping=False, random_state=0, device="cpu"
    )
    start = time.perf_counter()
    est.fit(X, y)
    with open(path, "wb") as f:
        pickle.dump(est, f)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n-train", type=int, default=1_000_000)
    parser.add_argument("--n-test", type=int, default=2_000)
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--budgets", type=float, nargs="+", default=[256, 64])
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--budget", type=float)
    parser.add_argument("--model", default="/tmp/skattention_bench_memory_mlp.pkl")
    parser.add_argument(
        "--reuse-model", action="store_true", help="skip the mlp fit if --model exists"
    )
    args = parser.parse_args()
    if args.quick:
        args.n_train, args.n_test = 100_000, 2_000
    if args.case:
        return _case(args)
    model = args.model
    rows = []
    if "mlp" in args.cases and not (args.reuse_model and pathlib.Path(model).exists()):
        print(
            f"fitting the mlp metric on {args.n_train} points (max_iter=1): "
            f"{_fit_mlp(args, model):.0f} s",
            flush=True,
        )
    print(
        f"{'case':<16}{'budget MiB':>11}{'model MiB':>10}{'copy MiB':>9}{'peak extra MiB':>15}"
        f"{'bound MiB':>10}{'s':>7}  ok"
    )
    for case in args.cases:
        for budget in args.budgets:
            cmd = [
                sys.executable,
                __file__,
                "--case",
                case,
                "--budget",
                str(budget),
                "--n-train",
                str(args.n_train),
                "--n-test",
                str(args.n_test),
                "--d",
                str(args.d),
                "--model",
                model,
            ]
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536"),
            )
            if out.returncode:
                raise RuntimeError(out.stderr)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            bound = budget + r["model_mib"] + r["copy_mib"]
            row = dict(
                case=case,
                budget_mib=budget,
                n_train=args.n_train,
                n_test=args.n_test,
                d=args.d,
                model_mib=r["model_mib"],
                copy_mib=r["copy_mib"],
                peak_extra_mib=r["extra_mib"],
                bound_mib=bound,
                within_bound=r["extra_mib"] <= bound,
                seconds=r["seconds"],
            )
            rows.append(row)
            print(
                f"{case:<16}{budget:>11.0f}{r['model_mib']:>10.1f}{r['copy_mib']:>9.1f}{r['extra_mib']:>15.1f}"
                f"{bound:>10.1f}{r['seconds']:>7.1f}  {'yes' if row['within_bound'] else 'NO'}",
                flush=True,
            )
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(
            json.dumps(
                dict(threads=1, method=__doc__.split("Method: ")[1].strip(), rows=rows), indent=2
            )
        )
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
