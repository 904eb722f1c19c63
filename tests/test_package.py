"""Package-level promises: the engine stays torch-only behind one door, private scikit-learn
names stay in one compat module, the README's quick start runs."""

import ast
import pathlib
import re
import subprocess
import sys

import skattention

PACKAGE = pathlib.Path(skattention.__file__).parent
ROOT = PACKAGE.parent


def _imports(path):
    """(absolute module, imported names) of every import statement of a module; relative
    imports are resolved against the package."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, [alias.name for alias in node.names]


def test_engine_has_no_sklearn_imports():
    for path in (PACKAGE / "_engine").glob("*.py"):
        for module, _ in _imports(path):
            assert module.split(".")[0] != "sklearn", f"{path.name} imports {module}"
            # skattention.utils imports scikit-learn: the engine must not reach it either
            assert not module.startswith("skattention.utils"), f"{path.name} imports {module}"


def test_engine_has_one_door():
    """Outside the engine, code imports ``skattention._engine`` itself, never its private
    modules (``skattention._engine._attention``, ...)."""
    sources = [
        p
        for p in ROOT.glob("**/*.py")
        if "_engine" not in p.parts
        and ".venv" not in p.parts
        and p.parts[len(ROOT.parts)] in {"skattention", "benchmarks", "examples", "docs"}
    ]
    assert len(sources) > 30
    for path in sources:
        for module, names in _imports(path):
            private = [n for n in names if module == "skattention._engine" and n.startswith("_")]
            assert not module.startswith("skattention._engine._") and not private, (
                f"{path.relative_to(ROOT)} imports {module} {names}: use skattention._engine"
            )


def test_private_sklearn_names_only_in_the_compat_module():
    compat = PACKAGE / "utils" / "_sklearn_compat.py"
    for path in PACKAGE.glob("**/*.py"):
        if path == compat:
            continue
        for module, names in _imports(path):
            if module.split(".")[0] not in ("sklearn", "torch"):
                continue
            private = [m for m in module.split(".") if m.startswith("_")]
            private += [n for n in names if n.startswith("_")]
            assert not private, f"{path.relative_to(ROOT)} imports {private} from {module}"
        text = path.read_text()
        assert "._DropoutNd" not in text and "sklearn.utils._" not in text, path


def test_public_surface():
    for name in ["attention", "kneighbors", "MetricAttentionClassifier", "MetricAttentionRegressor",
                 "MetricAttentionTransformer", "AttentionDiffusionEmbedding", "AttentionKMeans",
                 "AttentionMeanShift", "AttentionNetworkClassifier",
                 "config_context", "get_config", "set_config", "resolve_device"]:
        assert name in skattention.__all__ and hasattr(skattention, name)


def test_every_public_subpackage_is_an_attribute_of_the_package():
    # in a fresh interpreter, where no test imported them: skattention.plotting was missing
    # while skattention.utils was there
    names = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")
                   if not p.parent.name.startswith("_"))
    assert "plotting" in names
    code = f"import skattention\nfor name in {names}: getattr(skattention, name)"
    subprocess.run([sys.executable, "-c", code], check=True)


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


def test_html_repr_links_to_the_api_page():
    import tomllib

    from skattention.utils import all_estimators
    from skattention.utils._estimator import DOCS_URL

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["urls"]["Documentation"] == DOCS_URL
    api = (ROOT / "docs" / "api.rst").read_text()
    for name, cls in all_estimators():
        link = cls()._get_doc_link()
        assert link == f"{DOCS_URL}generated/skattention.{name}.html"
        assert f"\n   {name}\n" in api  # its page is generated under that name
        assert link in cls()._repr_html_()


def test_docs_cite_no_file_that_does_not_ship():
    """Pages and docstrings cite pages of the documentation, or files of the repository;
    not notes kept elsewhere (the theory is the documentation's theory page)."""
    texts = [p.read_text() for p in (ROOT / "docs").glob("*.md")]
    texts += [p.read_text() for p in (ROOT / "skattention").rglob("*.py")
              if "_engine" not in p.parts]
    cited = {m for t in texts for m in re.findall(r"\b[A-Z]+\.md\b", t)}
    in_repository = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    assert cited <= in_repository, cited - in_repository
