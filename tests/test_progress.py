"""verbose=1 shows progress on standard error (tqdm, or plain lines without it); verbose=0 and
library code in general never write to standard output."""

import ast
import pathlib
import sys

import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_moons

import skattention
from skattention import (
    AttentionDiffusionEmbedding,
    AttentionKMeans,
    MetricAttentionClassifier,
    attention,
    kneighbors,
)
from skattention._engine import _progress
from tests.conftest import cheap

PACKAGE = pathlib.Path(skattention.__file__).parent

X_MOONS, Y_MOONS = make_moons(120, noise=0.2, random_state=0)

# (estimator, fit target, text its progress must show)
ESTIMATORS = [
    (lambda v: cheap("MetricAttentionClassifier", verbose=v), Y_MOONS, "loss="),
    (lambda v: cheap("MetricAttentionRegressor", verbose=v), X_MOONS[:, 0], "loss="),
    (lambda v: cheap("MetricAttentionTransformer", verbose=v), Y_MOONS, "loss="),
    (lambda v: cheap("AttentionNetworkClassifier", max_iter=2, verbose=v), Y_MOONS, "loss="),
    (lambda v: cheap("AttentionDiffusionEmbedding", verbose=v), None, "eigenpairs"),
    (lambda v: cheap("AttentionDiffusionEmbedding", n_neighbors=10, verbose=v), None, "k-NN graph"),
    (lambda v: cheap("AttentionKMeans", verbose=v), None, "inertia="),
    (lambda v: cheap("AttentionKMeans", temperature=0, init="random", n_init="auto", verbose=v),
     None, "10/10"),
    (lambda v: cheap("AttentionMeanShift", verbose=v), None, "moving="),
    (lambda v: cheap("AttentionMeanShift", blurring=True, verbose=v), None, "shift="),
]
IDS = ["classifier", "regressor", "transformer", "network", "diffusion", "diffusion-knn", "kmeans",
       "kmeans-restarts", "mean-shift", "blurring-mean-shift"]


def _fit_and_use(make, y, verbose):
    est = make(verbose)
    est.fit(X_MOONS, y)
    for method in ("predict", "transform"):
        if hasattr(est, method):
            getattr(est, method)(X_MOONS[:5])
    return est


@pytest.mark.parametrize("make, y, text", ESTIMATORS, ids=IDS)
def test_verbose_shows_progress_on_stderr_only(make, y, text, capfd):
    est = _fit_and_use(make, y, verbose=1)
    out, err = capfd.readouterr()
    assert out == ""
    assert f"{type(est).__name__} fit" in err
    assert text in err


@pytest.mark.parametrize("make, y, text", ESTIMATORS, ids=IDS)
def test_verbose_zero_writes_nothing(make, y, text, capfd):
    _fit_and_use(make, y, verbose=0)
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("make", [
    lambda: cheap("MetricAttentionClassifier", verbose=2),
    lambda: cheap("AttentionNetworkClassifier", max_iter=2, verbose=2),
])
def test_verbose_2_adds_one_line_per_epoch(make, capfd):
    est = make().fit(X_MOONS, Y_MOONS)
    out, err = capfd.readouterr()
    assert out == ""
    assert err.count(f"{type(est).__name__} epoch ") == 2
    assert "epoch 2/2: loss" in err


def test_kmeans_verbose_2_writes_annealing_and_lloyd_lines(capfd):
    X, _ = make_blobs(200, centers=3, random_state=0)
    AttentionKMeans(3, random_state=0, verbose=2).fit(X)
    out, err = capfd.readouterr()
    assert out == ""
    assert "annealing T=" in err and "Lloyd:" in err and "AttentionKMeans run 0: inertia" in err


def test_inner_loops_get_bars_once_they_last(monkeypatch, capfd):
    """Inner loops (query blocks, Lanczos solves, Lloyd iterations) show a bar after
    INNER_DELAY seconds; with no delay they show at once."""
    monkeypatch.setattr(_progress, "INNER_DELAY", 0.0)
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(600, 3)), rng.normal(size=(700, 3)), rng.normal(size=700)
    tiny = 0.05  # MiB: forces many query blocks
    dense = attention(Q, K, V, working_memory=tiny, backend="stream", progress=1)
    knn = attention(Q, K, V, n_neighbors=5, working_memory=tiny, progress=1)
    kneighbors(Q, K, 3, working_memory=tiny, progress=1)
    out, err = capfd.readouterr()
    assert out == "" and "attention" in err and "kneighbors" in err and "block" in err
    # progress changes nothing in the result
    np.testing.assert_array_equal(dense, attention(Q, K, V, working_memory=tiny, backend="stream"))
    np.testing.assert_array_equal(knn, attention(Q, K, V, n_neighbors=5, working_memory=tiny))
    assert capfd.readouterr() == ("", "")

    theta = np.linspace(0, 2 * np.pi, 300, endpoint=False)
    circle = np.c_[np.cos(theta), np.sin(theta)]
    AttentionDiffusionEmbedding(eigen_solver="arpack", random_state=0, verbose=1).fit(circle)
    AttentionKMeans(3, temperature=0, random_state=0, verbose=1).fit(X_MOONS)
    out, err = capfd.readouterr()
    assert out == "" and "Lanczos" in err and "Lloyd" in err


def test_without_tqdm_progress_falls_back_to_lines(monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    monkeypatch.setattr(_progress, "_note_shown", False)
    MetricAttentionClassifier(max_iter=2, random_state=0, verbose=1).fit(X_MOONS, Y_MOONS)
    AttentionKMeans(3, random_state=0, verbose=2).fit(X_MOONS)
    AttentionDiffusionEmbedding(random_state=0, verbose=1).fit(X_MOONS)
    out, err = capfd.readouterr()
    assert out == ""
    assert err.count("pip install tqdm") == 1  # a one-time note
    assert "MetricAttentionClassifier fit: 2/2 epoch (loss=" in err and "val_score=" in err
    assert "annealing T=" in err and "AttentionKMeans fit: 1/1 run" in err
    assert "AttentionDiffusionEmbedding fit: 3/3 step (done)" in err
    assert "\r" not in err  # plain lines


def test_fallback_lines_are_throttled(monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(_progress, "_note_shown", True)
    with _progress.progress_bar(1, total=1000, desc="loop") as bar:
        for _ in range(1000):
            bar.set_postfix(x=1.5)
            bar.update()
    err = capfd.readouterr().err
    assert err.splitlines()[-1].startswith("loop: 1000/1000 it (x=1.5)")
    assert len(err.splitlines()) <= 3
    with _progress.progress_bar(1, total=5, desc="short", inner=True) as bar:
        bar.update(5)
    assert capfd.readouterr() == ("", "")  # a short inner loop shows nothing


def test_write_goes_to_stderr(capfd):
    _progress.write("a message")
    with _progress.progress_bar(1, total=1) as bar:
        bar.write("via the bar")
        bar.update()
    out, err = capfd.readouterr()
    assert out == "" and "a message" in err and "via the bar" in err


def test_track_passes_through_when_quiet_or_short():
    items = [1, 2, 3]
    assert _progress.track(items, 0) is items
    assert _progress.track(items, 1, min_total=4) is items
    assert list(_progress.track(iter(items), 1)) == items


def test_library_code_never_prints_to_stdout():
    """Only the command line (skattention/_cli/) writes to standard output."""
    for path in PACKAGE.rglob("*.py"):
        if "_cli" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "print"
            ):
                pytest.fail(f"{path.relative_to(PACKAGE)}:{node.lineno} calls print")
            if isinstance(node, ast.Attribute) and node.attr == "stdout":
                pytest.fail(f"{path.relative_to(PACKAGE)}:{node.lineno} uses stdout")


def test_engine_progress_is_standard_library_only():
    tree = ast.parse((PACKAGE / "_engine" / "_progress.py").read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split(".")[0])
    assert modules <= {"sys", "time", "tqdm"}
