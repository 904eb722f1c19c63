"""Package-level promises: the engine stays torch-only, the README's quick start runs."""

import ast
import pathlib
import re

import skattention

PACKAGE = pathlib.Path(skattention.__file__).parent
ROOT = PACKAGE.parent


def test_engine_has_no_sklearn_imports():
    for path in (PACKAGE / "_engine").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            assert not any(n.split(".")[0] == "sklearn" for n in names), f"{path.name} imports {names}"


def test_public_surface():
    for name in ["attention", "kneighbors", "MetricAttentionClassifier", "MetricAttentionRegressor",
                 "MetricAttentionTransformer", "AttentionDiffusionEmbedding", "AttentionKMeans",
                 "AttentionMeanShift", "AttentionNetworkClassifier",
                 "config_context", "get_config", "set_config", "resolve_device"]:
        assert name in skattention.__all__ and hasattr(skattention, name)


def test_readme_quick_start_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python block"
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 15
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Classifier" in out and "0." in out


def test_readme_names_the_ci_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
    assert "make compare" in readme and "make compare" in ci
