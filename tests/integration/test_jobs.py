"""Databricks job definitions (jobs/*.json) and dist_dl.app.databricks.jobs: the
files validate and survive databricks-sdk unchanged, validation catches each
kind of mistake, and deploy / run work against a local stand-in of the REST
endpoints they call (tests/databricks_standin.py), through the real
databricks-sdk configured the standard way (DATABRICKS_HOST / DATABRICKS_TOKEN)."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from jobs_fixtures import job_file, wheel, workspace  # noqa: F401 (fixtures)
from dist_dl.app.databricks.jobs import main

pytestmark = [pytest.mark.timeout(60), pytest.mark.profile_subset_164]

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"


def _make_wheel(tmp_path) -> Path:
    """`make wheel` in a copy of the checkout (a build writes build/ and
    *.egg-info into the folder it builds), with this interpreter as .venv's."""
    checkout = tmp_path / "checkout"
    # Not the build's: version control, outputs, and every profile's virtual
    # environment (.venv, .venv-unit, .venv-dbr-*: gigabytes with TensorFlow
    # and torch, present in CI once the profiles' stages have run).
    clutter = {".git", "build", "dist", "runs", "mlruns", "site", "spark-warehouse",
               "metastore_db", ".pytest_cache", ".benchmarks"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = ({n for n in names if n in clutter or n.startswith(".venv")}
               if Path(folder) == ROOT else set())
        return {n for n in names if n in top or n == "__pycache__" or n.endswith(".egg-info")}

    shutil.copytree(ROOT, checkout, ignore=ignore)
    stamp = checkout / ".venv" / ".installed-dbr-15.4-ml"  # up to date: make installs nothing
    stamp.parent.mkdir()
    stamp.touch()
    # The default profile's names (.venv and its stamp above), whatever profile
    # the calling make was given: a profile's variables arrive through
    # MAKEFLAGS, and its environment's stamp is not in the copy, so make would
    # install the copy into this interpreter's environment.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-C", str(checkout), "wheel", f"PY={sys.executable}",
                           "PROFILE="], capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (checkout / "dist").glob("dist_dl-*.whl")
    return wheel


@pytest.mark.timeout(240)
def test_deploy_command_uploads_the_wheel_that_make_builds(workspace, job_file, tmp_path, capsys):
    built = built_path = _make_wheel(tmp_path)
    assert main(["jobs", "deploy", str(job_file), "--wheel", str(built)]) == 0
    (path, content), = workspace.files.items()
    assert re.search(r"/dist_dl-0\.1\.0-py3-none-any\.whl$", path)
    with zipfile.ZipFile(io.BytesIO(content)) as built:
        names = set(built.namelist())
        entry_points = built.read("dist_dl-0.1.0.dist-info/entry_points.txt").decode()
    # what the job tasks run: the console script, and the configuration they name
    assert "dist-dl = dist_dl.cli:main" in entry_points
    assert {"dist_dl/conf/imagenet_resnet50.yaml", "dist_dl/cli.py"} <= names
    library = workspace.jobs[next(iter(workspace.jobs))]["tasks"][0]["libraries"][0]["whl"]
    assert library == "/Workspace" + path
    assert "created job" in capsys.readouterr().out
    # The wheel holds the product, not the repository's tools (tools/bundle.py),
    # and `dist-dl jobs validate` and `deploy` work from it alone, in a project
    # folder holding only jobs/ and notebooks/ (nothing read from a checkout).
    assert not [n for n in names if n.startswith("tools/") or n.endswith("/bundle.py")]
    project, installed = tmp_path / "project", tmp_path / "installed"
    for folder in ("jobs", "notebooks"):
        shutil.copytree(ROOT / folder, project / folder)
    with zipfile.ZipFile(built_path) as wheel_file:  # a pure-Python wheel installs as it unpacks
        wheel_file.extractall(installed)
    done = subprocess.run(
        [sys.executable, "-c", "import sys, dist_dl; from dist_dl.app.databricks.jobs import main; "
         "assert dist_dl.__file__.startswith(sys.argv[1]), dist_dl.__file__; "
         "assert main(['jobs', 'validate']) == 0; "
         "sys.exit(main(['jobs', 'deploy', sys.argv[2], '--wheel', sys.argv[3]]))",
         str(installed), str(job_file), str(built_path)],
        cwd=project, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(installed)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"{p.name}: ok" in done.stdout for p in JOBS.glob("*.json")), done.stdout
    assert "updated job" in done.stdout, done.stdout
