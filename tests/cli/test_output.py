"""What the command line prints and when: fast errors, rows as they come, hints, warnings."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from skattention._cli import main

from .files import write as _write


def test_argument_errors_are_answered_before_torch_and_scikit_learn(tmp_path):
    """Each one-line error comes before torch, scikit-learn or an estimator is imported (the
    imports take seconds; the answer should not)."""
    import skattention

    table = _write(tmp_path / "t.csv", "a,b,y\n1,2,0\n3,4,0\n5,6,0\n")
    cases = [
        (["compare", "--data", str(tmp_path / "missing.csv"), "--target", "y"], "cannot read"),
        (["compare", "--data", str(table), "--target", "z"], "target column 'z' not found"),
        (["compare", "--data", str(table), "--target", "y", "--drop", "c"], "--drop column"),
        (["compare", "--data", str(table), "--target", "y"], "single class"),
        (["compare", "--models", "knn,svm"], "unknown --models svm"),
        (["compare", "--cv", "1"], "--cv must be at least 2"),
        (["compare", "--decimal", ","], "--decimal needs --data"),
        (["compare", "--task", "ranking"], "invalid choice"),
        (["embed", "--epsilon", "-1"], "--epsilon must be a positive number"),
        (["cluster", "--data", str(table), "--n-clusters", "9"], "--n-clusters must be"),
        (["compare", "--device", "tpu"], "'tpu' is not a device"),
    ]
    script = """if True:
        import contextlib, io, json, sys
        from skattention._cli import main
        report = []
        for argv in json.loads(sys.argv[1]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as exc:
                    code = exc.code
            heavy = [m for m in ("torch", "sklearn", "skattention._engine",
                                 "skattention.neighbors") if m in sys.modules]
            report.append([code, err.getvalue(), heavy])
        print(json.dumps(report))
    """
    root = pathlib.Path(skattention.__file__).parents[1]
    out = subprocess.run([sys.executable, "-c", script, json.dumps([a for a, _ in cases])],
                         capture_output=True, text=True, cwd=root, check=True)
    for (argv, message), (code, err, heavy) in zip(cases, json.loads(out.stdout), strict=True):
        assert code == 2 and message in err, (argv, err)
        assert heavy == [], f"{argv} imported {heavy} before its error"


@pytest.mark.parametrize("command", ["compare", "embed", "cluster"])
def test_an_unavailable_device_is_the_one_line_error_before_any_table(command, capsys,
                                                                      monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([command, "--max-samples", "60", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "skattention: error: device='cuda' was requested" in err


# --------------------------------------------------------------------------- rows as they come


def test_compare_prints_each_row_when_its_model_is_done(capsys, monkeypatch):
    from skattention import MetricAttentionClassifier

    seen = []
    fit = MetricAttentionClassifier.fit

    def spy(self, X, y, **kwargs):
        seen.append(sys.stdout.getvalue())  # what the table shows while the model trains
        return fit(self, X, y, **kwargs)

    monkeypatch.setattr(MetricAttentionClassifier, "fit", spy)
    argv = ["compare", "--cv", "2", "--max-samples", "150", "--models", "knn,kernel"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("dataset: digits") and out[1].startswith("model")
    assert set(out[2]) == {"-"} and len(out) == 5
    assert out[3].startswith("KNeighborsClassifier(k=5)") and out[4].startswith("attention")
    assert len(seen) == 2  # the kernel model's two folds, each after the k-NN row was printed
    assert all(s.splitlines() == out[:4] for s in seen)


def test_progress_bar_on_a_terminal_with_tqdm(capsys, monkeypatch):
    pytest.importorskip("tqdm")
    from skattention._engine import _progress

    monkeypatch.setattr(_progress, "INNER_DELAY", 0.0)  # show the bar at once
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["compare", "--cv", "2", "--max-samples", "150", "--models", "knn,kernel"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "4/4" in captured.err and "fold" in captured.err  # the bar over 2 models x 2 folds
    rows = captured.out.splitlines()  # the bar is cleared before each row: rows stay whole
    assert len(rows) == 5 and "\r" not in captured.out
    assert rows[3].startswith("KNeighborsClassifier(k=5)") and rows[4].startswith("attention")


def test_no_bar_without_tqdm_or_without_a_terminal(capsys, monkeypatch):
    argv = ["compare", "--cv", "2", "--max-samples", "100", "--models", "knn"]
    assert main(argv) == 0  # standard error is not a terminal here
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.splitlines()) == 4


# --------------------------------------------------------------------------- ID-like columns


def test_id_like_columns_are_used_but_hinted(tmp_path, capsys):
    rng = np.random.default_rng(6)
    n = 40
    x = rng.normal(size=n)
    order = rng.permutation(n) + 1000
    lines = ["row_number,customer_id,x,count,label"] + [
        f"{order[i]},c{i:03d},{x[i]:.4f},{i % 5},{'a' if x[i] > 0 else 'b'}" for i in range(n)
    ]
    path = _write(tmp_path / "ids.csv", "\n".join(lines) + "\n")
    argv = ["compare", "--data", str(path), "--target", "label", "--cv", "2", "--models", "knn",
            "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["dataset"]["n_features"] == 4  # still used as features
    hints = captured.err.splitlines()
    assert len(hints) == 2 and all(h.startswith("skattention compare: hint: ") for h in hints)
    assert "'row_number'" in hints[0] and "--drop row_number" in hints[0]
    assert "'customer_id'" in hints[1] and "--drop customer_id" in hints[1]
    assert main([*argv, "--drop", "row_number", "--drop", "customer_id"]) == 0
    assert capsys.readouterr().err == ""
    # where the column stops the run (embed needs numbers), its error alone names --drop
    assert main(["embed", "--data", str(path), "--target", "label"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--drop customer_id" in err[0]


def test_a_warning_is_one_line_of_the_subcommand(tmp_path):
    # Python printed "<frozen runpy>:88: ConvergenceWarning: ..." and scikit-learn's
    # "sklearn/base.py:1403: ... return fit_method(...)" source line
    path = tmp_path / "same.csv"
    path.write_text("a,b\n" + "1,2\n" * 10)
    out = subprocess.run(
        [sys.executable, "-m", "skattention", "cluster", "--data", str(path), "--n-clusters", "2"],
        capture_output=True, text=True, check=True,
    )
    lines = out.stderr.splitlines()
    assert lines and all(line.startswith("skattention cluster: warning: ") for line in lines)
    assert "Number of distinct clusters (1)" in lines[0]
