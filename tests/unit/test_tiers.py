"""The test tiers hold what they say (tests/conftest.py): every test file is in
a tier; the unit tier imports no heavy framework (it runs where none is
installed); the markers CI selects by are on tests that exist."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "reliability", "hosts")
HEAVY = ("tensorflow", "pyspark", "horovod", "torch", "keras", "tf_keras", "petastorm")


def test_every_test_file_is_in_a_tier():
    stray = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
             if p.relative_to(TESTS).parts[0] not in TIERS]
    assert not stray, f"test files outside the tiers {TIERS}: {stray}: move each into one"
    for tier in TIERS:
        assert list((TESTS / tier).glob("test_*.py")), f"tests/{tier} holds no test file"


def _module_level_imports(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, node.lineno))
    return found


def test_unit_tests_import_no_framework_at_module_level():
    offending = [f"tests/unit/{p.name}:{line} imports {name}"
                 for p in sorted((TESTS / "unit").glob("*.py"))
                 for name, line in _module_level_imports(p)
                 if name.split(".")[0] in HEAVY]
    assert not offending, ("the unit tier runs without these frameworks (make test-unit); "
                           "move the test to tests/integration: " + "; ".join(offending))


@pytest.mark.parametrize("marker", ["slow", "profile_subset", "profile_subset_164"])
def test_each_marker_ci_selects_by_is_on_some_test(marker):
    pattern = re.compile(rf"pytest\.mark\.{marker}\b(?!_)")
    users = [p.name for tier in TIERS for p in (TESTS / tier).glob("test_*.py")
             if pattern.search(p.read_text())]
    assert users, f"no test carries pytest.mark.{marker}: CI's selection would be empty"


def test_the_hosts_tier_is_marked_hosts():
    for path in (TESTS / "hosts").glob("test_*.py"):
        assert re.search(r"^pytestmark = .*pytest\.mark\.hosts", path.read_text(), re.M), (
            f"{path.name}: the hosts tier's modules carry pytestmark = [pytest.mark.hosts, ...]")


def _marked_hosts(node: ast.FunctionDef, module_marked: bool) -> bool:
    return module_marked or any("hosts" in ast.unparse(d) for d in node.decorator_list)


def test_every_test_on_the_cluster_of_separate_hosts_is_marked_hosts():
    """The tests of the cluster of separate hosts share one cluster, in one
    process (an xdist_group given by the marker): one that asks for the
    cluster unmarked would start a second."""
    unmarked = []
    for path in [p for tier in TIERS[1:] for p in (TESTS / tier).glob("test_*.py")]:
        source = path.read_text()
        tree = ast.parse(source)
        module_marked = bool(re.search(r"^pytestmark = .*pytest\.mark\.hosts", source, re.M))
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            text = ast.get_source_segment(source, node)
            asks = ("hosts" in [a.arg for a in node.args.args] or '"hosts"' in text
                    or "where" in [a.arg for a in node.args.args])
            if asks and not _marked_hosts(node, module_marked):
                unmarked.append(f"{path.relative_to(TESTS)}::{node.name}")
    assert not unmarked, f"these use the cluster of separate hosts without pytest.mark.hosts: {unmarked}"
