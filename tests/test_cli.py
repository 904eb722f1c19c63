"""The ``skattention compare`` main job and its one-line errors."""

import json
import pathlib
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


# --------------------------------------------------------------------------- embed, cluster, --plot


def _blobs_csv(tmp_path, with_target=True):
    from sklearn.datasets import make_blobs

    X, y = make_blobs(120, centers=[[0, 0, 0], [8, 0, 0], [0, 8, 0]], random_state=0)
    path = tmp_path / "blobs.csv"
    header = "a,b,c" + (",kind" if with_target else "")
    rows = [
        ",".join(f"{v:.6f}" for v in x) + (f",k{t}" if with_target else "") for x, t in zip(X, y)
    ]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path, X, y


def test_embed_json_on_digits_subset(capsys):
    assert main(["embed", "--max-samples", "200", "--n-components", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    data, (row,) = res["dataset"], res["results"]
    assert data["n_samples"] == 200 and data["n_features"] == 64
    assert data["name"].startswith("digits")
    assert len(row["eigenvalues"]) == 3 and row["eigenvalues"] == sorted(
        row["eigenvalues"], reverse=True
    )
    assert all(0 < mu < 1 for mu in row["eigenvalues"])
    assert row["epsilon"] > 0 and 1 < row["intrinsic_dimension"] < 64 and row["time_s"] > 0


def test_embed_csv_without_target_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, X, _ = _blobs_csv(tmp_path, with_target=False)
    png = tmp_path / "emb.png"
    assert main(["embed", "--data", str(path), "--epsilon", "2.0", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "120 x 3" in out and "epsilon: 2" in out and f"figure written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cluster_scores_against_the_target_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _, _ = _blobs_csv(tmp_path)
    png = tmp_path / "clusters.png"
    assert (
        main(["cluster", "--data", str(path), "--target", "kind", "--json", "--plot", str(png)])
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    settings = res["settings"]
    assert settings["n_clusters"] == 3 and settings["scored_against_target"]
    assert res["plot"] == str(png)
    assert [r["model"] for r in res["results"]] == ["AttentionKMeans", "KMeans"]
    for r in res["results"]:  # three well separated blobs: both recover them exactly
        assert r["ari"] == pytest.approx(1.0) and r["nmi"] == pytest.approx(1.0)
    assert res["results"][0]["inertia"] == pytest.approx(res["results"][1]["inertia"], rel=1e-6)
    assert png.stat().st_size > 1000


def test_cluster_without_target_prints_a_table(tmp_path, capsys):
    path, _, _ = _blobs_csv(tmp_path, with_target=False)
    assert main(["cluster", "--data", str(path), "--n-clusters", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 clusters" in out and "ARI" not in out
    assert sum(line.startswith(("AttentionKMeans", "KMeans")) for line in out.splitlines()) == 2


def test_compare_plot_shows_the_differences_with_the_values(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from skattention._cli import _compare

    drawn = {}
    original = _compare.plot_scores

    def spy(fig, dataset, results):
        original(fig, dataset, results)
        ax = fig.axes[0]
        drawn["xlim"] = ax.get_xlim()
        drawn["texts"] = [t.get_text() for t in ax.texts]
        drawn["results"] = results

    monkeypatch.setattr(_compare, "plot_scores", spy)
    png = tmp_path / "scores.png"
    argv = ["compare", "--cv", "2", "--max-samples", "150", "--models", "knn,kernel",
            "--plot", str(png)]
    assert main(argv) == 0
    results = drawn["results"]
    assert drawn["texts"] == [f"{r['mean']:.4f}" for r in results]
    lo = min(min(r["mean"] - r["std"], *r["scores"]) for r in results)
    hi = max(max(r["mean"] + r["std"], *r["scores"]) for r in results)
    # the axis spans the scores, not [0, 1]: a difference of 0.01 is visible
    assert lo > drawn["xlim"][0] > lo - (hi - lo) and drawn["xlim"][1] > hi
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "figure written" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["embed", "--max-samples", "1"], "--max-samples must be at least 2"),
        (["embed", "--epsilon", "-1"], "--epsilon must be a positive number"),
        (["embed", "--n-components", "1", "--plot", "x.png"], "--plot needs --n-components 2"),
        (["embed", "--target", "y"], "--target needs --data"),
        (["cluster", "--drop", "id"], "--drop needs --data"),
        (["compare", "--models", "knn,svm"], "unknown --models svm"),
        (
            ["cluster", "--max-samples", "20", "--n-clusters", "50"],
            "--n-clusters must be between 1 and the 20",
        ),
    ],
)
def test_embed_and_cluster_one_line_errors(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("skattention: error:")
        and message in err
        and len(err.strip().splitlines()) == 1
    )


def test_plot_without_matplotlib_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main(["cluster", "--max-samples", "50", "--plot", "c.png"]) == 2
    assert "skattention[plot]" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["embed", "cluster"])
def test_subcommand_help_shows_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert (
        "examples:" in out
        and f"skattention {command}" in out
        and "--plot" in out
        and "--json" in out
    )


# --------------------------------------------------------------------------- CSV dialects, options


def _write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding))
    return path


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


# --------------------------------------------------------------------------- fast errors


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
