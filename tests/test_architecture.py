"""The package's import graph: no import circles, and no import that runs up the layers; and the house's size
limits where they hold already.

Every `import` and `from ... import` of every module counts, at any depth (one inside a function runs as surely
as one at the top, only later), relative ones resolved; `from .pkg import name` counts as importing pkg.name when
that is a module. Run it as a script to print the circles (strongly connected components) and the upward imports:

    python tests/test_architecture.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "precaudit"

# Bottom-up: a module may import its own layer and the ones below it. A subpackage or module not named here is in
# the layer of its nearest named parent; the package root's own modules that are named nowhere are unlayered
# (only the circle check applies to them).
LAYERS: list[set[str]] = [
    {"errors", "escape", "files", "dtypes", "ir", "collector"},
    {"frontends", "analysis"},
    {"rules"},
    {"trace", "fixer", "keeplist", "train"},
    {"report"},
    {"pipeline", "api", "cli", "ruletest"},
]

# Circles known today outside analysis/ and frontends/, for their owners to break: this list is to be emptied,
# never extended (a new circle, or a module more in a known one, fails the test).
KNOWN_CIRCLES: list[set[str]] = []
# Imports up the layers known today, outside analysis/ and frontends/: to be emptied, like KNOWN_CIRCLES.
KNOWN_UPWARD: list[tuple[str, str]] = []

# The house limits (functions under 80 lines, modules under 500) hold for the whole package.
FUNCTION_LINES, MODULE_LINES = 80, 500


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """id() of every node under an `if TYPE_CHECKING:`: imports there never run (they are the type checker's)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that the module imports anywhere in its body (function-level imports included; imports
    for the type checker alone, under `if TYPE_CHECKING:`, are not: they never run)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names)
    return {target for target in targets if target in modules and target != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return sorted(found, key=sorted)


def layer_of(name: str) -> int | None:
    parts = name.split(".")[1:]  # without "precaudit"
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        for level, members in enumerate(LAYERS):
            if prefix in members:
                return level
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where the imported module sits in a higher layer than its importer."""
    found = []
    for name, targets in sorted(graph.items()):
        mine = layer_of(name)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append((name, target))
    return found


def test_the_import_graph_is_read():
    """The graph has the edges a reader sees in the code: top-level, relative and inside functions."""
    graph = import_graph()
    assert "precaudit.analysis.sites.base" in graph["precaudit.analysis.collect"]
    assert "precaudit.errors" in graph["precaudit.frontends.onnx"]
    assert "precaudit.api" in graph["precaudit"]  # imported inside __getattr__


def test_the_circle_finder_finds_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [{"a", "b", "c"}]


def test_no_import_circle_in_the_package():
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert new == []


def test_the_known_circles_are_still_there():
    """A circle broken is taken off KNOWN_CIRCLES, so the list cannot hide a new one under an old name."""
    found = circles(import_graph())
    assert [sorted(c) for c in KNOWN_CIRCLES if c not in found] == []


def test_no_import_up_the_layers():
    """analysis/ and frontends/ have none (analysis.sites imported train.facts once); the rest only the known."""
    ups = upward_imports(import_graph())
    assert [up for up in ups if up not in KNOWN_UPWARD] == []
    assert [up for up in KNOWN_UPWARD if up not in ups] == []


def test_an_upward_import_is_found():
    graph = {"precaudit.analysis.x": {"precaudit.train.y", "precaudit.ir"}, "precaudit.train.y": set(),
             "precaudit.ir": set()}
    assert upward_imports(graph) == [("precaudit.analysis.x", "precaudit.train.y")]


def oversized(path: Path) -> list[str]:
    """The module if it has MODULE_LINES lines or more, and each function (or method) of FUNCTION_LINES or more."""
    source = path.read_text()
    lines = source.count("\n")
    found = [f"{path.name}: {lines} lines"] if lines >= MODULE_LINES else []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length >= FUNCTION_LINES:
                found.append(f"{path.name}: {node.name}() {length} lines")
    return found


def test_functions_and_modules_stay_small():
    paths = sorted(ROOT.rglob("*.py"))
    assert len(paths) > 150  # every module of the package is read
    assert [line for path in paths for line in oversized(path)] == []


def test_a_long_function_is_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}")
    assert oversized(tmp_path / "long.py") == [f"long.py: f() {FUNCTION_LINES + 1} lines"]


def main() -> int:
    graph = import_graph()
    print("circles:")
    for component in circles(graph):
        known = " (known)" if component in KNOWN_CIRCLES else ""
        print(f"  {' <-> '.join(sorted(component))}{known}")
    print("imports up the layers:")
    for importer, imported in upward_imports(graph):
        known = " (known)" if (importer, imported) in KNOWN_UPWARD else ""
        print(f"  {importer} -> {imported}{known}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
