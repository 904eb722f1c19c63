"""``skattention embed`` and ``cluster``, and every subcommand's ``--plot``."""

import json
import sys

import pytest

from skattention._cli import main

from .files import blobs_csv as _blobs_csv


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
        (["compare", "--models", " , "], "--models names no model"),  # (ran the defaults)
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
