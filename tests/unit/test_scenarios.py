"""The reliability records (tests/support/scenarios.py): in a test of several
scenarios, each scenario's row holds its own outcome."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parents[1]

# The project's scenario fixture and the hooks it relies on, in a test folder of its own.
_CONFTEST = f'''
import importlib.util
spec = importlib.util.spec_from_file_location("project_conftest", {str(TESTS / "conftest.py")!r})
project = importlib.util.module_from_spec(spec)
spec.loader.exec_module(project)
scenario = project.scenario
pytest_runtest_makereport = project.pytest_runtest_makereport
pytest_sessionfinish = project.pytest_sessionfinish
'''

_TESTS = '''
def test_two_scenarios(scenario):
    first = scenario("F91 local", "first", "does one thing", "passes one way")
    second = scenario("F92 local", "second", "does another", "passes another way")

    def holds(s):
        s.figure("held")

    def breaks(s):
        assert 1 == 2, "the second one broke"

    from scenarios import check_each

    check_each((first, holds), (second, breaks))


def test_one_scenario(scenario):
    scenario("F93 local", "plain", "does", "passes")
    assert False, "the plain one broke"
'''


def test_each_scenario_of_a_test_is_recorded_with_its_own_outcome(tmp_path):
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_rows.py").write_text(_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["DIST_DL_TEST_RECORDS"] = str(tmp_path / "records")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (records,) = (tmp_path / "records").glob("*.json")
    # Keys end in ", profile X" in an environment of a profile (.venv-X).
    rows = {row["key"].split(",")[0]: row for row in json.loads(records.read_text())}
    assert rows["F91 local"]["result"] == "pass" and rows["F91 local"]["figures"] == ["held"]
    assert rows["F92 local"]["result"].startswith("FAIL: the second one broke"), rows
    # A scenario not checked on its own takes the test's outcome.
    assert rows["F93 local"]["result"].startswith("FAIL: "), rows
    assert "checked" not in rows["F91 local"]
