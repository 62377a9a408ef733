"""What the jobs commands report: a problem with a job file, the errors they
raise, and where a run is."""
from __future__ import annotations

import dataclasses

__all__ = ["Problem", "JobsError", "JobFileError", "AuthenticationError", "RunFailedError",
           "RunResult"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a job file.

    Attributes:
        file: The job file (or the name given for a job dict).
        task: The task's key, or None for a job-level field.
        field: Where in the job (or the task), e.g. ``python_wheel_task.parameters``.
        message: What is wrong and how to fix it.
    """

    file: str
    task: str | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"task {self.task!r}: " if self.task is not None else ""
        return f"{self.file}: {where}{self.field}: {self.message}"


class JobsError(RuntimeError):
    """A job could not be deployed or run; the message says why and what to do."""


class JobFileError(JobsError):
    """A job file has problems (`problems`, one per line in the message)."""

    def __init__(self, problems: list[Problem], headline: str):
        self.problems = list(problems)
        super().__init__("\n  ".join([headline, *map(str, self.problems)]))


class AuthenticationError(JobsError):
    """No credentials, or the workspace rejected them (HTTP 401/403)."""


class RunFailedError(JobsError):
    """A run ended without success.

    Attributes:
        run_id: The run.
        url: The run's page in the workspace.
        failed_tasks: Keys of the tasks that failed (not those skipped after them).
    """

    def __init__(self, message: str, run_id: int, url: str, failed_tasks: list[str]):
        super().__init__(message)
        self.run_id = run_id
        self.url = url
        self.failed_tasks = failed_tasks


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Where a run is (or ended).

    Attributes:
        run_id: The run.
        job_id: Its job.
        url: The run's page in the workspace.
        life_cycle_state: ``PENDING``, ``RUNNING``, ... ``TERMINATED``.
        result_state: ``SUCCESS``, ``FAILED``, ... once it has one, else None.
        message: The state message Databricks gives, if any.
    """

    run_id: int
    job_id: int
    url: str
    life_cycle_state: str | None
    result_state: str | None
    message: str = ""
