"""Fit speed under load (issue 33): a default learned fit while other processes are busy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_fit_load.py
    python benchmarks/bench_fit_load.py --quick   # a small smoke run

For each number of competing processes (``--busy``, default 0 1 3; each spins on one core),
``MetricAttentionClassifier()`` (defaults but a fixed ``--epochs`` and no early stopping, so the
work is the same under every load) and ``HistGradientBoostingClassifier()`` fit the same
``--rows`` x 20 table alternately, ``--repeats`` times each. Reported: the median fit time,
its ratio to the quiet median, and the fair-share ratio ``(cores + busy) / cores`` (a fit that
wants every core, beside ``busy`` spinning processes, gets ``cores / (cores + busy)`` of what it
wants): a fit that keeps its share of the machine takes at most that ratio. The load average
of the machine before each row is recorded too (other programs than the competitors count:
compare rows measured together).

``--models`` adds the library's other fits (issue 33: every fit path): ``network``
(``AttentionNetworkClassifier``, the same table, ``--epochs``), ``kmeans`` (``AttentionKMeans(8)``
on 4 x ``--rows`` blob points of 16 features), ``meanshift`` (``AttentionMeanShift()`` on
``--rows`` // 2 blob points of 4 features) and ``diffusion`` (``AttentionDiffusionEmbedding``
of a ``--rows``-point swiss roll).
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_load import busy_processes  # noqa: E402 (after sys.path)

RESULTS = HERE / "results" / "fit_load.json"
# where a run of other models than the default two is stored
PATHS_RESULTS = HERE / "results" / "fit_load_paths.json"


def _models(epochs, rows):
    """``{name: (make, X, y)}``: each model's constructor and the table it fits."""
    from sklearn.datasets import make_blobs, make_classification, make_swiss_roll
    from sklearn.ensemble import HistGradientBoostingClassifier

    from skattention import (
        AttentionDiffusionEmbedding,
        AttentionKMeans,
        AttentionMeanShift,
        AttentionNetworkClassifier,
        MetricAttentionClassifier,
    )

    X, y = make_classification(rows, 20, n_informative=10, random_state=0)
    blobs = make_blobs(4 * rows, 16, centers=8, random_state=0)[0]
    small_blobs = make_blobs(max(rows // 2, 10), 4, centers=5, random_state=0)[0]
    roll = make_swiss_roll(rows, random_state=0)[0]
    return {
        "skattention": (lambda: MetricAttentionClassifier(max_iter=epochs, early_stopping=False,
                                                          tol=0.0, random_state=0), X, y),
        "hgb": (lambda: HistGradientBoostingClassifier(random_state=0), X, y),
        "network": (lambda: AttentionNetworkClassifier(max_iter=epochs, random_state=0), X, y),
        "kmeans": (lambda: AttentionKMeans(8, random_state=0), blobs, None),
        "meanshift": (AttentionMeanShift, small_blobs, None),
        "diffusion": (lambda: AttentionDiffusionEmbedding(n_components=2, random_state=0), roll,
                      None),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 3])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["skattention", "hgb"],
                        choices=["skattention", "hgb", "network", "kmeans", "meanshift",
                                 "diffusion"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="default: results/fit_load.json, or results/fit_load_paths.json "
                        "for other --models than the default two")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.epochs, args.busy, args.repeats = 500, 1, [0, 1], 1

    import warnings

    from threadpoolctl import threadpool_info

    warnings.filterwarnings("ignore")  # the ConvergenceWarning of a fixed number of epochs
    every = _models(args.epochs, args.rows)
    models = {name: every[name] for name in args.models}
    cores = os.cpu_count()
    rows, quiet = [], {}
    for busy in args.busy:
        load = os.getloadavg()[0]
        procs = busy_processes(busy)
        try:
            time.sleep(1.0 if busy else 0.0)
            times = {name: [] for name in models}
            for _ in range(args.repeats):
                for name, (make, X, y) in models.items():
                    start = time.perf_counter()
                    make().fit(X, y)
                    times[name].append(time.perf_counter() - start)
        finally:
            for p in procs:
                p.terminate()
        for name, ts in times.items():
            median = statistics.median(ts)
            quiet.setdefault(name, median)
            # every core's worth of work and `busy` more spinners share `cores` cores
            fair = (cores + busy) / cores
            row = {"model": name, "busy": busy, "median_s": round(median, 3),
                   "vs_quiet": round(median / quiet[name], 2), "fair_share": round(fair, 2),
                   "load_before": round(load, 2), "times": [round(t, 3) for t in ts]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cpus": cores},
           "rows": args.rows, "epochs": args.epochs, "models": args.models,
           "threadpools": [f"{p['internal_api']} {p.get('version')} threads={p['num_threads']}"
                           for p in threadpool_info()],
           "results": rows}
    if not args.quick:
        default = sorted(args.models) == ["hgb", "skattention"]
        path = args.out or (RESULTS if default else PATHS_RESULTS)
        path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
