"""Errors a launch raises on the driver, and which one a failed job raises
(`failure_from()`, used by every backend)."""
from __future__ import annotations

import re
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the sink is handed in by the backends
    from dist_dl.launch.core.protocol import DriverSink

__all__ = ["WorkerError", "JobTimeout", "JobCancelled", "NotEnoughSlots", "failure_from",
           "cancelled_from_outside",
           "runner_prefix"]


class WorkerError(RuntimeError):
    """A worker raised (or died). Carries the rank and the worker's traceback.

    Attributes:
        rank: Horovod rank of the worker that failed first.
        host: The host it ran on, as it reported when it started ('' if it
            never reported).
        worker_type: Name of the exception type raised in the worker.
        worker_message: ``str()`` of that exception.
        worker_traceback: The worker's formatted traceback ('' if it died
            without one, e.g. killed by a signal).
        runner: The runner whose job failed, as its user wrote it
            (``TorchDistributor(num_processes=2, ...)``), which the message
            starts with; '' where a library function launched the workers.
    """

    def __init__(self, rank: int, worker_type: str, worker_message: str, worker_traceback: str = "",
                 detail: str = "", host: str = "", runner: str = ""):
        self.rank = rank
        self.runner = runner
        self.host = host
        self.worker_type = worker_type
        self.worker_message = worker_message
        self.worker_traceback = worker_traceback
        where = f" on host {host}" if host else ""
        text = (f"{runner_prefix(runner)}worker rank {rank}{where} failed: {worker_type}: "
                f"{worker_message}")
        if detail:
            text += f"\n{detail}"
        if worker_traceback:
            text += f"\n--- traceback of rank {rank} ---\n{worker_traceback.rstrip()}"
        super().__init__(text)


class JobTimeout(TimeoutError):
    """The job ran longer than the runner's ``timeout``; all workers were stopped."""


class JobCancelled(RuntimeError):
    """The job's Spark tasks were cancelled from outside the runner (a
    job-group cancel, ``cancelAllJobs()``, the Spark UI's kill link, the
    SparkContext stopped); its workers were stopped. Not retried: somebody
    asked for the job to end."""


class NotEnoughSlots(RuntimeError):
    """The cluster cannot run ``np`` Spark tasks at once."""


_CANCELLED = re.compile(r"\bcancell?ed\b", re.I)


# Spark's own words for a cancelled job (3.5 and 4.x; 4.x puts an error class
# before them): "Job 3 cancelled as part of cancellation of all jobs", "...
# part of cancelled job group G", "... because SparkContext was shut down".
_JOB_CANCELLED = re.compile(r"SparkException: (?:\[SPARK_JOB_CANCELLED\] )?"
                            r"(Job \d+ cancell?ed[^\n]*?)(?: SQLSTATE: \w+)?$", re.M)


def cancelled_from_outside(error: str, group: str | None = None) -> tuple[str, bool] | None:
    """Where a failed Spark job's ``error`` says the job was cancelled, and not
    by the runner's own cancel of its job group ``group`` (a timeout, a
    worker's failure): Spark's reason (the first line of its own message),
    and whether that is Spark's own job cancellation (certain, even if a
    worker failed meanwhile: a peer of a worker killed by the cancel fails
    too) rather than the word "cancelled" somewhere in it. Else None."""
    job = _JOB_CANCELLED.search(error)
    if job is not None:
        if group is not None and job.group(1).endswith(f"job group {group}"):
            return None
        return job.group(1)[:300], True
    if not _CANCELLED.search(error):
        return None
    match = re.search(r"SparkException: ([^\n]+)", error)
    return (match.group(1) if match else error.strip().splitlines()[-1])[:300], False


# Errors that survivors raise because a peer died: not the cause. Horovod and
# Gloo; tf.distribute's collectives (gRPC status UNAVAILABLE, an aborted
# collective group).
_COLLATERAL = re.compile(r"HorovodInternalError|Horovod has been shut ?down|"
                         r"[Cc]onnection (closed|reset) by peer|Broken pipe|Gloo|gloo|"
                         r"UnavailableError|Collective ops is aborted|Socket closed|"
                         r"failed to connect to all addresses", re.S)


def _collateral(record: dict) -> bool:
    return bool(_COLLATERAL.search(f"{record.get('type')}: {record.get('message')}"))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def runner_prefix(runner: str) -> str:
    """The start of a message naming the runner whose job it is ('' for none)."""
    return f"{runner}: " if runner else ""


def failure_from(sink: DriverSink, first_failed: tuple[int, int] | None,
                 timeout: float | None, runner: str = "") -> Exception:
    """The error to raise on the driver for a failed job.

    Args:
        sink: What the workers reported.
        first_failed: (rank, exit code) of the first worker seen to fail, if known.
        timeout: The job's timeout, for the message.
        runner: The runner as its user wrote it, which the message starts
            with ('' where a library function launched the workers).
    """
    expired = sink.first("timeout")
    if expired is not None:
        return JobTimeout(
            f"{runner_prefix(runner)}rank {expired['rank']}{_on_host(sink, expired['rank'])} was "
            f"still running after the job's timeout of {expired['seconds']:g} s, so every worker "
            "was stopped. Raise the runner's timeout= if the job needs longer, or look for a "
            "worker stuck waiting on its peers.")
    records = {r["rank"]: r for r in sink.records[::-1] if r["kind"] == "error"}
    if first_failed is not None and first_failed[0] in records:
        cause = records[first_failed[0]]
        if not _collateral(cause):
            return _worker_error(sink, cause, runner=runner)
    cause = sink.first("error", prefer=lambda r: not _collateral(r))
    collateral = cause is not None and _collateral(cause)
    if cause is not None and (first_failed is None or not collateral):
        # Collateral with nothing better (no rank's own error, no exit code
        # seen): the worker that reported is the one left waiting; say so,
        # and name its peers (a rank whose peer's host is cut off the network
        # reports only "UnknownError: Graph execution error:").
        return _worker_error(sink, cause, lost_peer=collateral, runner=runner)
    if first_failed is not None:
        rank, code = first_failed
        tail = "\n".join(sink.tails.get(rank, ())) or "(no output)"
        return WorkerError(rank, "WorkerDied",
                           f"the worker process {_describe_exit(code)}{_peer_timeout(sink, rank)}",
                           detail=f"last output of rank {rank}:\n{tail}",
                           host=sink.hosts.get(rank, ""), runner=runner)
    if cause is not None:
        return _worker_error(sink, cause, runner=runner)
    return WorkerError(-1, "WorkerDied", "the job failed without a report from any worker",
                       runner=runner)


def _peer_timeout(sink: DriverSink, rank: int) -> str:
    """If ``rank`` ended because Gloo timed out waiting for its peers, that,
    and the other ranks with their hosts (one of which stopped answering);
    if TensorFlow ended it because peers stopped sending heartbeats, those:
    the worker that exits first is the one that waited, not the one that went
    missing."""
    if sink.unhealthy.get(rank):
        return f" after {_lost_peer(sink, rank)}"
    found = sink.gloo_timeouts.get(rank)
    if not found:
        return ""
    return f" after Gloo timed out waiting for another rank ({found}): {_lost_peer(sink, rank)}"


def _lost_peer(sink: DriverSink, rank: int) -> str:
    """What stops a rank's collectives from outside it, and the ranks other
    than ``rank`` (each with its host) among which to look; the ranks
    TensorFlow told ``rank`` stopped sending heartbeats, where it did."""
    lost = sorted(sink.unhealthy.get(rank, ()))
    if lost:
        named = ", ".join(f"rank {r}{_on_host(sink, r)}" for r in lost)
        return (f"TensorFlow found {named} stopped sending heartbeats (a host cut off the "
                "network, or a worker stopped or lost)")
    named = ", ".join(f"rank {r}{_on_host(sink, r)}" for r in sorted(sink.hosts) if r != rank)
    return ("a host cut off the network, or a worker stopped or lost, among "
            f"{named or 'the other ranks'}")


def _on_host(sink: DriverSink, rank: int) -> str:
    """The words ``on host H`` for the host ``rank`` said it runs on when it
    started ('' if it did not report): a Spark task may run on any executor,
    and a failure on a cluster is looked into on that host."""
    host = sink.hosts.get(rank)
    return f" on host {host}" if host else ""


def _worker_error(sink: DriverSink, record: dict, lost_peer: bool = False,
                  runner: str = "") -> WorkerError:
    message = record["message"]
    if lost_peer:
        # On the first line, which is what a run's attempt tag keeps.
        first, newline, rest = message.partition("\n")
        message = (f"{first} [a collective failed with its peers: "
                   f"{_lost_peer(sink, record['rank'])}]{newline}{rest}")
    return WorkerError(record["rank"], record["type"], message, record["traceback"],
                       host=sink.hosts.get(record["rank"], ""), runner=runner)
