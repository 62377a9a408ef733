"""The reliability and security suite's records.

Every scenario a test runs (through the ``scenario`` fixture of conftest.py)
is recorded with what was done, its pass condition, what was measured and
whether it passed. A test session writes its records to an untracked folder,
``runs/tests/reliability/`` (``DIST_DL_TEST_RECORDS`` overrides it), one JSON
file per session, and changes no tracked file.

``make reliability-report`` (``python tests/support/scenarios.py report``)
turns the newest record of each scenario into the tracked table on purpose:
``docs/reliability.json`` (the data the documentation site renders) and the
figures that are rates into ``benchmarks/results.json``.
"""
from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "reliability.json"
RESULTS = ROOT / "benchmarks" / "results.json"

_RECORDED: list["Scenario"] = []


def records_folder() -> Path:
    """Where test sessions write their records (untracked)."""
    return Path(os.environ.get("DIST_DL_TEST_RECORDS") or ROOT / "runs" / "tests" / "reliability")


@dataclass
class Scenario:
    """One row of the table. A test fills in ``figures`` as it measures."""

    key: str            # e.g. "F3 hosts": the fault's number in the issue and where it ran
    title: str
    done: str           # what the test does
    passes: str         # its pass condition
    test: str = ""      # the test's node id
    figures: list[str] = field(default_factory=list)
    result: str = ""    # "pass" or "FAIL: ..."
    date: str = ""
    machine: str = ""
    # Benchmark entries (dist_dl.app.bench.result_entry) for benchmarks/results.json,
    # merged there by the report, never by the test run.
    rates: dict = field(default_factory=dict)
    # Its own outcome where a test holds several scenarios (check): None
    # until checked, then "" (passed) or the failed assertion. Not a field:
    # the row's result is ``result``, set when the scenario is recorded.
    checked = None

    def figure(self, text: str) -> None:
        self.figures.append(text)

    def check(self, fn, *args) -> str | None:
        """Run ``fn(*args)``, this scenario's pass condition, in a test of
        several: its AssertionError becomes this row's failure (returned,
        for the test to fail with) instead of every row's."""
        try:
            fn(*args)
        except AssertionError as exc:
            self.checked = " ".join(str(exc).split()) or "assertion failed"
            return self.checked
        self.checked = ""
        return None

    def rate(self, key: str, entry: dict) -> None:
        """A figure that is a rate: ``entry`` goes to benchmarks/results.json
        under ``key`` when the report is made."""
        self.rates[key] = entry


def check_each(*checks) -> None:
    """The scenarios of one test, each ``(scenario, pass_condition, *args)``:
    every condition is called with its scenario and args, its outcome kept on
    that scenario's row (:meth:`Scenario.check`); fails naming every scenario
    that failed on the first line, which ``make test-repeat`` prints."""
    failed = [(s.key, error) for s, condition, *args in checks
              if (error := s.check(condition, s, *args)) is not None]
    assert not failed, ("scenarios failed: " + ", ".join(key for key, _ in failed) + "\n"
                        + "\n".join(f"{key}: {error}" for key, error in failed))


def profile() -> str:
    """The dependency profile this Python belongs to ('' for the default):
    each virtual environment is ``.venv`` or ``.venv-<profile>``."""
    name = os.path.basename(sys.prefix)
    return name[len(".venv-"):] if name.startswith(".venv-") else ""


def record(scenario: Scenario, passed: bool, error: str = "") -> None:
    if profile():
        # Each profile keeps rows of its own.
        scenario.key += f", profile {profile()}"
    scenario.result = "pass" if passed else "FAIL: " + " ".join(error.split())[:300]
    scenario.date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    scenario.machine = f"{os.cpu_count()} cores, {platform.machine()}"
    _RECORDED.append(scenario)


def write() -> Path | None:
    """This session's records into a file of their own in the records folder
    (nothing if no scenario ran); its path."""
    if not _RECORDED:
        return None
    folder = records_folder()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = folder / f"{stamp}-{profile() or 'default'}-{os.getpid()}.json"
    path.write_text(json.dumps([asdict(s) for s in _RECORDED], indent=1) + "\n")
    return path


def _order(key: str) -> tuple:
    head, _, where = key.partition(" ")
    number = re.match(r"\d*", head[1:]).group()
    return (head[0] != "F", int(number) if number else 99, head, where)


def latest_records(folder: Path) -> dict[str, dict]:
    """Scenario key -> its newest record over every session's file in ``folder``."""
    rows: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):   # names start with the UTC time
        try:
            records = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}): remove it") from None
        for r in records:
            if r["key"] not in rows or r["date"] >= rows[r["key"]]["date"]:
                rows[r["key"]] = r
    return rows


def report(folder: Path | None = None, data: Path = DATA, results: Path = RESULTS) -> list[str]:
    """Merge the newest records into ``data`` (rows of scenarios no session
    recorded keep theirs) and their rates into ``results``; the keys updated."""
    folder = folder or records_folder()
    new = latest_records(folder)
    if not new:
        raise SystemExit(f"no reliability records under {folder}: run the suite first "
                         "(make test, or make test-reliability)")
    rows = {r["key"]: r for r in json.loads(data.read_text())} if data.exists() else {}
    rows.update(new)
    ordered = [rows[k] for k in sorted(rows, key=_order)]
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(ordered, indent=1) + "\n")
    rates = {k: v for r in new.values() for k, v in r.get("rates", {}).items()}
    if rates:
        sys.path.insert(0, str(ROOT / "src"))
        from dist_dl.app.bench import merge_results

        merge_results(str(results), rates)
    return sorted(new, key=_order)


if __name__ == "__main__":
    if sys.argv[1:] != ["report"]:
        raise SystemExit("usage: python tests/support/scenarios.py report")
    updated = report()
    print(f"{DATA.relative_to(ROOT)}: {len(updated)} scenario rows from {records_folder()}: "
          + ", ".join(updated))
