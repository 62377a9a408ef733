"""Databricks jobs: check the job definitions in ``jobs/``, deploy them with
this project's wheel, start a run and follow it to the end.

Driver side: this runs where you develop (a laptop, CI) and talks to a
workspace through databricks-sdk. The job files are Jobs API 2.1 JSON (what
``POST /api/2.1/jobs/create`` takes; the SDK sends the same body to 2.2)::

    dist-dl jobs validate                              # every jobs/*.json
    make wheel                                         # dist/dist_dl-<version>-py3-none-any.whl
    dist-dl jobs deploy jobs/training_workflow_azure.json --wheel dist/dist_dl-*.whl
    dist-dl jobs run jobs/training_workflow_azure.json --param epochs=1

Authentication is databricks-sdk's own: ``DATABRICKS_HOST`` and
``DATABRICKS_TOKEN``, or a profile of ``~/.databrickscfg`` (``--profile``).

The wheel: a job file's libraries name `WHEEL_PLACEHOLDER`;
`deploy()` uploads a built wheel as a workspace file and puts its
``/Workspace/...`` path there. Values a user must set are written
``<EDIT:what>``; `validate()` accepts them (the files are templates) and
`deploy()` refuses to send them.

One module per concern: ``errors`` (errors and results), ``walk`` (where a
value is in a job dict), ``validation``, ``workspace`` (the client and
deploy), ``runs`` and ``command`` (``dist-dl jobs``), and ``bundle``
(databricks.yml, the Databricks Asset Bundle, generated from the job files:
``make bundle``; not imported here, so that ``python -m`` runs it).
"""
from dist_dl.app.databricks.jobs.command import add_jobs_command, main
from dist_dl.app.databricks.jobs.errors import (AuthenticationError, JobFileError, JobsError, Problem,
                                                RunFailedError, RunResult)
from dist_dl.app.databricks.jobs.runs import run
from dist_dl.app.databricks.jobs.validation import WHEEL_PLACEHOLDER, load_job, validate
from dist_dl.app.databricks.jobs.workspace import deploy

__all__ = ["WHEEL_PLACEHOLDER", "Problem", "JobsError", "JobFileError", "AuthenticationError",
           "RunFailedError", "RunResult", "validate", "load_job", "deploy", "run",
           "add_jobs_command", "main"]
