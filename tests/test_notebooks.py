"""Notebooks: Databricks source format, and each runs end to end locally
(widgets fall back to their defaults without dbutils)."""
import runpy
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.py"))


def test_there_are_notebooks_and_each_has_the_header():
    assert NOTEBOOKS, "notebooks/ holds no notebook"
    for path in NOTEBOOKS:
        lines = path.read_text().splitlines()
        assert lines[0] == "# Databricks notebook source", path
        assert "# COMMAND ----------" in lines, path
        assert any(line.startswith("# MAGIC Run by:") for line in lines[:15]), \
            f"{path.name}: the header must name the job that runs it and its parameters"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_locally(path, spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the notebooks write under ./runs
    namespace = runpy.run_path(str(path), run_name="__main__")
    assert namespace.get("result") is not None, f"{path.name} must leave its outcome in `result`"
