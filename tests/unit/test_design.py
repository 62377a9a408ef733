"""The cases of tests/integration/test_design.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package) for every module of ``package``."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _is_type_checking(node: ast.AST) -> bool:
    # `if TYPE_CHECKING:` blocks never run, so their imports are no dependency.
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_graph(src: Path, package: str, *, deferred: bool) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line} within ``package``.

    Args:
        deferred: Also count imports inside functions (run on the first call,
            not at import time).
    """
    modules = _modules(src, package)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        edges: dict[str, int] = {}
        own_package = name.split(".") if is_package else name.split(".")[:-1]

        def target(base: str, alias: str) -> str | None:
            # `from a import b` depends on the module a.b if there is one, else on a.
            for candidate in (f"{base}.{alias}", base):
                if candidate in modules:
                    return candidate
            return None

        def visit(nodes) -> None:
            for node in nodes:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    if deferred:
                        visit(ast.iter_child_nodes(node))
                elif _is_type_checking(node):
                    continue
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name in modules:
                            edges.setdefault(alias.name, node.lineno)
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parent = own_package[:len(own_package) - node.level + 1]
                        base = ".".join(parent + ([base] if base else []))
                    for alias in node.names:
                        found = target(base, alias.name)
                        if found is not None and found != name:
                            edges.setdefault(found, node.lineno)
                else:
                    visit(ast.iter_child_nodes(node))

        visit(ast.parse(path.read_text(), str(path)).body)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's
    algorithm), each as one cycle through the group, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(_one_cycle(graph, set(group)))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def _one_cycle(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """A path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph[node]):
            if other == start:
                return paths[node] + [start]
            if other in group and other not in paths:
                paths[other] = paths[node] + [other]
                queue.append(other)
    raise AssertionError(f"no cycle through {sorted(group)}")  # a group always has one


def _describe(graph, cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + \
        f" -> {cycle[-1]}"


@pytest.mark.parametrize("deferred", [False, True], ids=["module-level", "with-deferred"])
def test_dist_dl_has_no_import_cycles(deferred):
    graph = import_graph(SRC, "dist_dl", deferred=deferred)
    assert len(graph) > 50 and graph["dist_dl.cli"], "the walk found no modules or no imports"
    found = cycles(graph)
    assert not found, "import cycles (move what both sides need into a module below them):\n" + \
        "\n".join(_describe(graph, c) for c in found)


def test_the_check_finds_a_cycle(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.a import A\n")
    (package / "sub" / "a.py").write_text("from . import b\nA = 1\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
        "def later():\n    from ..sub import a\n")
    (package / "c.py").write_text("import pkg.sub.b\n")

    module_level = import_graph(tmp_path, "pkg", deferred=False)
    assert module_level["pkg.sub.a"] == {"pkg.sub.b": 1}
    assert module_level["pkg.sub.b"] == {}  # TYPE_CHECKING and function bodies do not count
    assert cycles(module_level) == []
    with_deferred = import_graph(tmp_path, "pkg", deferred=True)
    assert cycles(with_deferred) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]]
    (package / "sub" / "b.py").write_text("import pkg.c\n")
    assert cycles(import_graph(tmp_path, "pkg", deferred=False)) == \
        [["pkg.c", "pkg.sub.b", "pkg.c"]]
