"""MkDocs hook: pages render tables from the project's data files at build time.

A page asks for a table with a line of its own:

- ``<!-- table: benchmarks -->``: every figure in ``benchmarks/results.json``
  (written by the benchmarks themselves).
- ``<!-- table: reliability -->``: every scenario in ``docs/reliability.json``
  (the reliability suite's records).

The plot the benchmarks draw beside their results, ``benchmarks/results.png``,
is added to the site as ``img/benchmark-results.png`` (the benchmarks page
shows it).

Nothing is copied by hand, so the site shows what the data files hold. A
missing or malformed file fails the build, naming it. A command's absolute
paths (where the machine that ran it kept its files) show as their last
component.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks" / "results.json"
PLOT = ROOT / "benchmarks" / "results.png"
PLOT_URI = "img/benchmark-results.png"
RELIABILITY = ROOT / "docs" / "reliability.json"
_PLACEHOLDER = re.compile(r"^<!-- table: (\w+) -->$", re.MULTILINE)


def _cell(value) -> str:
    """One Markdown table cell: pipes escaped, line breaks folded."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _command(text: str) -> str:
    """A recorded command line without the paths of the machine that ran it."""
    return " ".join(word.rstrip("/").rsplit("/", 1)[-1] if word.startswith("/") else word
                    for word in str(text).split())


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
                    f"{'' if goal is None else _number(goal)} | {met} | `{_cell(_command(f.get('command', '')))}` | "
                    f"{_cell(str(f.get('date', ''))[:10])} |")
    machines = sorted({f["machine"] for f in figures.values() if f.get("machine")})
    rows += ["", "Machines: " + "; ".join(_cell(m) for m in machines) + "."] if machines else []
    return "\n".join(rows)


def reliability_table() -> str:
    """The scenarios of reliability.json: a summary table (scenario, where,
    result, last run), then each scenario's details (what is done, the pass
    condition, what was measured, the test) as a list: long texts read as
    paragraphs instead of crushing the columns of one wide table."""
    scenarios = _load(RELIABILITY)
    rows = ["| scenario | where | result | last run |", "|---|---|---|---|"]
    details = ["", "The scenarios in detail:", ""]
    for s in scenarios:
        number, _, where = s["key"].partition(" ")
        test = s.get("test", "").rpartition("::")[2]
        title = f"{_cell(number)} {_cell(s['title'])}"
        rows.append(f"| {title} | {_cell(where)} | {_cell(s['result'])} | "
                    f"{_cell(str(s.get('date', ''))[:10])} |")
        details += [f"**{title}** ({_cell(where)}: {_cell(s['result'])})", "",
                    f"- done: {_cell(s['done'])}",
                    f"- passes if: {_cell(s['passes'])}",
                    f"- measured: {_cell('; '.join(s.get('figures', [])))}",
                    f"- test: `{_cell(test)}`", ""]
    return "\n".join(rows + details)


TABLES = {"benchmarks": benchmarks_table, "reliability": reliability_table}


def on_files(files, config):
    from mkdocs.structure.files import File

    if not PLOT.is_file():
        raise SystemExit(f"docs: {PLOT} is missing: the benchmarks draw it (publish_results)")
    files.append(File.generated(config, PLOT_URI, abs_src_path=str(PLOT)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def render(match: re.Match) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise SystemExit(f"docs: {page.file.src_path} asks for table {name!r}; "
                             f"known: {sorted(TABLES)}")
        return TABLES[name]()

    return _PLACEHOLDER.sub(render, markdown)
