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
    assert len(rows) == 6
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


@pytest.mark.parametrize(
    "content, message",
    [
        ("a,b\n1,x\n3,4\n", "column 'b' is not numeric (line 2: 'x')"),
        ("a,b\n1,\n3,4\n", "column 'b' has a missing value"),
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
    assert len(res["results"]) == 6
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
    assert (
        res["n_samples"] == 200 and res["n_features"] == 64 and res["dataset"].startswith("digits")
    )
    assert len(res["eigenvalues"]) == 3 and res["eigenvalues"] == sorted(
        res["eigenvalues"], reverse=True
    )
    assert all(0 < mu < 1 for mu in res["eigenvalues"])
    assert res["epsilon"] > 0 and 1 < res["intrinsic_dimension"] < 64 and res["time_s"] > 0


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
    assert res["n_clusters"] == 3 and res["scored_against_target"] and res["plot"] == str(png)
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


def test_compare_plot_draws_one_bar_per_model(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import skattention._cli as cli

    drawn = {}
    original = cli._plot_scores

    def spy(fig, dataset, results):
        original(fig, dataset, results)
        drawn["bars"] = [p.get_width() for p in fig.axes[0].patches]
        drawn["means"] = [r["mean"] for r in results]

    monkeypatch.setattr(cli, "_plot_scores", spy)
    all_models = cli._models
    monkeypatch.setattr(
        cli, "_models", lambda task, device: all_models(task, device)[:3]
    )  # the fast ones
    png = tmp_path / "scores.png"
    assert main(["compare", "--cv", "2", "--max-samples", "150", "--plot", str(png)]) == 0
    assert len(drawn["bars"]) == 3 and drawn["bars"] == pytest.approx(drawn["means"])
    assert png.exists() and "figure written" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["embed", "--max-samples", "1"], "--max-samples must be at least 2"),
        (["embed", "--epsilon", "-1"], "--epsilon must be a positive number"),
        (["embed", "--n-components", "1", "--plot", "x.png"], "--plot needs --n-components 2"),
        (["embed", "--target", "y"], "--target needs --data"),
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
