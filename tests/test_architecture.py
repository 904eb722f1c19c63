"""The shape of the house (docs/contributing.md): families never import each other, the
engine and the plumbing point one way, no module imports itself back through another, and no
room grows past the size a reader can hold."""

import ast
import pathlib

import pytest

import skattention

PACKAGE = pathlib.Path(skattention.__file__).parent
FAMILIES = ("neighbors", "manifold", "cluster", "nn")
# lines of a module; lines of code of a class or a function (docstrings, comments and blank
# lines not counted)
MAX_MODULE_LINES = 500
MAX_ENGINE_MODULE_LINES = 450
MAX_CLASS_LINES = 350
MAX_FUNCTION_LINES = 80


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.glob("**/*.py")}


def _imported_modules(name):
    """The skattention modules ``name`` imports, at module level or inside functions: for
    ``from package import name`` the submodule when it is one, else the package."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]
        else:
            continue
        yield from (t for t in targets if t in MODULES and t != name)


def _family(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FAMILIES else None


def test_families_never_import_each_other():
    for name in MODULES:
        family = _family(name)
        if family is None:
            continue
        for target in _imported_modules(name):
            other = _family(target)
            assert other in (None, family), f"{name} imports {target}: families are independent"


def test_engine_and_utils_point_one_way():
    """The engine imports neither the plumbing (scikit-learn's side) nor a family; the plumbing
    imports no family (the engine, below it, it may)."""
    for name in MODULES:
        for target in _imported_modules(name):
            if name.startswith("skattention._engine"):
                assert target.startswith("skattention._engine") or target in (
                    "skattention._config", "skattention"), f"{name} imports {target}"
            if name.startswith("skattention.utils"):
                assert _family(target) is None and not target.startswith("skattention._cli"), (
                    f"{name} imports {target}")


def _ancestors(name):
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycles():
    """No module reaches itself through the modules it imports (function-level imports
    included; a package's own ``__init__`` importing its modules is not a cycle)."""
    graph = {name: {t for t in _imported_modules(name) if t not in _ancestors(name)}
             for name in MODULES}
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def _code_lines(node, lines):
    docstrings = set()
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and ast.get_docstring(inner, clean=False) is not None:
            doc = inner.body[0]
            docstrings.update(range(doc.lineno, doc.end_lineno + 1))
    return sum(1 for i in range(node.lineno, node.end_lineno + 1)
               if i not in docstrings and lines[i - 1].strip()
               and not lines[i - 1].strip().startswith("#"))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_rooms_stay_livable(name):
    path = MODULES[name]
    text = path.read_text()
    lines = text.splitlines()
    limit = MAX_ENGINE_MODULE_LINES if "_engine" in path.parts else MAX_MODULE_LINES
    assert len(lines) <= limit, f"{name}: {len(lines)} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert _code_lines(node, lines) <= MAX_CLASS_LINES, f"{name}.{node.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert _code_lines(node, lines) <= MAX_FUNCTION_LINES, f"{name}: {node.name}"
