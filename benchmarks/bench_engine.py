"""Engine speed and memory against scikit-learn, in one process, on a fixed number of threads.

    python benchmarks/bench_engine.py          # n_train=100,000, n_test=10,000, d=32, 2 threads
    python benchmarks/bench_engine.py --quick  # a small smoke run

Times are medians over ``--repeats`` runs of ``predict``; each ratio divides the attention time by
the scikit-learn time measured in the same process. Peak extra memory is measured in a fresh
subprocess per case: resident memory sampled every 2 ms during ``predict``, minus the resident
memory just before it.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import threading
import time

import numpy as np


def _make_data(n_train, n_test, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(10, d))
    y = rng.integers(0, 10, n_train + n_test)
    X = (centers[y] + rng.normal(size=(n_train + n_test, d))).astype(dtype)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def _models(kind, T):
    """(attention model, scikit-learn baseline) for a case."""
    from sklearn.neighbors import KNeighborsClassifier

    from skattention import MetricAttentionClassifier, MetricAttentionRegressor

    if kind == "knn":
        return MetricAttentionClassifier(
            "euclidean", n_neighbors=5, temperature=np.inf, device="cpu"
        ), KNeighborsClassifier(5, algorithm="brute")
    if kind == "dense":
        return MetricAttentionClassifier(
            "euclidean", temperature=T, device="cpu"
        ), KNeighborsClassifier(5, algorithm="brute")
    if kind == "nw":
        return MetricAttentionRegressor(
            "euclidean", temperature=T, device="cpu"
        ), _SklearnNadarayaWatson(T)
    raise ValueError(kind)


class _SklearnNadarayaWatson:
    """Nadaraya-Watson regression the scikit-learn way: chunked rbf_kernel, then K y / K 1."""

    def __init__(self, temperature):
        self.gamma = 1.0 / temperature

    def fit(self, X, y):
        self.X_, self.y_ = X, np.asarray(y, dtype=np.float64)
        return self

    def predict(self, X):
        from sklearn.metrics.pairwise import rbf_kernel
        from sklearn.utils import gen_batches
        from sklearn.utils._chunking import get_chunk_n_rows

        out = np.empty(len(X))
        rows = get_chunk_n_rows(row_bytes=8 * len(self.X_))  # sklearn's working_memory (1 GiB)
        for batch in gen_batches(len(X), rows):
            k = rbf_kernel(X[batch], self.X_, gamma=self.gamma)
            out[batch] = k @ self.y_ / k.sum(1)
        return out


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRSS:
    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.extra_mib = (self.peak - self.base) / 2**20


def _memory_case(args):
    """Subprocess body: fit, warm up, then measure one predict's peak extra memory."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    Xtr, ytr, Xte, _ = _make_data(args.n_train, args.n_test, args.d, np.dtype(args.dtype))
    T = _temperature(Xtr)
    att, ref = _models(args.kind, T)
    model = att if args.which == "attention" else ref
    target = ytr if args.kind != "nw" else ytr.astype(np.float64)
    with threadpool_limits(args.threads):
        model.fit(Xtr, target)
        model.predict(Xte[:100])  # warm-up: lazy imports, thread pools
        with _PeakRSS() as peak:
            model.predict(Xte)
    print(json.dumps({"extra_mib": peak.extra_mib}))


def _temperature(Xtr):
    # A fixed, data-scaled temperature (no fitting cost in the timings): the median squared
    # distance of 200 points to their nearest neighbour.
    sub = Xtr[:200].astype(np.float64)
    d2 = ((sub[:, None] - Xtr[None, :5000].astype(np.float64)) ** 2).sum(-1)
    d2[d2 == 0] = np.inf
    return float(np.median(d2.min(1)))


def _measure_memory(kind, which, n_test, args):
    cmd = [
        sys.executable,
        __file__,
        "--memory-case",
        kind,
        "--which",
        which,
        "--n-train",
        str(args.n_train),
        "--n-test",
        str(n_test),
        "--d",
        str(args.d),
        "--dtype",
        args.dtype,
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["extra_mib"]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-train", type=int, default=100_000)
    parser.add_argument("--n-test", type=int, default=10_000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-n-test", type=int, nargs="*", default=None,
                        help="n_test values for the memory runs (default: n_test and 5 x n_test)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument(
        "--out", default=str(pathlib.Path(__file__).parent / "results" / "bench_engine.json")
    )
    parser.add_argument("--memory-case", choices=["knn", "dense", "nw"], help=argparse.SUPPRESS)
    parser.add_argument("--which", choices=["attention", "sklearn"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_case:
        args.kind = args.memory_case
        return _memory_case(args)
    if args.quick:
        args.n_train, args.n_test, args.repeats = 5000, 1000, 1

    import sklearn
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    Xtr, ytr, Xte, yte = _make_data(args.n_train, args.n_test, args.d, np.dtype(args.dtype))
    T = _temperature(Xtr)
    print(
        f"n_train={args.n_train} n_test={args.n_test} d={args.d} dtype={args.dtype} "
        f"threads={args.threads} "
        f"repeats={args.repeats} torch={torch.__version__} sklearn={sklearn.__version__} "
        f"cpu={platform.processor() or platform.machine()} T={T:.3g}"
    )
    results = {
        "config": vars(args)
        | {"temperature": T, "torch": torch.__version__, "sklearn": sklearn.__version__},
        "cases": [],
    }
    memory_sizes = args.memory_n_test or [args.n_test, 5 * args.n_test]
    with threadpool_limits(args.threads):
        for kind in ["knn", "dense", "nw"]:
            att, ref = _models(kind, T)
            target = ytr if kind != "nw" else ytr.astype(np.float64)
            att.fit(Xtr, target)
            ref.fit(Xtr, target)
            att.predict(Xte[:100]), ref.predict(Xte[:100])  # warm-up
            t_ref, p_ref = _median_time(lambda: ref.predict(Xte), args.repeats)
            t_att, p_att = _median_time(lambda: att.predict(Xte), args.repeats)
            if kind == "knn":
                agree = float(np.mean(p_att == p_ref))
            elif kind == "nw":
                agree = float(np.max(np.abs(p_att - p_ref)))
            else:
                agree = float(np.mean(p_att == yte))
            case = {"case": kind, "attention_s": t_att, "sklearn_s": t_ref, "ratio": t_att / t_ref,
                    "baseline": type(ref).__name__, "agreement": agree}
            for n_test in memory_sizes:
                case[f"attention_extra_mib_n_test_{n_test}"] = _measure_memory(
                    kind, "attention", n_test, args
                )
                case[f"sklearn_extra_mib_n_test_{n_test}"] = _measure_memory(
                    kind, "sklearn", n_test, args
                )
            results["cases"].append(case)
            mem = " ".join(
                f"n_test={n}: {case[f'attention_extra_mib_n_test_{n}']:.0f} vs "
                f"{case[f'sklearn_extra_mib_n_test_{n}']:.0f} MiB"
                for n in memory_sizes
            )
            label = {"knn": "agreement with sklearn", "nw": "max |diff|", "dense": "accuracy"}[kind]
            print(
                f"{kind:>5}: attention {t_att:.3f}s, {type(ref).__name__} {t_ref:.3f}s, "
                f"ratio {t_att / t_ref:.2f}; "
                f"{label} {agree:.3g}; peak extra memory {mem}"
            )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
