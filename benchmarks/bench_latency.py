"""One row at a time: the latency of ``predict(X[i:i + 1])``, as a web service would call it.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_latency.py
    python benchmarks/bench_latency.py --quick            # a small smoke run
    python benchmarks/bench_latency.py --profile default  # where one call's time goes

Every model is fitted once on the same data (``--n-train`` rows, ``--d`` features, 2 classes),
then each model's single-row ``predict`` is called on ``--calls`` different rows, the models
interleaved call by call so that a change in the machine's load reaches all of them alike. The
figure is the median latency per call; ratios divide by HistGradientBoosting's median from the
same run. ``--profile NAME`` runs cProfile over the calls of one model and prints the functions
with the most own time, so that the per-call overhead (validation, device and thread set-up,
block planning) can be told from the arithmetic.
"""

import argparse
import cProfile
import json
import pathlib
import platform
import pstats
import statistics
import time

import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "latency.json"


def make_data(n_train, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_train + 1000, d))
    y = (X[:, 0] + 0.5 * X[:, 1] ** 2 + rng.normal(scale=0.5, size=len(X)) > 0.5).astype(int)
    return X[:n_train], y[:n_train], X[n_train:]


def make_models(names, max_iter):
    """``{name: unfitted model}`` for the names asked for."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from skattention import AttentionNetworkClassifier, MetricAttentionClassifier

    factories = {
        # the default learned classifier (max_iter only shortens the fit; predict is unchanged)
        "default": lambda: MetricAttentionClassifier(max_iter=max_iter, random_state=0),
        # the fixed-metric k-NN configuration
        "knn_config": lambda: MetricAttentionClassifier(
            "euclidean", n_neighbors=5, temperature=np.inf
        ),
        # the IPN network (a row attends to the training set prepared once per fitted network)
        "network": lambda: AttentionNetworkClassifier(max_iter=max_iter, random_state=0),
        "KNeighborsClassifier": lambda: make_pipeline(StandardScaler(), KNeighborsClassifier(5)),
        "HistGradientBoosting": lambda: HistGradientBoostingClassifier(random_state=0),
        "LogisticRegression": lambda: make_pipeline(StandardScaler(), LogisticRegression()),
    }
    unknown = set(names) - set(factories)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; choose from {sorted(factories)}")
    return {name: factories[name]() for name in names}


def measure(models, X_rows, warmup=5):
    """``{name: [seconds per call]}``: single-row predicts, models interleaved call by call."""
    take = X_rows.iloc if hasattr(X_rows, "iloc") else X_rows  # DataFrame rows or array rows
    for model in models.values():
        for i in range(warmup):
            model.predict(take[i : i + 1])
    times = {name: [] for name in models}
    names = list(models)
    order = np.random.default_rng(0)
    for i in range(len(X_rows)):
        row = take[i : i + 1]
        # a new order for every row: each model follows every other one about equally often (a
        # call finds less of its code and data in the caches after one that streamed megabytes,
        # more after one that ran the same library code)
        for name in order.permutation(names):
            model = models[name]
            start = time.perf_counter()
            model.predict(row)
            times[name].append(time.perf_counter() - start)
    return times


def profile(model, X_rows, top):
    """Print the ``top`` functions by own time over single-row predicts of ``model``."""
    model.predict(X_rows[:1])
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(len(X_rows)):
        model.predict(X_rows[i : i + 1])
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    print(f"{len(X_rows)} calls, {1e3 * total / len(X_rows):.3f} ms per call under cProfile")
    stats.sort_stats("tottime").print_stats(top)


def blas_kernel():
    from threadpoolctl import threadpool_info

    return sorted({f"{p['internal_api']}:{p.get('architecture')}" for p in threadpool_info()})


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-train", type=int, default=9000)
    parser.add_argument("--d", type=int, default=20)
    parser.add_argument("--calls", type=int, default=500, help="single-row predicts per model")
    parser.add_argument("--max-iter", type=int, default=50, help="training epochs of 'default'")
    parser.add_argument(
        "--models",
        default="default,knn_config,KNeighborsClassifier,HistGradientBoosting,LogisticRegression",
    )
    parser.add_argument("--profile", metavar="NAME", help="profile this model instead of timing")
    parser.add_argument("--top", type=int, default=25, help="rows of the profile")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--frame", action="store_true",
                        help="fit on and predict one-row pandas DataFrames (named columns)")
    parser.add_argument("--out", default=None,
                        help="results file (default: results/latency.json, with --frame "
                             "results/latency_frame.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_train, args.calls, args.max_iter = 500, 20, 2

    import sklearn
    import torch

    X, y, X_rows = make_data(args.n_train, args.d)
    X_rows = X_rows[: args.calls]
    if args.frame:  # what a web service decoding JSON passes: one-row DataFrames
        import pandas as pd

        columns = [f"x{j}" for j in range(args.d)]
        X, X_rows = pd.DataFrame(X, columns=columns), pd.DataFrame(X_rows, columns=columns)
    names = [args.profile] if args.profile else args.models.split(",")
    models = make_models(names, args.max_iter)
    for model in models.values():
        model.fit(X, y)
    if args.profile:
        return profile(models[args.profile], X_rows, args.top)

    times = measure(models, X_rows)
    medians = {name: statistics.median(t) for name, t in times.items()}
    baseline = medians.get("HistGradientBoosting")
    header = (
        f"n_train={args.n_train} d={args.d} calls={args.calls} frame={args.frame} "
        f"torch={torch.__version__} "
        f"threads={torch.get_num_threads()} sklearn={sklearn.__version__} "
        f"cpu={platform.processor() or platform.machine()} blas={blas_kernel()}"
    )
    print(header)
    rows = []
    for name, median in medians.items():
        ratio = median / baseline if baseline else float("nan")
        p90 = float(np.quantile(times[name], 0.9))
        print(
            f"{name:>22}: median {1e3 * median:7.3f} ms, p90 {1e3 * p90:7.3f} ms, "
            f"{1 / median:8.0f} predictions/s, ratio to HistGradientBoosting {ratio:.2f}"
        )
        rows.append({"model": name, "median_ms": 1e3 * median, "p90_ms": 1e3 * p90,
                     "ratio_to_hgb": ratio})
    if not args.quick:
        out = args.out or RESULTS.with_name("latency_frame.json" if args.frame else RESULTS.name)
        pathlib.Path(out).write_text(json.dumps({"setup": header, "results": rows}, indent=1))
        print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
