"""Fit and predict time of the learned-metric classifier, with ratios against scikit-learn.

    python benchmarks/bench_learned_speed.py            # all three measurements, 2 threads
    python benchmarks/bench_learned_speed.py --only predict

1. Fit time of MetricAttentionClassifier (defaults) against NeighborhoodComponentsAnalysis
   (defaults) at n = 2,000 and 5,000 rows of KEEL letter (16 features, 26 classes), and the
   absolute fit time at n = 20,000 (all of letter).
2. Predict time of a learned classifier (defaults except max_iter, which does not change predict
   cost) against KNeighborsClassifier(algorithm="brute") with n_train=100,000, n_test=10,000,
   d=32, the map applied to the test points included; float64 and float32 data.

Fit times are single runs (training is long); predict times are medians over ``--repeats``.
"""

import argparse
import json
import pathlib
import statistics
import time

import numpy as np
from datasets import load


def fit_times(args):
    from sklearn.neighbors import NeighborhoodComponentsAnalysis

    from skattention import MetricAttentionClassifier

    X, y = load("letter")
    perm = np.random.default_rng(0).permutation(len(X))
    X, y = X[perm], y[perm]
    out = []
    for n in [2000, 5000, 20000]:
        row = {"n": n}
        start = time.perf_counter()
        clf = MetricAttentionClassifier(random_state=0).fit(X[:n], y[:n])
        row["attention_fit_s"] = time.perf_counter() - start
        row["attention_epochs"] = clf.n_iter_
        if n <= 5000:
            start = time.perf_counter()
            NeighborhoodComponentsAnalysis(random_state=0).fit(X[:n], y[:n])
            row["nca_fit_s"] = time.perf_counter() - start
            row["ratio"] = row["attention_fit_s"] / row["nca_fit_s"]
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def predict_times(args):
    from sklearn.neighbors import KNeighborsClassifier

    from skattention import MetricAttentionClassifier

    rng = np.random.default_rng(0)
    n_train, n_test, d = 100_000, 10_000, 32
    centers = rng.normal(scale=3.0, size=(10, d))
    labels = rng.integers(0, 10, n_train + n_test)
    X = centers[labels] + rng.normal(size=(n_train + n_test, d))
    out = []
    for dtype in [np.float64, np.float32]:
        Xd = X.astype(dtype)
        Xtr, Xte, ytr = Xd[:n_train], Xd[n_train:], labels[:n_train]
        knn = KNeighborsClassifier(5, algorithm="brute").fit(Xtr, ytr)
        row = {"dtype": np.dtype(dtype).name}
        for label, model in [
            ("dense", MetricAttentionClassifier(max_iter=2, random_state=0)),
            ("knn_prior", MetricAttentionClassifier(n_neighbors=5, max_iter=2, random_state=0)),
        ]:
            model.fit(Xtr, ytr)
            model.predict(Xte[:100])
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                model.predict(Xte)
                times.append(time.perf_counter() - start)
            row[f"attention_{label}_s"] = statistics.median(times)
        knn.predict(Xte[:100])
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            knn.predict(Xte)
            times.append(time.perf_counter() - start)
        row["knn_brute_s"] = statistics.median(times)
        row["ratio_dense"] = row["attention_dense_s"] / row["knn_brute_s"]
        row["ratio_knn_prior"] = row["attention_knn_prior_s"] / row["knn_brute_s"]
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["fit", "predict"])
    parser.add_argument(
        "--out", default=str(pathlib.Path(__file__).parent / "results" / "bench_learned_speed.json")
    )
    args = parser.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    results = {"threads": args.threads, "torch": torch.__version__}
    with threadpool_limits(args.threads):
        if args.only in (None, "fit"):
            results["fit"] = fit_times(args)
        if args.only in (None, "predict"):
            results["predict"] = predict_times(args)
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    previous.update(results)
    path.write_text(json.dumps(previous, indent=2))


if __name__ == "__main__":
    main()
