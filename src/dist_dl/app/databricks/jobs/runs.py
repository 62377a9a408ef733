"""Runs: start a deployed job (run-now), follow its and its tasks' states to
the end, and say which task failed and why."""
from __future__ import annotations

import os
import time
from typing import Mapping

from dist_dl.app.databricks.jobs.errors import (JobFileError, JobsError, Problem, RunFailedError,
                                                RunResult)
from dist_dl.app.databricks.jobs.validation import load_job
from dist_dl.app.databricks.jobs.workspace import calling, connect, find_job, say

__all__ = ["run"]

_TERMINAL = frozenset({"TERMINATED", "SKIPPED", "INTERNAL_ERROR"})
# Results of tasks that did not run because of another one (state and status vocabularies).
_NOT_RUN = frozenset({"UPSTREAM_FAILED", "UPSTREAM_CANCELED", "EXCLUDED", "DISABLED", "SKIPPED"})


def _state(obj) -> tuple[str | None, str | None, str]:
    """(life cycle state, result state, message) of a run or a task run.

    ``state`` is the Jobs API field; it is deprecated in favour of ``status``,
    which is read when ``state`` is absent."""
    state = getattr(obj, "state", None)
    if state is not None and state.life_cycle_state is not None:
        return (state.life_cycle_state.value,
                state.result_state.value if state.result_state else None,
                state.state_message or "")
    status = getattr(obj, "status", None)
    if status is None or status.state is None:
        return None, None, ""
    details = status.termination_details
    result = details.code.value if details is not None and details.code is not None else None
    return status.state.value, result, (details.message or "") if details else ""


def _reads_status(run) -> bool:
    """Whether this databricks-sdk's Run has the ``status`` field (0.20, the
    one of Databricks Runtime 15.4, has only ``state``: the SDK drops fields
    it does not know when it parses a response)."""
    import dataclasses

    return dataclasses.is_dataclass(run) and "status" in {f.name for f in dataclasses.fields(run)}


def _follow(w, run_id: int, poll_seconds: float, timeout: float | None, out, url: str):
    start = time.monotonic()
    last_run, last_tasks = None, {}
    while True:
        with calling(w, f"read run {run_id}"):
            current = w.jobs.get_run(run_id)
        url = current.run_page_url or url
        elapsed = time.monotonic() - start
        life, result, message = _state(current)
        if life is None and not _reads_status(current):
            # Without this the loop would poll for ever (timeout None).
            from databricks.sdk.version import __version__

            raise JobsError(
                f"run {run_id}: the Jobs API answered without the deprecated 'state' field, and "
                f"databricks-sdk {__version__} cannot read its replacement 'status' (its Run has "
                f"no such field), so the run cannot be followed; it keeps running: {url}. "
                "Upgrade databricks-sdk, or follow the run with --no-wait and the run page.")
        if (life, result) != last_run:
            last_run = (life, result)
            text = " ".join(s for s in (life, result) if s)
            detail = f": {message}" if message else ""
            say(out, f"[{elapsed:7.1f}s] run {run_id}: {text}{detail}")
        for task in current.tasks or []:
            task_life, task_result, _ = _state(task)
            if last_tasks.get(task.task_key) != (task_life, task_result):
                last_tasks[task.task_key] = (task_life, task_result)
                text = " ".join(s for s in (task_life, task_result) if s)
                say(out, f"[{elapsed:7.1f}s]   task {task.task_key}: {text}")
        if life in _TERMINAL:
            return current, url
        if timeout is not None and elapsed > timeout:
            raise JobsError(f"run {run_id} is still {life} after {timeout:.0f} s; it keeps "
                            f"running: {url}")
        time.sleep(poll_seconds)


def _failure(w, current, job_name: str, url: str) -> RunFailedError:
    life, result, message = _state(current)
    failed, skipped, details = [], [], []
    for task in current.tasks or []:
        task_life, task_result, task_message = _state(task)
        if task_life == "INTERNAL_ERROR" or (task_result not in (None, "SUCCESS")
                                             and task_result not in _NOT_RUN):
            failed.append(task.task_key)
            text = f"task {task.task_key!r} {task_result or task_life}"
            if task_message:
                text += f": {task_message}"
            try:  # the task's own error (the Python exception), when Databricks kept it
                error = w.jobs.get_run_output(task.run_id).error if task.run_id else None
            except Exception:  # best effort: the state message above still names the failure
                error = None
            if error and error not in text:
                text += f" ({error.strip().splitlines()[-1]})"
            details.append(text)
        elif task_result and task_result != "SUCCESS":
            skipped.append(f"{task.task_key} {task_result}")
    summary = "; ".join(details) or f"no task failed; the run: {message or life}"
    if skipped:
        summary += f"; not run: {', '.join(skipped)}"
    return RunFailedError(f"run {current.run_id} of job {job_name!r} ended {result or life}: "
                          f"{summary}. Run page: {url}", current.run_id, url, failed)


def run(path: str | os.PathLike | None = None, *, job_id: int | None = None,
        params: Mapping[str, str] | None = None, wait: bool = True, profile: str | None = None,
        client=None, poll_seconds: float = 10.0, timeout: float | None = None,
        out=None) -> RunResult:
    """Start a run of a deployed job (run-now) and follow it to the end.

    Every change of the run's state, and of its tasks' states, is printed
    with the time since the start.

    Args:
        path: The job file; the job with its name in the workspace is run
            (deploy it first). Give ``path`` or ``job_id``.
        job_id: The job to run.
        params: Job parameter values for this run (``{"epochs": "1"}``),
            checked against the job's declared parameters (and, with
            ``path``, validated like the file's defaults).
        wait: False: return right after starting.
        profile: A ``~/.databrickscfg`` profile (see ``deploy``).
        client: A ``databricks.sdk.WorkspaceClient`` to use instead.
        poll_seconds: Seconds between state checks.
        timeout: Stop following after this many seconds (the run goes on).
        out: Stream for progress lines; default stdout.

    Returns:
        The final state (with ``wait=False``, the state at the start).

    Raises:
        RunFailedError: The run ended without success; the message names the
            failed task and the run's page.
        JobFileError: ``params`` do not fit the job.
        AuthenticationError: No credentials, or the workspace rejected them.
        JobsError: The job is not deployed, or the Jobs API failed.
    """
    if (path is None) == (job_id is None):
        raise ValueError("give the job file or job_id, one of them")
    params = {str(k): str(v) for k, v in (params or {}).items()}
    name = None
    if path is not None:
        name = load_job(path, parameter_values=params).name
    w = client if client is not None else connect(profile)
    if job_id is None:
        job_id = find_job(w, name)
        if job_id is None:
            raise JobsError(f"no job named {name!r} in {w.config.host}: deploy it first with "
                            f"`dist-dl jobs deploy {path} --wheel WHEEL`")
    with calling(w, f"read job {job_id}"):
        settings = w.jobs.get(job_id).settings
    name = settings.name if settings and settings.name else str(job_id)
    declared = [p.name for p in (settings.parameters or [])] if settings else []
    unknown = sorted(set(params) - set(declared))
    if unknown:
        source = str(path or f"job {job_id}")
        raise JobFileError([Problem(source, None, "parameters", f"no job parameter {u!r}; "
                                    f"declared: {', '.join(declared) or 'none'}") for u in unknown],
                           f"cannot run job {name!r} with these --param values:")
    with calling(w, f"start job {job_id} {name!r}"):
        run_id = w.jobs.run_now(job_id, job_parameters=params or None).response.run_id
    url = f"{w.config.host}/jobs/{job_id}/runs/{run_id}"
    say(out, f"started run {run_id} of job {job_id} {name!r}: {url}")
    if not wait:
        with calling(w, f"read run {run_id}"):
            current = w.jobs.get_run(run_id)
        life, result, message = _state(current)
        return RunResult(run_id, job_id, current.run_page_url or url, life, result, message)
    try:
        current, url = _follow(w, run_id, poll_seconds, timeout, out, url)
    except KeyboardInterrupt:
        say(out, f"stopped following run {run_id}; it goes on: {url}")
        raise
    life, result, message = _state(current)
    if result != "SUCCESS":
        raise _failure(w, current, name, url)
    return RunResult(run_id, job_id, url, life, result, message)
