"""Does ``GridSearchCV(n_jobs=2)`` oversubscribe the cores? Wall time and torch threads per worker.

    python benchmarks/bench_threads.py            # n=2000, d=32, max_iter=5, 8 candidates x 3 folds
    python benchmarks/bench_threads.py --quick    # a small smoke run

Each configuration runs in a fresh subprocess (so torch's thread settings start from the
defaults). The grid is over :class:`~skattention.MetricAttentionClassifier`; a scorer records
``torch.get_num_threads()`` inside the worker that evaluates each split, so the table shows the
intra-op threads torch really used there.

Configurations:

* ``n_jobs=1``: sequential, torch on all cores;
* ``loky n_jobs=2``: joblib's default process backend, which starts each worker with
  ``OMP_NUM_THREADS = cpu_count // n_jobs`` (torch reads it);
* ``threading n_jobs=2``: worker threads start with torch's process default (all cores each),
  so two workers run ``2 x cpu_count`` threads;
* ``threading n_jobs=2 + torch.set_num_threads``: the documented recipe, calling
  ``torch.set_num_threads(cpu_count // n_jobs)`` before the search (threads created afterwards
  inherit it);
* ``threading n_jobs=2 + threadpool_limits``: ``threadpoolctl.threadpool_limits`` around the
  search, which limits only the calling thread, not joblib's worker threads.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

_CONFIGS = {
    "n_jobs=1": ("sequential", 1, None),
    "loky n_jobs=2": ("loky", 2, None),
    "threading n_jobs=2": ("threading", 2, None),
    "threading n_jobs=2 + torch.set_num_threads": ("threading", 2, "torch"),
    "threading n_jobs=2 + threadpool_limits": ("threading", 2, "threadpoolctl"),
}


def _torch_threads(estimator, X, y):
    import torch

    return float(torch.get_num_threads())


def _run(name, n, d, max_iter):
    """Run one configuration in this process; return its measurements."""
    import numpy as np
    import threadpoolctl
    import torch
    from joblib import parallel_config
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV

    from skattention import MetricAttentionClassifier

    backend, n_jobs, fix = _CONFIGS[name]
    X, y = make_classification(n_samples=n, n_features=d, n_informative=d // 2, n_classes=4,
                               random_state=0)
    grid = {"metric": ["linear", "mlp"], "hidden_size": [32, 64], "temperature": ["auto", 1.0]}
    est = MetricAttentionClassifier(
        max_iter=max_iter, early_stopping=False, random_state=0, device="cpu"
    )
    search = GridSearchCV(est, grid, cv=3, n_jobs=n_jobs, refit=False,
                          scoring={"accuracy": "accuracy", "torch_threads": _torch_threads})
    cores = os.cpu_count()
    if fix == "torch":
        torch.set_num_threads(max(1, cores // n_jobs))
    start = time.perf_counter()
    with parallel_config(backend=backend):
        if fix == "threadpoolctl":
            with threadpoolctl.threadpool_limits(max(1, cores // n_jobs)):
                search.fit(X, y)
        else:
            search.fit(X, y)
    wall = time.perf_counter() - start
    res = search.cv_results_
    return {
        "config": name,
        "wall_s": round(wall, 2),
        "torch_threads_in_workers": sorted({int(t) for t in np.ravel(
            [res[f"split{i}_test_torch_threads"] for i in range(3)])}),
        "mean_accuracy": [round(float(a), 4) for a in res["mean_test_accuracy"]],
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--max-iter", type=int, default=5)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per configuration (median reported)"
    )
    parser.add_argument(
        "--output", default=str(pathlib.Path(__file__).parent / "results" / "threads.json")
    )
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.n, args.max_iter = 600, 2
    if args._child:
        print(json.dumps(_run(args._child, args.n, args.d, args.max_iter)))
        return

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    print(
        f"cores: {os.cpu_count()}  n={args.n} d={args.d} max_iter={args.max_iter}, "
        "8 candidates x 3 folds, "
        f"median of {args.repeats} runs (configurations interleaved)"
    )
    runs = {name: [] for name in _CONFIGS}
    for _ in range(args.repeats):
        for name in _CONFIGS:
            out = subprocess.run(
                [sys.executable, __file__, "--_child", name, "--n", str(args.n), "--d", str(args.d),
                 "--max-iter", str(args.max_iter)],
                env=env, capture_output=True, text=True, check=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'configuration':45s} {'median s':>8s} {'ratio':>6s}  runs s; torch threads per worker")
    rows = []
    for name, results in runs.items():
        row = dict(results[0], wall_s=statistics.median(r["wall_s"] for r in results),
                   wall_s_runs=[r["wall_s"] for r in results])
        row["ratio_to_n_jobs_1"] = round(row["wall_s"] / rows[0]["wall_s"], 3) if rows else 1.0
        rows.append(row)
        print(
            f"{name:45s} {row['wall_s']:8.2f} {row['ratio_to_n_jobs_1']:6.2f}  "
            f"{row['wall_s_runs']}; "
            f"{row['torch_threads_in_workers']}"
        )
    same = all(r["mean_accuracy"] == rows[0]["mean_accuracy"] for r in rows)
    print(f"identical mean test accuracies across configurations: {same}")
    if not args.quick:
        payload = {
            "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
            "n": args.n,
            "d": args.d,
            "max_iter": args.max_iter,
            "repeats": args.repeats,
            "results": rows,
            "identical_scores": same,
        }
        pathlib.Path(args.output).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
