"""MkDocs hook: pages render tables from the project's data files at build time.

A page asks for a table with a line of its own:

- ``<!-- table: benchmarks -->``: every figure in ``benchmarks/results.json``
  (written by the benchmarks themselves).
- ``<!-- table: reliability -->``: every scenario in ``docs/reliability.json``
  (the reliability suite's records).

Nothing is copied by hand, so the site shows what the data files hold. A
missing or malformed file fails the build, naming it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks" / "results.json"
RELIABILITY = ROOT / "docs" / "reliability.json"
_PLACEHOLDER = re.compile(r"^<!-- table: (\w+) -->$", re.MULTILINE)


def _cell(value) -> str:
    """One Markdown table cell: pipes escaped, line breaks folded."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _number(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _cell(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SystemExit(f"docs: cannot render a table from {path}: {e}") from e


def benchmarks_table() -> str:
    """Each figure of results.json: median, the rounds' range, goal, command, date."""
    figures = _load(BENCHMARKS)
    rows = ["| figure | median | rounds (min-max) | goal | met | command | measured |",
            "|---|---|---|---|---|---|---|"]
    for key in sorted(figures):
        f = figures[key]
        rounds = f.get("rounds") or []
        spread = f"{_number(min(rounds))}-{_number(max(rounds))}" if len(rounds) > 1 else ""
        goal = f.get("goal")
        met = "" if goal is None else ("yes" if f["value"] >= goal else "no")
        note = f" ({_cell(f['note'])})" if f.get("note") else ""
        rows.append(f"| `{key}`{note} | {_number(f['value'])} | {spread} | "
                    f"{'' if goal is None else _number(goal)} | {met} | `{_cell(f.get('command', ''))}` | "
                    f"{_cell(str(f.get('date', ''))[:10])} |")
    machines = sorted({f["machine"] for f in figures.values() if f.get("machine")})
    rows += ["", "Machines: " + "; ".join(_cell(m) for m in machines) + "."] if machines else []
    return "\n".join(rows)


def reliability_table() -> str:
    """Each scenario of reliability.json: what is done, the pass condition, what was measured."""
    scenarios = _load(RELIABILITY)
    rows = ["| scenario | where | what is done | pass condition | measured | result | last run | test |",
            "|---|---|---|---|---|---|---|---|"]
    for s in scenarios:
        number, _, where = s["key"].partition(" ")
        test = s.get("test", "").rpartition("::")[2]
        rows.append(f"| {_cell(number)} {_cell(s['title'])} | {_cell(where)} | {_cell(s['done'])} | "
                    f"{_cell(s['passes'])} | {_cell('; '.join(s.get('figures', [])))} | "
                    f"{_cell(s['result'])} | {_cell(str(s.get('date', ''))[:10])} | `{_cell(test)}` |")
    return "\n".join(rows)


TABLES = {"benchmarks": benchmarks_table, "reliability": reliability_table}


def on_page_markdown(markdown: str, page, config, files) -> str:
    def render(match: re.Match) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise SystemExit(f"docs: {page.file.src_path} asks for table {name!r}; "
                             f"known: {sorted(TABLES)}")
        return TABLES[name]()

    return _PLACEHOLDER.sub(render, markdown)
