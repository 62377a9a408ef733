"""The workspace side: a databricks-sdk client whose errors say what to set,
and `deploy()`, which uploads a built wheel and creates or updates a job.

Building the wheel is not done here: it is a development task of a source
checkout (``make wheel``, or ``python -m build --wheel``); ``deploy`` takes
the wheel's path.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import zipfile
from pathlib import Path

from dist_dl.app.databricks.jobs.errors import AuthenticationError, JobFileError, JobsError
from dist_dl.app.databricks.jobs.validation import (ENTRY_POINT, WHEEL_NAME, WHEEL_PLACEHOLDER,
                                                    edit_markers, load_job, read_job)
from dist_dl.core import compat

__all__ = ["deploy", "connect", "calling", "find_job", "say"]

_AUTH_HELP = ("set DATABRICKS_HOST (your workspace URL, e.g. "
              "https://adb-<id>.<n>.azuredatabricks.net or "
              "https://<name>.cloud.databricks.com) and DATABRICKS_TOKEN (a personal access "
              "token: User settings > Developer > Access tokens), or pass --profile NAME for a "
              "profile in ~/.databrickscfg (`databricks auth login` writes one)")
# How to get the wheel deploy takes, for its messages.
_BUILD_HELP = "build it in a checkout of dist_dl with `make wheel` (or `python -m build --wheel`)"


def connect(profile: str | None = None):
    """A ``databricks.sdk.WorkspaceClient``; no credentials is an
    `AuthenticationError` that says what to set."""
    from databricks.sdk import WorkspaceClient

    try:
        return WorkspaceClient(profile=profile)
    except ValueError as exc:
        raise AuthenticationError(f"no usable Databricks credentials: {_AUTH_HELP}. "
                                  f"(databricks-sdk: {exc})") from None


@contextlib.contextmanager
def calling(w, action: str):
    """Turn the SDK's errors into one clear message naming what was being done."""
    from databricks.sdk.errors import DatabricksError, PermissionDenied, Unauthenticated

    host = w.config.host
    try:
        yield
    except Unauthenticated as exc:
        raise AuthenticationError(
            f"{host} rejected the credentials (HTTP 401: {exc}) while trying to {action}: the "
            f"token is wrong or expired; {_AUTH_HELP}") from None
    except PermissionDenied as exc:
        raise AuthenticationError(
            f"{host} refused to let these credentials ({w.config.auth_type}) {action} (HTTP 403: "
            f"{exc}): use a token of a user or service principal allowed to {action} (set "
            f"DATABRICKS_TOKEN or --profile), or ask a workspace admin for the permission"
        ) from None
    except DatabricksError as exc:
        raise JobsError(f"{host} could not {action}: {exc}") from None


def _check_wheel(path: Path) -> None:
    """``path`` is a wheel of this project that declares the console script the
    tasks run."""
    problem = None
    if not path.is_file() or not WHEEL_NAME.search(path.name):
        problem = "is not a file named dist_dl-<version>-...whl"
    elif not zipfile.is_zipfile(path):
        problem = "is not a wheel (a zip archive)"
    else:
        with zipfile.ZipFile(path) as archive:
            points = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
            text = archive.read(points[0]).decode() if points else ""
        if not re.search(rf"^\s*{re.escape(ENTRY_POINT)}\s*=", text, re.MULTILINE):
            problem = f"declares no {ENTRY_POINT!r} console script, which the job tasks run"
    if problem:
        raise JobsError(f"{str(path)!r} {problem}: {_BUILD_HELP} and pass its path")


def find_job(w, name: str) -> int | None:
    """The id of the job named exactly ``name``, or None; two such jobs are an error."""
    with calling(w, f"list the jobs named {name!r}"):
        # the API's name filter ignores case; deploy matches the exact name
        found = [j.job_id for j in w.jobs.list(name=name) if j.settings and j.settings.name == name]
    if len(found) > 1:
        raise JobsError(f"{len(found)} jobs are named {name!r} in {w.config.host} (ids "
                        f"{', '.join(map(str, found))}): delete the extra ones, or rename the job "
                        f"in its file, so that deploy knows which to update")
    return found[0] if found else None


def say(out, text: str) -> None:
    """One progress line, on ``out`` or stdout, at once."""
    print(text, file=out if out is not None else sys.stdout, flush=True)


def deploy(path: str | os.PathLike, wheel: str | os.PathLike, *,
           profile: str | None = None, client=None, workspace_dir: str | None = None,
           out=None) -> int:
    """Upload the wheel, then create the job of ``path`` or reset the one with its name.

    The wheel goes to the workspace as a workspace file,
    ``<workspace_dir>/<sha256 prefix>/<wheel name>``: a new path for new
    content, so a run already started keeps the wheel it installed. Its
    ``/Workspace/...`` path replaces `WHEEL_PLACEHOLDER` in the job.

    Args:
        path: The job file (no ``<EDIT:...>`` values left).
        wheel: The built wheel (``make wheel`` in a checkout writes it to ``dist/``).
        profile: A ``~/.databrickscfg`` profile; default: databricks-sdk's
            own resolution (``DATABRICKS_HOST``/``DATABRICKS_TOKEN``, then
            the DEFAULT profile).
        client: A ``databricks.sdk.WorkspaceClient`` to use instead.
        workspace_dir: Workspace folder for wheels; default
            ``/Users/<you>/dist_dl/wheels``.
        out: Stream for progress lines; default stdout.

    Returns:
        The job id.

    Raises:
        JobFileError: The file has problems or unedited ``<EDIT:...>`` values.
        AuthenticationError: No credentials, or the workspace rejected them.
        JobsError: ``wheel`` is not this project's wheel, or uploading it or the
            Jobs API failed.
    """
    from databricks.sdk.service.jobs import JobSettings
    from databricks.sdk.service.workspace import ImportFormat

    path = Path(path)
    load_job(path)
    job = read_job(path)
    markers = edit_markers(job, str(path))
    if markers:
        raise JobFileError(markers, f"{path} still has values to edit before it can be deployed:")
    if wheel is None:
        raise JobsError(f"no wheel to deploy: {_BUILD_HELP} and pass its path")
    built = Path(wheel)
    _check_wheel(built)
    content = built.read_bytes()
    w = client if client is not None else connect(profile)
    if workspace_dir is None:
        with calling(w, "read the current user"):
            workspace_dir = f"/Users/{w.current_user.me().user_name}/dist_dl/wheels"
    # The Workspace API names files without the /Workspace prefix that
    # clusters use to read them.
    folder = "/" + workspace_dir.strip("/").removeprefix("Workspace/")
    folder = f"{folder}/{hashlib.sha256(content).hexdigest()[:12]}"
    target = f"{folder}/{built.name}"
    with calling(w, f"upload the wheel to {target}"):
        w.workspace.mkdirs(folder)
        w.workspace.upload(target, content, format=ImportFormat.AUTO, overwrite=True)
    say(out, f"uploaded {built.name} to /Workspace{target}")

    for task in job.get("tasks", []):
        for library in task.get("libraries") or []:
            if library.get("whl") == WHEEL_PLACEHOLDER:
                library["whl"] = f"/Workspace{target}"
    settings = JobSettings.from_dict(job)
    job_id = find_job(w, settings.name)
    if job_id is None:
        with calling(w, f"create the job {settings.name!r}"):
            job_id = w.jobs.create(**compat.shallow_fields(settings)).job_id
        say(out, f"created job {job_id} {settings.name!r}: {w.config.host}/jobs/{job_id}")
    else:
        with calling(w, f"update job {job_id} {settings.name!r}"):
            w.jobs.reset(job_id, settings)
        say(out, f"updated job {job_id} {settings.name!r}: {w.config.host}/jobs/{job_id}")
    return job_id
