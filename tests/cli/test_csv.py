"""The CSV files the command line reads: dialects, encodings, options, decimal commas."""

import json
import subprocess
import sys

import numpy as np
import pytest

from skattention._cli import main

from .files import blobs_csv as _blobs_csv
from .files import write as _write


@pytest.mark.parametrize("sep", [",", ";", "\t", "|"])
def test_csv_separator_is_detected(tmp_path, capsys, sep):
    rows = ["alcohol,colour,kind"] + [f"{i % 7}.5,{(i * 3) % 5},k{i % 2}" for i in range(40)]
    path = _write(tmp_path / "d.csv", "\n".join(r.replace(",", sep) for r in rows) + "\n")
    argv = ["compare", "--data", str(path), "--target", "kind", "--cv", "2", "--models", "knn",
            "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["dataset"]["n_features"] == 2 and res["dataset"]["n_samples"] == 40


def test_excel_bom_semicolons_and_latin1(tmp_path, capsys):
    rows = ["alcohol;région;kind"] + [f"{i % 7},{i % 3};{'é' if i % 2 else 'è'};k{i % 2}"
                                      for i in range(30)]
    text = "\n".join(rows) + "\n"
    bom = _write(tmp_path / "bom.csv", "\ufeff" + text.replace(";région", ";region"))
    argv = ["cluster", "--data", str(bom), "--target", "kind", "--drop", "region", "--json"]
    assert main(argv) == 0  # decimal commas in a ';' file: 'alcohol' is read as numbers
    assert json.loads(capsys.readouterr().out)["dataset"]["n_features"] == 1
    assert main([*argv, "--decimal", "."]) == 2  # read as text when told so, and said in one line
    assert "column 'alcohol' is not numeric" in capsys.readouterr().err
    bom = _write(tmp_path / "bom.csv", "\ufeff" + text.replace(",", "."))
    argv = ["cluster", "--data", str(bom), "--target", "kind", "--drop", "région", "--json"]
    assert main(argv) == 0  # the BOM is not part of the first column's name
    assert json.loads(capsys.readouterr().out)["dataset"]["n_features"] == 1
    latin = _write(tmp_path / "latin.csv", text.replace(",", "."), encoding="latin-1")
    assert main(["cluster", "--data", str(latin), "--target", "kind"]) == 2
    assert "--encoding" in capsys.readouterr().err
    argv = ["cluster", "--data", str(latin), "--target", "kind", "--drop", "région",
            "--encoding", "latin-1", "--sep", ";"]
    assert main(argv) == 0


def test_compare_id_column_text_and_missing_values(tmp_path, capsys):
    pytest.importorskip("pandas")
    rng = np.random.default_rng(3)
    n = 60
    x = rng.normal(size=n)
    colour = rng.choice(["red", "green"], n)
    y = (x > 0).astype(int)
    lines = ["id\tx\tcolour\ty"] + [
        f"row{i}\t{'' if i % 7 == 0 else f'{a:.3f}'}\t{'?' if i % 5 == 0 else c}\t{t}"
        for i, (a, c, t) in enumerate(zip(x, colour, y))
    ]
    path = _write(tmp_path / "t.tsv", "\n".join(lines) + "\n")
    argv = ["compare", "--data", str(path), "--target", "y", "--drop", "id", "--cv", "2",
            "--models", "knn,knn-attention", "--json", "--verbose"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert res["dataset"]["n_features"] == 2
    assert all(np.isfinite(r["mean"]) for r in res["results"])
    progress = [line for line in captured.err.splitlines() if "fold" in line]
    assert len(progress) == 4 and "model 2/2" in progress[-1] and "fold 2/2" in progress[-1]


def test_one_json_schema_for_the_three_subcommands(tmp_path, capsys):
    import skattention

    path, _, _ = _blobs_csv(tmp_path)
    for argv in (["compare", "--models", "knn", "--cv", "2"], ["embed"], ["cluster"]):
        assert main([*argv, "--data", str(path), "--target", "kind", "--json"]) == 0
        res = json.loads(capsys.readouterr().out)
        assert set(res) == {"command", "version", "dataset", "settings", "results", "plot"}
        assert res["command"] == argv[0] and res["version"] == skattention.__version__
        assert res["dataset"] == {"name": str(path), "n_samples": 120, "n_features": 3}
        assert res["results"] and all("model" in r and r["time_s"] >= 0 for r in res["results"])


@pytest.mark.parametrize("plot, message", [
    ("missing-folder/x.png", "does not exist"),
    ("scores.unknown", "the extension must be one of"),
])
def test_bad_plot_path_fails_before_any_work(tmp_path, capsys, monkeypatch, plot, message):
    pytest.importorskip("matplotlib")
    from skattention._cli import _compare

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_compare, "load_data", lambda *a, **k: pytest.fail("data was loaded"))
    assert main(["compare", "--plot", plot]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_version(capsys):
    import skattention

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"skattention {skattention.__version__}"


def test_compare_help_names_the_models():
    out = subprocess.run([sys.executable, "-m", "skattention", "compare", "--help"],
                         capture_output=True, text=True).stdout
    assert "knn,knn-attention,kernel,tabular" in out and "2 CPU cores" in out


# --------------------------------------------------------------------------- decimal commas


def _table(rng, n=90):
    """A classification table whose features have decimals: ``(header, rows of cells)``."""
    X = rng.normal(size=(n, 3)) * [1.0, 10.0, 0.01]
    y = np.where(X[:, 0] + X[:, 1] / 10 > 0, "yes", "no")
    rows = [[f"{v:.6g}" for v in x] + [t] for x, t in zip(X, y)]
    return ["a", "b", "c", "label"], rows


def _compare_json(capsys, path, *extra):
    argv = ["compare", "--data", str(path), "--target", "label", "--cv", "3", "--models",
            "knn,knn-attention", "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_semicolons_with_decimal_commas_score_as_points(tmp_path, capsys):
    """A table saved by a spreadsheet in much of Europe (';' between fields, ',' before the
    decimals) gives the same k-NN scores as the same table with ',' and '.'."""
    header, rows = _table(np.random.default_rng(4))
    points = _write(tmp_path / "points.csv",
                    "\n".join(",".join(r) for r in [header, *rows]) + "\n")
    commas = _write(tmp_path / "commas.csv", "\n".join(
        ";".join(cell.replace(".", ",") for cell in r) for r in [header, *rows]) + "\n")
    assert "," in commas.read_text().splitlines()[1]
    expected, got = _compare_json(capsys, points), _compare_json(capsys, commas)
    assert got["dataset"]["n_features"] == expected["dataset"]["n_features"] == 3
    assert [r["scores"] for r in got["results"]] == [r["scores"] for r in expected["results"]]
    assert got["results"][0]["mean"] > 0.8  # the numbers were read as numbers, not categories
    # --decimal . reads the commas as text: the k-NN baseline one-hot encodes them
    as_text = _compare_json(capsys, commas, "--decimal", ".")
    assert [r["scores"] for r in as_text["results"]] != [r["scores"] for r in got["results"]]


def test_decimal_option_forces_the_mark(tmp_path, capsys):
    header, rows = _table(np.random.default_rng(5), n=60)
    points = _write(tmp_path / "points.csv",
                    "\n".join(",".join(r) for r in [header, *rows]) + "\n")
    # '|' files are not guessed (a comma there may be a thousands separator): --decimal says it
    piped = _write(tmp_path / "piped.csv", "\n".join(
        "|".join(cell.replace(".", ",") for cell in r) for r in [header, *rows]) + "\n")
    expected = _compare_json(capsys, points)
    forced = _compare_json(capsys, piped, "--sep", "|", "--decimal", ",")
    assert [r["scores"] for r in forced["results"]] == [r["scores"] for r in expected["results"]]
    # a ';' file with numbers written with points and a text column is left as it is
    mixed = _write(tmp_path / "mixed.csv", "x;colour;label\n" + "\n".join(
        f"{i / 7:.3f};{'red' if i % 3 else 'blue'};k{i % 2}" for i in range(40)) + "\n")
    argv = ["embed", "--data", str(mixed), "--drop", "colour", "--json", "--target", "label"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["dataset"]["n_features"] == 1


@pytest.mark.parametrize("argv_extra, message", [
    (["--decimal", ","], "--decimal ',' is also the separator"),
    (["--decimal", ";"], "argument --decimal: invalid choice"),
])
def test_decimal_option_errors(tmp_path, capsys, argv_extra, message):
    path = _write(tmp_path / "d.csv", "a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    argv = ["compare", "--data", str(path), "--target", "y", "--cv", "2", *argv_extra]
    try:
        assert main(argv) == 2
    except SystemExit as exit_info:  # argparse's own errors
        assert exit_info.code == 2
    err = capsys.readouterr().err
    assert message in err
