"""Speed under load: the k-NN predict ratio against scikit-learn while other processes are busy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_load.py
    python benchmarks/bench_load.py --quick   # a small smoke run

For each number of competing processes (``--busy``, default 0 1 3; each runs
``while True: pass``), the attention k-NN configuration and ``KNeighborsClassifier(5,
algorithm="brute")`` predict the same queries alternately, ``--repeats`` times each; the ratio is
the median attention time over the median scikit-learn time from the same load. Users' machines
are rarely quiet: a ratio that grows with the load means the engine loses more than scikit-learn
to competing processes (spin-waiting threads, many short parallel regions).
"""

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_engine import _make_data, _models, _temperature  # noqa: E402 (after sys.path)
from bench_latency import blas_kernel  # noqa: E402

RESULTS = HERE / "results" / "load.json"


def busy_processes(count):
    """``count`` processes spinning on one core each (terminate them when done)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)
    ]


def alternate(att, ref, Xte, repeats):
    """Median predict times of ``att`` and ``ref``, calls alternated so both see the same load."""
    times = {"attention": [], "sklearn": []}
    for _ in range(repeats):
        for name, model in (("attention", att), ("sklearn", ref)):
            start = time.perf_counter()
            model.predict(Xte)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n-train", type=int, default=100_000)
    parser.add_argument("--n-test", type=int, default=10_000)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 3])
    parser.add_argument(
        "--kind", default="knn", choices=["knn", "dense"],
        help="the k-NN configuration, or dense attention (bench_engine.py's models)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.quick:
        args.n_train, args.n_test, args.repeats, args.busy = 3000, 500, 1, [0, 1]

    import sklearn
    import torch

    Xtr, ytr, Xte, _ = _make_data(args.n_train, args.n_test, args.d, np.dtype(args.dtype))
    att, ref = _models(args.kind, _temperature(Xtr))
    att.fit(Xtr, ytr)
    ref.fit(Xtr, ytr)
    att.predict(Xte[:100])  # warm-up: lazy imports, thread pools
    ref.predict(Xte[:100])
    header = (
        f"kind={args.kind} n_train={args.n_train} n_test={args.n_test} d={args.d} "
        f"dtype={args.dtype} "
        f"repeats={args.repeats} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"sklearn={sklearn.__version__} cpu={platform.processor() or platform.machine()} "
        f"blas={blas_kernel()}"
    )
    print(header)
    rows = []
    for count in args.busy:
        procs = busy_processes(count)
        try:
            time.sleep(0.5 if count else 0)  # let the competitors start spinning
            medians = alternate(att, ref, Xte, args.repeats)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait()
        ratio = medians["attention"] / medians["sklearn"]
        print(
            f"busy={count}: attention {medians['attention']:.3f} s, "
            f"KNeighborsClassifier {medians['sklearn']:.3f} s, ratio {ratio:.2f}"
        )
        rows.append({"busy": count, **medians, "ratio": ratio})
    if not args.quick:
        pathlib.Path(args.out).write_text(json.dumps({"setup": header, "results": rows}, indent=1))
        print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
