"""The package's layout keeps its promises: no import cycle (deferred imports counted), no runtime or device named
by a string test outside onnxmem/targets/, no module a newcomer cannot read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "onnxmem"
MAX_LINES = 800
TARGET_NAMES = frozenset({"cpu", "cuda"})


def _modules() -> dict[str, Path]:
    """Give every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Give the package's modules that `name` imports when it runs, at load time or inside a function (imports
    under `if TYPE_CHECKING:` are not run)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules and m != name}


def test_the_package_has_no_import_cycle() -> None:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for imported in _imports(name, path, modules):
            # (importing a.b.c runs a's and a.b's __init__ first; those are edges too, and they hold no logic)
            graph.add_edge(name, imported)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


def _names_a_target(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TARGET_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_target(e) for e in node.elts)
    return False


def test_no_provider_or_device_string_test_outside_targets() -> None:
    found = []
    for name, path in _modules().items():
        if name.startswith("onnxmem.targets"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(_names_a_target(e) for e in [node.left, *node.comparators]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == [], f"a runtime or device named by a string test outside targets/: {found}"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_is_over_the_reading_limit(name: str) -> None:
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (limit {MAX_LINES}): split it by what it does"


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The walkers above find what they look for on code written to break each rule (so a quiet result means a
    clean package, not a blind check)."""
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n"
                                   "def f():\n    from .b import x\n    return x\n")
    modules = {"onnxmem.a": tmp_path / "a.py", "onnxmem.b": tmp_path / "b.py", "onnxmem.c": tmp_path / "c.py"}
    assert _imports("onnxmem.a", tmp_path / "a.py", modules) == {"onnxmem.b"}  # deferred counted, type-only not
    compare = ast.parse("provider == 'cuda'", mode="eval").body
    assert isinstance(compare, ast.Compare) and _names_a_target(compare.comparators[0])
    assert _names_a_target(ast.parse("('cpu', 'rocm')", mode="eval").body)
    assert not _names_a_target(ast.parse("'cudnn'", mode="eval").body)
