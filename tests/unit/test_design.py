"""The package's shape, checked from the source.

- No import cycles between dist_dl's modules. A cycle makes import order
  matter (a half-initialised module is seen by the other), and it ties
  together code that should change separately.
- Layers that follow the data: ``dist_dl.core`` (the helpers every stage
  uses) imports no stage and not the application; each stage imports
  ``core`` and the stages before it in :data:`STAGES`, never a later one, a
  peer of its own group or the application (``dist_dl.app``, ``dist_dl.cli``),
  which may import everything. Both imports at module level and imports
  inside functions (run on first call) count: either is a dependency.
- No module over :data:`MAX_LINES` lines.
- Importing a module that runs in workers loads only the dist_dl modules
  that its own imports reach (package ``__init__``s import their public
  names on first use), and no heavy library it does not import.

Imports are read with ``ast`` (nothing is imported) except in the last check,
so the others also cover modules whose dependencies are not installed here.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[2] / "src"

# The stages in the order data flows through them: raw images to shards
# (prepare), shards to batches (read), workers started (launch), runs, metrics
# and models logged (tracking), logged models scoring DataFrames (score), and
# the three ways of training that use them, as peers: one model on all
# workers (train, whose TrainedModel scores with score), an ensemble of
# partition models (ensemble), parallel trials (search).
STAGES = (("prepare",), ("read",), ("launch",), ("tracking",), ("score",),
          ("train", "ensemble", "search"))
BASE = "core"
SHELL = ("app", "cli")
MAX_LINES = 600


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


def _part(module: str) -> str:
    """The top-level part of dist_dl a module belongs to ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, dict[str, int]], src: Path, package: str) -> list[str]:
    """Each import that goes against the layers, as "file:line: what and why"."""
    rank = {BASE: -1, **{stage: i for i, group in enumerate(STAGES) for stage in group}}
    found = []
    for module, edges in sorted(graph.items()):
        part = _part(module)
        if part not in rank:
            continue  # the shell and the package root may import anything
        for other, line in sorted(edges.items(), key=lambda e: e[1]):
            other_part = _part(other)
            if other_part == part:
                continue
            if other_part in rank and rank[other_part] < rank[part]:
                continue
            if other_part not in rank:
                why = "the application shell, which no stage or core module imports"
            elif part == BASE:
                why = f"the stage {other_part!r}; {BASE} imports no stage"
            elif rank[other_part] == rank[part]:
                why = f"the stage {other_part!r}, a peer of {part!r} (neither imports the other)"
            else:
                why = f"the stage {other_part!r}, which comes after {part!r}"
            found.append(f"{_file(src, package, module)}:{line}: {module} imports {other}: {why}")
    return found


def _file(src: Path, package: str, module: str) -> str:
    path, _ = _modules(src, package)[module]
    return str(path.relative_to(src.parent))


def long_modules(src: Path, package: str, limit: int = MAX_LINES) -> list[str]:
    return [f"{_file(src, package, name)}: {n} lines (at most {limit}: split it where its parts "
            f"have separate concerns)"
            for name, (path, _) in sorted(_modules(src, package).items())
            if (n := len(path.read_text().splitlines())) > limit]


@pytest.mark.parametrize("deferred", [False, True], ids=["module-level", "with-deferred"])
def test_stages_import_only_core_and_earlier_stages(deferred):
    graph = import_graph(SRC, "dist_dl", deferred=deferred)
    parts = {_part(m) for m in graph}
    assert {BASE, *SHELL, *(s for g in STAGES for s in g)} <= parts, \
        f"a layer named here is missing from src/dist_dl: {sorted(parts)}"
    unplaced = sorted(parts - {BASE, *SHELL, "", *(s for g in STAGES for s in g)})
    assert not unplaced, f"dist_dl.{unplaced[0]} is in no layer: add it to STAGES, core or the shell " \
        "in tests/test_design.py"
    found = layer_violations(graph, SRC, "dist_dl")
    assert not found, "imports against the layers (move what both need into dist_dl.core or " \
        "into the earlier stage):\n" + "\n".join(found)


def test_no_module_is_over_the_line_limit():
    found = long_modules(SRC, "dist_dl")
    assert not found, "\n".join(found)


def test_the_layer_checks_find_what_goes_against_them(tmp_path):
    src = tmp_path / "src"
    package = src / "pkg"
    for folder in ("core", "read", "train", "search", "app"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "core" / "h.py").write_text("def f():\n    from pkg.read import r\n")
    (package / "read" / "r.py").write_text("from pkg.core import h\nfrom pkg.train import t\n")
    (package / "train" / "t.py").write_text("import pkg.read.r\nimport pkg.search.s\n" + "x = 1\n" * 700)
    (package / "search" / "s.py").write_text("from pkg.app import shell\n")
    (package / "app" / "shell.py").write_text("import pkg.train.t\n")

    module_level = layer_violations(import_graph(src, "pkg", deferred=False), src, "pkg")
    assert module_level == [
        "src/pkg/read/r.py:2: pkg.read.r imports pkg.train.t: the stage 'train', which comes after 'read'",
        "src/pkg/search/s.py:1: pkg.search.s imports pkg.app.shell: the application shell, which no "
        "stage or core module imports",
        "src/pkg/train/t.py:2: pkg.train.t imports pkg.search.s: the stage 'search', a peer of 'train' "
        "(neither imports the other)"]
    with_deferred = layer_violations(import_graph(src, "pkg", deferred=True), src, "pkg")
    assert with_deferred[0] == \
        "src/pkg/core/h.py:2: pkg.core.h imports pkg.read.r: the stage 'read'; core imports no stage"
    assert long_modules(src, "pkg") == [
        "src/pkg/train/t.py: 702 lines (at most 600: split it where its parts have separate concerns)"]


# Modules that run in workers (Horovod or tf.distribute processes, Spark
# tasks), with the libraries importing each must not load: a worker sets its
# threads and devices before TensorFlow loads, and a Spark task should not pay
# for MLflow or TensorFlow it does not use.
WORKER_MODULES = {
    "dist_dl.read.arrow": ("tensorflow", "mlflow", "pyspark", "petastorm"),
    "dist_dl.read.dataset": ("tensorflow", "mlflow", "pyspark", "petastorm"),
    "dist_dl.read.rows": ("tensorflow", "mlflow", "pyspark", "petastorm", "torch"),
    "dist_dl.read.imaging": ("tensorflow", "mlflow", "pyspark", "petastorm", "torch"),
    "dist_dl.read.torchdata": ("tensorflow", "mlflow", "pyspark", "petastorm", "torch"),
    "dist_dl.read.processes": ("tensorflow", "mlflow", "pyspark", "petastorm", "torch"),
    "dist_dl.launch.core._worker_main": ("tensorflow", "mlflow", "pyspark", "horovod"),
    "dist_dl.launch.core.worker": ("tensorflow", "mlflow", "pyspark", "horovod"),
    "dist_dl.train.engines.core": ("tensorflow", "mlflow", "pyspark", "horovod", "torch"),
    "dist_dl.train.engines.keras_common": ("tensorflow", "mlflow", "pyspark", "horovod", "torch"),
    "dist_dl.train.engines.horovod": ("tensorflow", "mlflow", "pyspark", "horovod", "torch"),
    "dist_dl.train.engines.tf_distribute": ("tensorflow", "mlflow", "pyspark", "horovod", "torch"),
    "dist_dl.train.engines.keras3": ("tensorflow", "mlflow", "pyspark", "horovod", "torch"),
    "dist_dl.train.engines.torch_ddp": ("tensorflow", "mlflow", "pyspark", "horovod", "torch"),
    "dist_dl.train.checkpoint": ("tensorflow", "mlflow", "pyspark", "horovod"),
    "dist_dl.ensemble.task": ("tensorflow", "mlflow", "pyspark"),
    "dist_dl.search.task": ("tensorflow", "mlflow", "pyspark"),
}

_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""


def _reached(graph: dict[str, dict[str, int]], module: str) -> set[str]:
    """What importing ``module`` may load: it, its packages, and what their
    module-level imports reach, with the packages of each."""
    reached, todo = set(), [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            package = ".".join(parts[:i])
            if package not in reached and package in graph:
                reached.add(package)
                todo.extend(graph[package])
    return reached


@pytest.mark.parametrize("module", sorted(WORKER_MODULES))
def test_a_worker_module_loads_only_what_it_imports(module):
    graph = import_graph(SRC, "dist_dl", deferred=False)
    done = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True, text=True,
                          timeout=50, env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    extra = sorted(m for m in loaded if m.split(".")[0] == "dist_dl")
    extra = [m for m in extra if m not in _reached(graph, module)]
    assert not extra, f"importing {module} loads {extra}, which its imports do not reach: a " \
        "package __init__ imports them eagerly (make it lazy, see dist_dl.core.lazy)"
    heavy = [top for top in WORKER_MODULES[module] if top in loaded]
    assert not heavy, f"importing {module} loads {heavy}: import them inside the functions that " \
        "use them"


LAZY_PACKAGES = ("dist_dl", "dist_dl.prepare", "dist_dl.read", "dist_dl.launch", "dist_dl.tracking",
                 "dist_dl.score", "dist_dl.train", "dist_dl.ensemble", "dist_dl.search",
                 "dist_dl.app.bench", "dist_dl.app.databricks")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_package_s_public_names_come_from_the_modules_its_map_names(package):
    """Each name of ``__all__`` is in the package's name -> module map, and that
    module lists it in its own ``__all__`` (checked without building lazily
    defined Keras classes)."""
    import importlib

    module = importlib.import_module(package)
    exports = module._EXPORTS
    assert list(exports) == [n for n in module.__all__ if n in exports] and \
        set(exports) == set(module.__all__), \
        f"{package}: __all__ and _EXPORTS name different things: {sorted(set(exports) ^ set(module.__all__))}"
    wrong = [f"{name} -> {source}" for name, source in exports.items()
             if name not in getattr(importlib.import_module(source), "__all__", ())]
    assert not wrong, f"{package}._EXPORTS names modules that do not export these: {wrong}"
    assert set(module.__all__) <= set(dir(module))


# The engines (dist_dl.train.engines): one module each, sharing only the core.
SHARED_ENGINE_MODULES = {"dist_dl.train.engines.core", "dist_dl.train.engines.keras_common"}


def test_each_engine_is_one_module_that_shares_only_the_core():
    import importlib

    from dist_dl.train.engines import ENGINES

    graph = import_graph(SRC, "dist_dl", deferred=True)
    engine_modules = {module: {m for m in graph[module] if m.startswith("dist_dl.train.engines")}
                      for module in ENGINES.values()}
    crossing = {module: sorted(imported - SHARED_ENGINE_MODULES)
                for module, imported in engine_modules.items() if imported - SHARED_ENGINE_MODULES}
    assert not crossing, f"engine modules importing other engines (move what both need into " \
        f"dist_dl.train.engines.core or .keras_common): {crossing}"
    for name, module in ENGINES.items():
        loaded = importlib.import_module(module)
        assert callable(getattr(loaded, "train", None)) and \
            callable(getattr(loaded, "runner", None)), \
            f"engine {name!r} ({module}) must define train(spec) and runner(cfg, backend, spark)"


# dist_dl.launch's folders, lowest first: each imports only from its own
# folder and those before it. runners/ holds the base of every runner (and the
# runners of the maintained engines); horovod/, the one folder that touches
# Horovod, comes last, so that it can be left out without touching the rest.
LAUNCH_LAYERS = ("core", "fork", "backends", "engines", "runners", "horovod")


def launch_violations(graph: dict[str, dict[str, int]], src: Path, package: str) -> list[str]:
    """Each import in ``package``.launch that goes against ``LAUNCH_LAYERS``
    (or from one runner module to another), as "file:line: what"."""
    prefix = f"{package}.launch."

    def folder(module: str) -> str | None:
        return module[len(prefix):].split(".")[0] if module.startswith(prefix) else None

    found = []
    for module, edges in sorted(graph.items()):
        here = folder(module)
        if here is None:
            continue
        for other, line in sorted(edges.items(), key=lambda e: e[1]):
            there = folder(other)
            if there is None or other == module:
                continue
            sibling = (here == there == "runners" and other != f"{package}.launch.runners.base"
                       and not other.endswith(".runners"))
            if LAUNCH_LAYERS.index(there) > LAUNCH_LAYERS.index(here) or sibling:
                found.append(f"{_file(src, package, module)}:{line}: {module} imports {other}")
    return found


def horovod_imports(src: Path, package: str) -> list[str]:
    """Each import of Horovod in ``package`` outside ``package``.launch.horovod,
    of the launch package, as "file:line"."""
    found = []
    for name, (path, _) in sorted(_modules(src, package).items()):
        if not name.startswith(f"{package}.launch.") or name.startswith(f"{package}.launch.horovod"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "horovod" or n.startswith("horovod.") for n in names):
                found.append(f"{_file(src, package, name)}:{node.lineno}")
    return found


def test_launch_folders_import_only_their_own_and_earlier_ones():
    modules = [m for m in _modules(SRC, "dist_dl") if m.startswith("dist_dl.launch.")]
    unplaced = sorted(m for m in modules if m.split(".")[2] not in LAUNCH_LAYERS)
    assert not unplaced, f"modules of dist_dl.launch in no folder of LAUNCH_LAYERS: {unplaced}"
    found = launch_violations(import_graph(SRC, "dist_dl", deferred=True), SRC, "dist_dl")
    assert not found, "imports against dist_dl.launch's folders (" + " < ".join(LAUNCH_LAYERS) + \
        "; runners import only runners.base):\n" + "\n".join(found)
    found = horovod_imports(SRC, "dist_dl")
    assert not found, "Horovod imported outside dist_dl.launch.horovod:\n" + "\n".join(found)


def test_the_launch_checks_find_what_goes_against_them(tmp_path):
    src = tmp_path / "src"
    launch = src / "pkg" / "launch"
    for folder in LAUNCH_LAYERS:
        (launch / folder).mkdir(parents=True)
        (launch / folder / "__init__.py").write_text("")
    (src / "pkg" / "__init__.py").write_text("")
    (launch / "__init__.py").write_text("")
    (launch / "core" / "c.py").write_text("def f():\n    from pkg.launch.fork import s\n")
    (launch / "fork" / "s.py").write_text("from pkg.launch.core import c\n")
    (launch / "runners" / "base.py").write_text("")
    (launch / "runners" / "a.py").write_text("from pkg.launch.runners import base\n")
    (launch / "runners" / "b.py").write_text("from pkg.launch.runners.a import A\n")
    (launch / "engines" / "e.py").write_text("import os\nimport horovod.torch\n")
    (launch / "horovod" / "h.py").write_text("from horovod.spark import run\n")

    found = launch_violations(import_graph(src, "pkg", deferred=True), src, "pkg")
    assert found == ["src/pkg/launch/core/c.py:2: pkg.launch.core.c imports pkg.launch.fork.s",
                     "src/pkg/launch/runners/b.py:1: pkg.launch.runners.b imports pkg.launch.runners.a"]
    assert horovod_imports(src, "pkg") == ["src/pkg/launch/engines/e.py:2"]


def test_the_runners_are_siblings_over_one_base():
    from dist_dl.launch import (HorovodRunner, MirroredStrategyRunner, TFDistributeRunner,
                                TorchDistributor)
    from dist_dl.launch.runners.base import Runner

    runners = (HorovodRunner, TFDistributeRunner, MirroredStrategyRunner, TorchDistributor)
    assert all(issubclass(runner, Runner) for runner in runners)
    nested = [(a.__name__, b.__name__) for a in runners for b in runners
              if a is not b and issubclass(a, b)]
    assert not nested, f"runners that subclass another runner: {nested}"
