"""The cases of tests/integration/test_notebooks.py that need no Spark, no training
and no worker process."""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
CELL_BREAK = "# COMMAND ----------"
# A job reference in a "Run by:" paragraph: `jobs/<file>.json` task `a`, or
# `jobs/<file>.json` tasks `a` and `b`.
JOB_REFERENCE = re.compile(r"`jobs/([\w.-]+\.json)` tasks? ((?:`[\w-]+`(?:,? and |, )?)+)")


def _cells(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each cell."""
    cells, start, lines = [], 1, []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip() == CELL_BREAK:
            cells.append((start, "\n".join(lines)))
            start, lines = number + 1, []
        else:
            lines.append(line)
    cells.append((start, "\n".join(lines)))
    return cells


def _is_code(text: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines())


def _run_by(path: Path) -> str:
    """The header's "Run by:" paragraph, without the MAGIC prefixes."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# MAGIC Run by:"))
    paragraph = []
    for line in lines[start:]:
        text = line[len("# MAGIC"):].strip() if line.startswith("# MAGIC") else ""
        if not text:
            break
        paragraph.append(text)
    return " ".join(paragraph)


def _job_tasks() -> dict[str, set[str]]:
    return {p.name: {t["task_key"] for t in json.loads(p.read_text()).get("tasks", [])}
            for p in (ROOT / "jobs").glob("*.json")}


@pytest.mark.timeout(30)
def test_there_are_notebooks_and_each_has_the_header():
    assert NOTEBOOKS, "notebooks/ holds no notebook"
    for path in NOTEBOOKS:
        lines = path.read_text().splitlines()
        assert lines[0] == "# Databricks notebook source", path
        assert CELL_BREAK in lines, path
        assert any(line.startswith("# MAGIC Run by:") for line in lines[:15]), \
            f"{path.name}: the header must name the job that runs it and its parameters"
    # A number prefix gives the reading order; two notebooks with one number have none.
    numbers = [re.match(r"(\d+)_\w+\.py$", p.name) for p in NOTEBOOKS]
    assert all(numbers), f"name notebooks NN_what.py: {[p.name for p in NOTEBOOKS]}"
    assert len({m.group(1) for m in numbers}) == len(NOTEBOOKS), "two notebooks share a number"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_run_by_names_jobs_and_tasks_that_exist(path):
    paragraph = _run_by(path)
    references = JOB_REFERENCE.findall(paragraph)
    assert paragraph.count("`jobs/") == len(references), \
        f"{path.name}: write job references as `jobs/<file>.json` task `<task_key>`: {paragraph}"
    assert references or "no job (interactive)" in paragraph, \
        f"{path.name}: name the job and task that run it, or say 'no job (interactive)'"
    jobs = _job_tasks()
    for job, tasks in references:
        assert job in jobs, f"{path.name} names jobs/{job}, which does not exist"
        for task in re.findall(r"`([\w-]+)`", tasks):
            assert task in jobs[job], f"{path.name}: jobs/{job} has no task {task!r}: {jobs[job]}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_widgets_are_read_once_in_the_first_code_cell_and_listed_in_the_header(path):
    tree = ast.parse(path.read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", getattr(node.func, "attr", None)) == "read_widgets"]
    assert len(calls) == 1, f"{path.name}: read the widgets with one read_widgets call"
    assert not any(isinstance(node, ast.Attribute) and node.attr == "widgets"
                   for node in ast.walk(tree)), \
        f"{path.name}: widgets are read only through read_widgets, once"
    (call,) = calls
    cells = _cells(path)
    code = [(start, text) for start, text in cells if _is_code(text)]
    first_start, first_text = code[0]
    assert first_start <= call.lineno < first_start + len(first_text.splitlines()), \
        f"{path.name}: read_widgets must be in the first code cell"
    keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert keywords.get("dbutils") == "globals().get('dbutils')", \
        f"{path.name}: pass dbutils=globals().get(\"dbutils\") (None outside Databricks)"
    defaults = call.args[0] if call.args else None
    assert isinstance(defaults, ast.Dict) and all(
        isinstance(k, ast.Constant) and isinstance(k.value, str) for k in defaults.keys), \
        f"{path.name}: give read_widgets its defaults as a literal dict"
    header = cells[0][1]
    missing = [k.value for k in defaults.keys if f"`{k.value}`" not in header]
    assert not missing, f"{path.name}: the header does not list the widgets {missing}"
