"""The reliability and security suite's table: every scenario a test runs
(through the ``scenario`` fixture of conftest.py) is recorded with what was
done, its pass condition, what was measured and whether it passed; at the end
of the session the table in ``docs/RELIABILITY.md`` (and its data,
``docs/reliability.json``) is rewritten. Scenarios this session did not run
keep their last recorded result and date.
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

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "reliability.json"
TABLE = ROOT / "docs" / "RELIABILITY.md"

_RECORDED: list["Scenario"] = []


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

    def figure(self, text: str) -> None:
        self.figures.append(text)


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


def _order(key: str) -> tuple:
    head, _, where = key.partition(" ")
    number = re.match(r"\d*", head[1:]).group()
    return (head[0] != "F", int(number) if number else 99, head, where)


def write() -> None:
    """Merge this session's rows into the table (nothing if none ran)."""
    if not _RECORDED:
        return
    rows = {}
    if DATA.exists():
        try:
            rows = {r["key"]: r for r in json.loads(DATA.read_text())}
        except (ValueError, KeyError, TypeError):
            rows = {}
    for s in _RECORDED:
        rows[s.key] = asdict(s)
    ordered = [rows[k] for k in sorted(rows, key=_order)]
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(json.dumps(ordered, indent=1) + "\n")
    lines = [
        "# Reliability and security: faults injected, and what happened",
        "",
        "Written by the test suite (`tests/reliability.py`, scenarios recorded by the tests",
        "through the `scenario` fixture), never by hand: each run that runs a scenario",
        "replaces its row; the others keep their last result and date. Where: `local` is",
        "local Spark on one machine, `hosts` the cluster of separate hosts in network",
        "namespaces (`tests/hosts.py`: master, two worker hosts and the driver, each with",
        "its own address and /tmp, sharing one folder); \", profile X\" marks a run on",
        "dependency profile X (README), the default profile otherwise. F and S numbers",
        "are those of the reliability issue (faults, security).",
        "",
        "Run them: `make test PYTEST_ARGS=\"-m reliability\"` (the default `make test`",
        "runs them too).",
        "",
        "| Scenario | Where | What is done | Pass condition | Measured | Result | Date | Test |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ordered:
        head, _, where = r["key"].partition(" ")
        cells = [f"{head} {r['title']}", where, r["done"], r["passes"],
                 "; ".join(r["figures"]) or "-", r["result"], r["date"],
                 f"`{r['test'].split('::')[-1]}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ")
                                        for c in cells) + " |")
    lines.append("")
    TABLE.write_text("\n".join(lines))
