"""The ``skattention compare`` main job and its one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from skattention._cli import main


def test_compare_on_digits_prints_the_table(capsys):
    assert main(["compare", "--cv", "2"]) == 0
    out = capsys.readouterr().out
    assert "digits" in out and "KNeighborsClassifier(k=5)" in out
    rows = [line for line in out.splitlines() if line.startswith("attention") or line.startswith("KNeigh")]
    assert len(rows) == 6
    # the exact k-NN special case scores exactly like KNeighborsClassifier
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
    assert res["task"] == "classification"
    assert [r["model"] for r in res["results"]][0] == "KNeighborsClassifier(k=5)"
    assert all(0.5 < r["mean"] <= 1.0 for r in res["results"])


def test_compare_regression_target(tmp_path, capsys):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, 2))
    y = X[:, 0] * 3 + rng.normal(size=100) * 0.1
    path = tmp_path / "reg.csv"
    path.write_text("x1,x2,y\n" + "\n".join(f"{a},{b},{c}" for (a, b), c in zip(X, y)))
    assert main(["compare", "--data", str(path), "--target", "y", "--cv", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["task"] == "regression" and res["results"][0]["metric"] == "r2"
    assert res["results"][1]["mean"] > 0.8


@pytest.mark.parametrize(
    "content, argv_extra, message",
    [
        (None, ["--target", "y"], "cannot read"),
        ("a,b,y\n1,2,0\n3,4,1\n", ["--target", "z"], "target column 'z' not found"),
        ("a,b,y\n1,x,0\n3,4,1\n", ["--target", "y"], "column 'b' is not numeric (line 2: 'x')"),
        ("a,b,y\n1,,0\n3,4,1\n", ["--target", "y"], "column 'b' has a missing value"),
        ("a,b,y\n1,2\n", ["--target", "y"], "line 2 has 2 fields"),
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


def test_module_entry_point_and_help():
    out = subprocess.run([sys.executable, "-m", "skattention", "compare", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "examples:" in out.stdout and "--target" in out.stdout
    out = subprocess.run([sys.executable, "-m", "skattention", "compare", "--data", "/nonexistent.csv", "--target", "y"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "cannot read" in out.stderr
