"""GPU readiness: the CUDA test subset, then engine throughput against SDPA and a matmul roofline.

    python benchmarks/bench_gpu.py                          # on one NVIDIA GPU, a few minutes
    python benchmarks/bench_gpu.py --smoke --device cpu     # tiny sizes, any machine (tested)

(a) runs ``pytest -m gpu`` (the tests that need a CUDA GPU, skipped elsewhere) and records its
summary line; ``--skip-tests`` leaves it out.

(b) for ``n_queries`` queries against ``n_keys`` keys (up to 10^7) with ``d = 64``, in float32
and bfloat16, times

* ``engine dense``: :func:`skattention.attention` with the streaming online-softmax path;
* ``engine sdpa``: the same through its ``scaled_dot_product_attention`` path (augmented
  coordinates);
* ``engine top-k``: ``n_neighbors=16`` (blockwise top-k, then the softmax over the 16);
* ``torch sdpa``: :func:`torch.nn.functional.scaled_dot_product_attention` on the raw shapes
  (dot-product scores, no distance): the fused-kernel ceiling;
* ``matmul``: ``Q @ K.T`` alone, key block by key block (the score matrix never fits), the
  roofline of anything that must compute every score.

TFLOP/s count ``4 n_q n_k d`` for dense attention (scores and the weighted sum) and
``2 n_q n_k d`` for top-k selection and the matmul; ``vs matmul`` divides the time of the
matmul on the same shape by the time of the case (1.0 = as fast as computing the scores alone,
the weighted sum coming for free). Results go to ``benchmarks/results/gpu.json``.
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

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_gpu_tests(extra=()):
    """``pytest -m gpu``; returns (exit code, last summary line)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        str(ROOT / "tests"),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-300:]
    if proc.returncode not in (0, 5):  # 5: nothing selected
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    return proc.returncode, summary


def _timer(device, fn, repeats):
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up (kernel selection, allocator)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(device, dtypes, sizes, n_queries, d, k, repeats, working_memory, key_block):
    import torch
    import torch.nn.functional as F

    from skattention import attention

    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for n_keys in sizes:
            gen = torch.Generator(device=device).manual_seed(0)
            Q = torch.randn(n_queries, d, device=device, dtype=dtype, generator=gen)
            K = torch.randn(n_keys, d, device=device, dtype=dtype, generator=gen)
            V = torch.randn(n_keys, d, device=device, dtype=dtype, generator=gen)
            T = float(2 * d)  # keeps the softmax away from one-hot at unit-variance inputs

            def matmul():
                for ks in range(0, n_keys, key_block):
                    Q @ K[ks : ks + key_block].T

            cases = {
                "matmul": (matmul, 2),
                "engine dense": (lambda: attention(Q, K, V, temperature=T, backend="stream",
                                                   working_memory=working_memory), 4),
                "engine sdpa": (lambda: attention(Q, K, V, temperature=T, backend="sdpa",
                                                  working_memory=working_memory), 4),
                "engine top-k": (lambda: attention(Q, K, V, temperature=T, n_neighbors=k,
                                                   working_memory=working_memory), 2),
                "torch sdpa": (lambda: F.scaled_dot_product_attention(Q[None, None], K[None, None],
                                                                      V[None, None]), 4),
            }
            base = None
            for name, (fn, flops_per) in cases.items():
                row = {
                    "case": name,
                    "dtype": dtype_name,
                    "n_queries": n_queries,
                    "n_keys": n_keys,
                    "d": d,
                }
                try:
                    t = _timer(device, fn, repeats)
                except (RuntimeError, MemoryError, ValueError) as exc:  # e.g. no kernel for a dtype
                    row.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                    rows.append(row)
                    print(
                        f"{dtype_name:9s} {n_keys:>10d} {name:14s} {'failed':>9s}  {row['error']}"
                    )
                    continue
                if name == "matmul":
                    base = t
                tflops = flops_per * n_queries * n_keys * d / t / 1e12
                row.update(seconds=t, tflops=tflops, vs_matmul=None if base is None else base / t)
                rows.append(row)
                ratio = "" if base is None else f"{base / t:8.2f}"
                print(f"{dtype_name:9s} {n_keys:>10d} {name:14s} {t:9.4f} {tflops:9.3f} {ratio}")
            Q = K = V = None  # free this size's tensors before the next size's
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes (runs on a CPU in seconds)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="leave out pytest -m gpu")
    parser.add_argument("--n-queries", type=int, default=4096)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7], help="n_keys values"
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--n-neighbors", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--working-memory", type=float, default=2048,
                        help="MiB of scratch memory per engine call (the library default is 256)")
    parser.add_argument(
        "--output",
        default=None,
        help="JSON path (default benchmarks/results/gpu.json; --smoke writes nothing unless given)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.n_queries, args.sizes, args.repeats, args.working_memory = 32, [500, 3000], 1, 16

    import torch

    from skattention import resolve_device

    device = resolve_device(args.device)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu"
    )
    print(f"device: {device} ({name}); torch {torch.__version__}")
    tests = None
    if not args.skip_tests:
        rc, summary = run_gpu_tests()
        tests = {"exit_code": rc, "summary": summary}
        print(f"pytest -m gpu: {summary} (exit code {rc})")
    print(
        f"{'dtype':9s} {'n_keys':>10s} {'case':14s} {'seconds':>9s} {'TFLOP/s':>9s} "
        f"{'vs matmul':>8s}"
    )
    # 1 GiB float32 blocks
    key_block = max(1, min(max(args.sizes), (1 << 30) // (4 * args.n_queries)))
    rows = throughput(device, args.dtypes, args.sizes, args.n_queries, args.d, args.n_neighbors,
                      args.repeats, args.working_memory, key_block)
    output = args.output or (
        None if args.smoke else str(ROOT / "benchmarks" / "results" / "gpu.json")
    )
    if output:
        payload = {"device": str(device), "device_name": name, "torch": torch.__version__,
                   "working_memory_mib": args.working_memory, "tests": tests, "results": rows}
        pathlib.Path(output).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {output}")
    failed_tests = tests is not None and tests["exit_code"] not in (0, 5)
    return 1 if failed_tests else 0


if __name__ == "__main__":
    sys.exit(main())
