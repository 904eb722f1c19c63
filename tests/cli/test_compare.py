"""The ``skattention compare`` main job and its one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from skattention._cli import main


def test_compare_on_digits_prints_the_table(capsys):
    assert main(["compare", "--cv", "2", "--max-samples", "500"]) == 0
    out = capsys.readouterr().out
    assert "digits" in out and "KNeighborsClassifier(k=5)" in out
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("attention") or line.startswith("KNeigh")
    ]
    assert len(rows) == 4  # the default models
    # the exact k-NN special case scores exactly like KNeighborsClassifier (same folds)
    knn, att_knn = rows[0].split()[-4], rows[1].split()[-4]
    assert knn == att_knn


def test_compare_json_on_a_user_csv(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
    path = tmp_path / "data.csv"
    lines = ["a,b,label,c"] + [f"{r[0]},{r[1]},{t},{r[2]}" for r, t in zip(X, y)]
    path.write_text("\n".join(lines) + "\n")
    assert main(["compare", "--data", str(path), "--target", "label", "--cv", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["settings"]["task"] == "classification"
    assert [r["model"] for r in res["results"]][0] == "KNeighborsClassifier(k=5)"
    assert all(len(r["scores"]) == 3 for r in res["results"])
    assert all(0.5 < r["mean"] <= 1.0 for r in res["results"])


def test_compare_regression_target(tmp_path, capsys):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, 2))
    y = X[:, 0] * 3 + rng.normal(size=100) * 0.1
    path = tmp_path / "reg.csv"
    path.write_text("x1,x2,y\n" + "\n".join(f"{a},{b},{c}" for (a, b), c in zip(X, y)))
    assert main(["compare", "--data", str(path), "--target", "y", "--cv", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["settings"]["task"] == "regression" and res["results"][0]["metric"] == "r2"
    assert res["results"][1]["mean"] > 0.8


@pytest.mark.parametrize(
    "content, argv_extra, message",
    [
        (None, ["--target", "y"], "cannot read"),
        ("a,b,y\n1,2,0\n3,4,1\n", ["--target", "z"], "target column 'z' not found"),
        ("a,b,y\n1,2,3\n5,6,7,8\n", ["--target", "y"], "Expected 3 fields in line 3, saw 4"),
        ("a,b,y\n1,2,3,4\n5,6,7\n", ["--target", "y"], "more fields than its header"),
        ("a,b,y\n1,2,0\n3,4,\n", ["--target", "y"], "'y' has 1 missing values (data rows 2)"),
        ("a,b,y\n1,2,0\n3,4,1\n", ["--target", "y", "--drop", "c"], "--drop column 'c'"),
        ("a,b,y\n1,2,0\n3,4,1\n", ["--target", "y", "--drop", "y"], "cannot be dropped"),
        ("a,y\n1,0\n3,1\n", ["--target", "y", "--drop", "a"], "no feature columns left"),
        ("a,y\n", ["--target", "y"], "needs a header row and at least one data row"),
        ("a,b,y\n1,2,0\n3,4,0\n5,6,0\n", ["--target", "y"], "single class"),
    ],
)
def test_bad_csv_gives_a_one_line_error(tmp_path, capsys, content, argv_extra, message):
    path = tmp_path / "bad.csv"
    if content is not None:
        path.write_text(content)
    assert main(["compare", "--data", str(path), *argv_extra, "--cv", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skattention: error:") and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content, message",
    [
        ("a,b\n1,x\n3,4\n", "column 'b' is not numeric (data row 1: 'x')"),
        ("a,b\n1,\n3,4\n", "column 'b' has a missing value (data row 1)"),
    ],
)
def test_embed_needs_numbers(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    assert main(["embed", "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("skattention: error:") and message in err


def test_compare_takes_text_columns_and_missing_cells(tmp_path, capsys):
    pytest.importorskip("pandas")
    rng = np.random.default_rng(2)
    n = 90
    x = rng.normal(size=n)
    city = rng.choice(["oslo", "rome", "lima"], n)
    y = (x > 0).astype(int) ^ (city == "rome")
    lines = ["x,city,y"] + [
        f"{'' if i % 9 == 0 else f'{a:.3f}'},{'NA' if i % 11 == 0 else c},{t}"
        for i, (a, c, t) in enumerate(zip(x, city, y))
    ]
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(lines))
    assert main(["compare", "--data", str(path), "--target", "y", "--cv", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["results"]) == 4
    assert all(np.isfinite(r["mean"]) for r in res["results"])


def test_module_entry_point_and_help():
    out = subprocess.run(
        [sys.executable, "-m", "skattention", "compare", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "examples:" in out.stdout and "--target" in out.stdout
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "skattention",
            "compare",
            "--data",
            "/nonexistent.csv",
            "--target",
            "y",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "cannot read" in out.stderr
