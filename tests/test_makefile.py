"""The Makefile's two commands, by dry run (``make -n``): what a fresh clone runs, and that a set-up
already done is not redone. Nothing is installed; .ci/run exercises the real set-up."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parents[1]

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not (ROOT / "Makefile").is_file(),
    reason="needs make and the repository's Makefile",
)


def make(*args, check=True):
    """``make -n ARGS`` in the repository root: the commands it would run, one string."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(ROOT), *args],
        capture_output=True, text=True, check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def installed_venv(tmp_path, extras, *, newer_than_pyproject=True):
    """A stand-in environment with a python and the stamp of ``extras``, dated after (or before)
    pyproject.toml."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    stamp = venv / f".skattention-installed-{extras}"
    stamp.touch()
    pyproject_mtime = (ROOT / "pyproject.toml").stat().st_mtime
    stamp_mtime = pyproject_mtime + (60 if newer_than_pyproject else -60)
    os.utime(stamp, (stamp_mtime, stamp_mtime))
    return venv


def test_help_lists_the_targets():
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True,
                         text=True, check=True).stdout
    for target in ["compare", "test", "docs", "lint", "clean", "clean-venv"]:
        assert f"\n  {target} " in out
    for variable in ["ARGS=", "TORCH=", "PYTHON=", "VENV="]:
        assert variable in out


@pytest.mark.parametrize("target, extras, command", [
    ("test", "test", "-m pytest"),
    ("compare", "progress,plot,csv", "bin/skattention compare"),
    ("docs", "docs", "-m sphinx"),
])
def test_fresh_clone_creates_the_venv_installs_torch_then_the_package(tmp_path, target, extras,
                                                                       command):
    venv = tmp_path / "venv"
    out = make(target, f"VENV={venv}", "PYTHON=python3.11").stdout
    steps = [
        f"python3.11 -m venv --upgrade-deps {venv}",
        "import torch",  # an installed torch is kept
        "install --dry-run --quiet --no-index --no-deps torch",  # a wheel on disk first
        "install torch --index-url https://download.pytorch.org/whl/cpu",  # else the CPU index
        f'install -e ".[{extras}]"',
        f"touch {venv}/.skattention-installed-{extras}",
        command,
    ]
    positions = [out.find(step) for step in steps]
    assert -1 not in positions, out
    assert positions == sorted(positions), out


def test_cuda_torch_is_the_default_pypi_build(tmp_path):
    out = make("test", f"VENV={tmp_path / 'venv'}", "TORCH=cuda").stdout
    assert '[ "cuda" = cuda ]' in out


def test_unknown_torch_build_is_refused():
    proc = make("test", "TORCH=gpu", check=False)
    assert proc.returncode != 0
    assert "TORCH must be cpu or cuda, not 'gpu'" in proc.stderr


def test_second_run_goes_straight_to_the_command(tmp_path):
    venv = installed_venv(tmp_path, "test")
    out = make("test", f"VENV={venv}", "ARGS=-x -k knn").stdout
    assert out.strip() == f"{venv}/bin/python -m pytest -x -k knn"


def test_other_extras_are_installed_into_the_same_venv(tmp_path):
    venv = installed_venv(tmp_path, "test")
    out = make("compare", f"VENV={venv}").stdout
    assert "-m venv" not in out
    assert 'install -e ".[progress,plot,csv]"' in out


def test_a_newer_pyproject_reinstalls(tmp_path):
    venv = installed_venv(tmp_path, "test", newer_than_pyproject=False)
    out = make("test", f"VENV={venv}").stdout
    assert "-m venv" not in out
    assert 'install -e ".[test]"' in out
