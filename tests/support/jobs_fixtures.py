"""Fixtures of the jobs tests (tests/unit/test_jobs.py and
tests/integration/test_jobs.py): a stand-in Databricks workspace, a job file
with its <EDIT:...> values filled in, a stand-in wheel. Import them into a
test module by name."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from databricks_standin import DatabricksStandIn

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.fixture
def workspace(monkeypatch):
    with DatabricksStandIn() as standin:
        monkeypatch.setenv("DATABRICKS_HOST", standin.host)
        monkeypatch.setenv("DATABRICKS_TOKEN", standin.token)
        yield standin


@pytest.fixture
def job_file(tmp_path) -> Path:
    """The Azure training workflow with its <EDIT:...> values filled in."""
    text = (JOBS / "training_workflow_azure.json").read_text()
    path = tmp_path / "training.json"
    path.write_text(text.replace("<EDIT:storage-account>", "dldatalake"))
    return path


@pytest.fixture
def wheel(tmp_path) -> Path:
    """A small stand-in wheel: a zip declaring the console script."""
    path = tmp_path / "dist_dl-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("dist_dl-0.1.0.dist-info/entry_points.txt",
                         "[console_scripts]\ndist-dl = dist_dl.cli:main\n")
    return path
