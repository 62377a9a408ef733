"""The launcher interface: one ``run`` that starts N workers and returns rank
0's result, with one implementation per place workers can run.

Driver side. ``HorovodRunner`` picks a backend; tests call each one directly.
"""
from __future__ import annotations

import importlib.util
import re
import signal
from typing import Any, Callable, Protocol

from dist_dl.launch.errors import JobTimeout, WorkerError
from dist_dl.launch.protocol import DriverSink
from dist_dl.launch.worker import WorkerOptions

__all__ = ["Backend", "select_backend", "failure_from", "databricks_runner_available"]


class Backend(Protocol):
    """Starts ``num_proc`` workers that form one Horovod job."""

    name: str

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        """Run ``fn(**kwargs)`` on every worker; return rank 0's result.

        Raises:
            WorkerError: a worker raised or died.
            JobTimeout: the job outlived ``options.timeout``.
            NotEnoughSlots: the cluster cannot run ``num_proc`` tasks at once.
        """


def databricks_runner_available() -> bool:
    """True on a Databricks ML runtime that still ships ``sparkdl.HorovodRunner``."""
    try:
        return importlib.util.find_spec("sparkdl") is not None and \
            hasattr(importlib.import_module("sparkdl"), "HorovodRunner")
    except ImportError:
        return False


def select_backend(np: int, spark=None) -> Backend:
    """``np < 0``: processes on this machine. ``np > 0``: Spark tasks, through
    Databricks' own HorovodRunner where it exists, else Horovod's Spark runner."""
    if np < 0:
        from dist_dl.launch.local import LocalBackend

        return LocalBackend()
    if databricks_runner_available():
        from dist_dl.launch.databricks import DatabricksBackend

        return DatabricksBackend()
    from dist_dl.launch.spark import SparkBackend

    return SparkBackend(spark)


# Errors that survivors raise because a peer died: not the cause.
_COLLATERAL = re.compile(r"HorovodInternalError|Horovod has been shut ?down|"
                         r"[Cc]onnection (closed|reset) by peer|Broken pipe|Gloo|gloo", re.S)


def _collateral(record: dict) -> bool:
    return bool(_COLLATERAL.search(f"{record.get('type')}: {record.get('message')}"))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def failure_from(sink: DriverSink, first_failed: tuple[int, int] | None,
                 timeout: float | None) -> Exception:
    """The error to raise on the driver for a failed job.

    Args:
        sink: What the workers reported.
        first_failed: (rank, exit code) of the first worker seen to fail, if known.
        timeout: The job's timeout, for the message.
    """
    expired = sink.first("timeout")
    if expired is not None:
        return JobTimeout(
            f"rank {expired['rank']} was still running after the job's timeout of "
            f"{expired['seconds']:g} s, so every worker was stopped. Raise HorovodRunner(timeout=...) "
            "if the job needs longer, or look for a worker stuck waiting on its peers.")
    records = {r["rank"]: r for r in sink.records[::-1] if r["kind"] == "error"}
    if first_failed is not None and first_failed[0] in records:
        cause = records[first_failed[0]]
        if not _collateral(cause):
            return _worker_error(cause)
    cause = sink.first("error", prefer=lambda r: not _collateral(r))
    if cause is not None and (first_failed is None or not _collateral(cause)):
        return _worker_error(cause)
    if first_failed is not None:
        rank, code = first_failed
        tail = "\n".join(sink.tails.get(rank, ())) or "(no output)"
        return WorkerError(rank, "WorkerDied", f"the worker process {_describe_exit(code)}",
                           detail=f"last output of rank {rank}:\n{tail}")
    if cause is not None:
        return _worker_error(cause)
    return WorkerError(-1, "WorkerDied", "the job failed without a report from any worker")


def _worker_error(record: dict) -> WorkerError:
    return WorkerError(record["rank"], record["type"], record["message"], record["traceback"])
