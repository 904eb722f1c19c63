"""benchmarks/bench_latency.py and bench_load.py stay runnable: their --quick modes, in process."""

import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield
    for name in ("bench_latency", "bench_load", "bench_engine"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("frame", [[], ["--frame"]])
def test_bench_latency_quick(benchmarks_on_path, frame):
    import bench_latency

    rows = bench_latency.main(
        ["--quick", "--models", "default,knn_config,HistGradientBoosting", *frame])
    assert [r["model"] for r in rows] == ["default", "knn_config", "HistGradientBoosting"]
    assert all(r["median_ms"] > 0 and r["p90_ms"] >= r["median_ms"] for r in rows)
    assert rows[-1]["ratio_to_hgb"] == pytest.approx(1.0)


def test_bench_load_quick(benchmarks_on_path):
    import bench_load

    rows = bench_load.main(["--quick", "--busy", "0", "1"])
    assert [r["busy"] for r in rows] == [0, 1]
    assert all(r["attention"] > 0 and r["sklearn"] > 0 and r["ratio"] > 0 for r in rows)
