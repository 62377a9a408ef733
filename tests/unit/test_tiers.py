"""The test tiers hold what they say (tests/conftest.py): every test file is in
a tier; the unit tier imports no heavy framework (it runs where none is
installed); the markers CI selects by are on tests that exist."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
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


@pytest.mark.parametrize("marker", ["slow", "profile_subset_164", "profile_dbr19"])
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


_GROUPED_CONFTEST = '''
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for i, item in enumerate(items):
        item.add_marker(pytest.mark.xdist_group(f"g{i % 2}"))
'''

_GROUPED_TESTS = '''
import os
import pytest

@pytest.mark.parametrize("i", range(8))
def test_case(i):
    with open(os.path.join(os.path.dirname(__file__), f"ran-{i}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
'''


@pytest.mark.timeout(120)
def test_xdist_groups_given_at_collection_keep_their_tests_in_one_process(tmp_path):
    """tests/conftest.py groups tests by cluster with xdist_group markers added
    at collection, as `make test` runs them (-n, --dist loadgroup): each group
    must run in one test process, or every process starts a cluster of its
    own. pytest 9.2 broke this silently (pytest-dev/pytest-xdist#1386): the
    constraints pin pytest below it until xdist follows."""
    (tmp_path / "conftest.py").write_text(_GROUPED_CONFTEST)
    (tmp_path / "test_grouped.py").write_text(_GROUPED_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                           "-q", "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = {i: (tmp_path / f"ran-{i}").read_text() for i in range(8)}
    for group in (0, 1):
        processes = {ran[i] for i in range(group, 8, 2)}
        assert len(processes) == 1, (f"the tests of group g{group} ran in {sorted(processes)}: "
                                     "xdist_group is not honoured (pytest and pytest-xdist versions?)")


_TIMED_OUT_TESTS = """
import signal
import time

import pytest


@pytest.mark.timeout(1)
def test_sleeps():
    time.sleep(30)


def test_after():
    pass


@pytest.mark.timeout(1)
def test_stuck():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # as in C code: the signal waits
    time.sleep(30)
"""


@pytest.mark.timeout(120)
def test_a_timed_out_test_fails_with_its_traceback_and_a_stuck_one_leaves_its_stacks(tmp_path):
    """pytest.ini's timeout method fails a test that outlives its timeout
    with its traceback and lets the run go on (the thread method ends the
    whole test process, and under xdist its stacks were lost); a test stuck
    where the signal cannot act is ended by tests/support/backstop.py, which
    leaves every thread's stack in the run's output."""
    import configparser

    ini = configparser.ConfigParser()
    ini.read(TESTS.parent / "pytest.ini")
    method = ini["pytest"]["timeout_method"]
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["backstop"]\n')
    (tmp_path / "test_timed_out.py").write_text(_TIMED_OUT_TESTS)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ntimeout_method = {method}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(TESTS / "support"), TESTS_BACKSTOP_S="2")

    def run(*tests):
        return subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--max-worker-restart",
                               "0", "-p", "no:cacheprovider", *tests], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=100)

    timed_out = run("test_timed_out.py::test_sleeps", "test_timed_out.py::test_after")
    out = timed_out.stdout + timed_out.stderr
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "Timeout (>1.0s) from pytest-timeout" in out and "time.sleep(30)" in out, out[-3000:]
    stuck = run("test_timed_out.py::test_stuck")
    out = stuck.stdout + stuck.stderr
    assert "crashed while running 'test_timed_out.py::test_stuck'" in out, out[-3000:]
    assert "in test_stuck" in out, f"no stack of the stuck test in the output: {out[-3000:]}"
