"""Errors a launch raises on the driver."""
from __future__ import annotations

__all__ = ["WorkerError", "JobTimeout", "NotEnoughSlots"]


class WorkerError(RuntimeError):
    """A worker raised (or died). Carries the rank and the worker's traceback.

    Attributes:
        rank: Horovod rank of the worker that failed first.
        worker_type: Name of the exception type raised in the worker.
        worker_message: ``str()`` of that exception.
        worker_traceback: The worker's formatted traceback ('' if it died
            without one, e.g. killed by a signal).
    """

    def __init__(self, rank: int, worker_type: str, worker_message: str, worker_traceback: str = "",
                 detail: str = ""):
        self.rank = rank
        self.worker_type = worker_type
        self.worker_message = worker_message
        self.worker_traceback = worker_traceback
        text = f"worker rank {rank} failed: {worker_type}: {worker_message}"
        if detail:
            text += f"\n{detail}"
        if worker_traceback:
            text += f"\n--- traceback of rank {rank} ---\n{worker_traceback.rstrip()}"
        super().__init__(text)


class JobTimeout(TimeoutError):
    """The job ran longer than the runner's ``timeout``; all workers were stopped."""


class NotEnoughSlots(RuntimeError):
    """The cluster cannot run ``np`` Spark tasks at once."""
