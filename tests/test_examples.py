"""Every script in examples/ runs to completion (in a scratch directory, which gets the plots)."""

import pathlib
import runpy
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, capsys, tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    if path.name.startswith("plot_"):
        pytest.importorskip("matplotlib")  # the optional `plot` extra
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(path)])
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip()
