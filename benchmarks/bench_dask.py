"""Predict over keys sharded on a Dask cluster: time and worker memory, 1 vs 2 workers.

    OMP_NUM_THREADS=1 python benchmarks/bench_dask.py            # 200,000 keys x 32, 1,000 queries
    OMP_NUM_THREADS=1 python benchmarks/bench_dask.py --quick    # 20,000 keys, a smoke run

Method: for each worker count, a ``LocalCluster(n_workers, threads_per_worker=1,
processes=True)``; the training rows (float32 Gaussian blobs, 10 classes) are generated on the
workers (``dask.array.random``, ``--partitions`` partitions, 4 by default), so the client never
holds them; ``MetricAttentionClassifier("euclidean")`` is fitted on them (keys persisted on the
workers). Each case (dense attention at a fixed temperature, and k-NN with ``n_neighbors=10``)
is run once to warm up, then timed ``--repeats`` times (median reported) for in-memory NumPy
queries. Worker memory: the bytes of the model's chunks (keys, values, log-prior) on each
worker, of all the chunks each worker holds (``dask_worker.data``: the persisted input rows
too) and each worker's resident memory after the runs and its peak (``ru_maxrss``, over the
whole life of the worker process, data generation included). Baseline: the same model fitted
in memory in the client process (torch on one thread, as each worker) predicts the same
queries in the same run; the ratio is sharded time / in-memory time, and ``ratio_stream`` the
same against the engine's streaming backend over all keys in one call (what each shard runs;
the in-memory dense predict may take the faster SDPA backend, which has no shard form yet).
Outputs are checked equal to the in-memory model's (labels exact). Results go to
``benchmarks/results/dask.json``.
"""

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
RESULTS = ROOT / "results" / "dask.json"
CASES = {"dense": dict(temperature=2.0), "knn10": dict(temperature=1.0, n_neighbors=10)}


def _worker_memory():
    import resource

    import psutil

    return psutil.Process().memory_info().rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _held_bytes(dask_worker):
    return int(sum(getattr(v, "nbytes", 0) for v in dask_worker.data.values()))


def _model_bytes(client, model):
    """Bytes of the model's keys, values and log-prior chunks per worker."""
    from distributed import futures_of

    keys = model._keys
    futures = futures_of([keys.points, keys.values, keys.log_prior])
    sizes = client.nbytes(summary=False)
    per_worker = {}
    for key, workers in client.who_has(futures).items():
        for worker in workers:
            per_worker[worker] = per_worker.get(worker, 0) + sizes[key]
    return per_worker


def _timed(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def run(n, d, n_queries, repeats, workers, partitions):
    import dask
    import dask.array as da
    import torch
    from distributed import Client, LocalCluster

    from skattention import MetricAttentionClassifier, attention, resolve_device

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=3.0, size=(10, d)).astype(np.float32)
    queries = (centers[rng.integers(0, 10, n_queries)]
               + rng.normal(size=(n_queries, d))).astype(np.float32)
    results, baseline = [], {}
    for n_workers in workers:
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            state = da.random.RandomState(1)
            y = state.randint(0, 10, size=n, chunks=n // partitions)
            X = (da.from_array(centers, chunks=-1)[y]
                 + state.normal(size=(n, d), chunks=(n // partitions, d))).astype(np.float32)
            X, y = dask.persist(X, y)
            for case, settings in CASES.items():
                sharded = MetricAttentionClassifier("euclidean", **settings).fit(X, y)
                seconds, proba = _timed(lambda m=sharded: m.predict_proba(queries), repeats)
                held = client.run(_held_bytes)
                model = _model_bytes(client, sharded)
                memory = client.run(_worker_memory)
                row = dict(case=case, n_workers=n_workers, n_keys=n, d=d, n_queries=n_queries,
                           predict_s=seconds,
                           held_mib={w: b / 2**20 for w, b in held.items()},
                           model_mib={w: b / 2**20 for w, b in model.items()},
                           rss_mib={w: m[0] / 2**20 for w, m in memory.items()},
                           peak_rss_mib={w: m[1] / 2**10 for w, m in memory.items()})
                if n_workers == workers[0]:  # the in-memory baseline, in this process
                    X_local, y_local = dask.compute(X, y)
                    local = MetricAttentionClassifier("euclidean", **settings).fit(
                        X_local, y_local)
                    base, expected = _timed(lambda m=local: m.predict_proba(queries), repeats)
                    # the engine backend every shard runs: streaming (the in-memory model may
                    # take SDPA for dense attention)
                    stream, _ = _timed(lambda m=local: attention(
                        queries, m._keys.points, m._keys.values, backend="stream",
                        **m._engine_kwargs(resolve_device(m.device))), repeats)
                    baseline[case] = base, stream, expected
                    del X_local
                row["in_memory_s"], row["in_memory_stream_s"], expected = baseline[case]
                row["ratio"] = seconds / row["in_memory_s"]
                row["ratio_stream"] = seconds / row["in_memory_stream_s"]
                row["labels_equal"] = bool(np.array_equal(proba.argmax(1), expected.argmax(1)))
                row["max_abs_diff"] = float(np.abs(proba - expected).max())
                results.append(row)
                print(json.dumps(row), flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    n = 20_000 if args.quick else 200_000
    results = run(n, 32, 200 if args.quick else 1000, args.repeats, workers=(1, 2),
                  partitions=args.partitions)
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    for row in results:
        print(f"{row['case']:6s} workers={row['n_workers']}  predict {row['predict_s']:.3f} s  "
              f"(in memory {row['in_memory_s']:.3f} s, ratio {row['ratio']:.2f}; stream backend "
              f"{row['in_memory_stream_s']:.3f} s, ratio {row['ratio_stream']:.2f})  model per "
              f"worker MiB {[round(v, 1) for v in row['model_mib'].values()]}  peak RSS MiB "
              f"{[round(v) for v in row['peak_rss_mib'].values()]}  labels equal "
              f"{row['labels_equal']}")


if __name__ == "__main__":
    main()
