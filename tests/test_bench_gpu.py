"""benchmarks/bench_gpu.py stays runnable: its --smoke mode on the CPU, in a subprocess."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_bench_gpu_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--smoke", "--device", "cpu",
         "--skip-tests", "--output", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    cases = {r["case"] for r in rows}
    assert cases == {"matmul", "engine dense", "engine sdpa", "engine top-k", "torch sdpa"}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}  # the engine runs in bf16 too
    assert all("error" not in r and r["tflops"] > 0 for r in rows), [
        r for r in rows if "error" in r
    ]
