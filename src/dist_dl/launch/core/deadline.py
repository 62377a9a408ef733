"""The driver's backstop to a job's timeout: each place stops its own
workers at the job's deadline; past it and twice the grace, the driver
cancels the Spark job itself (a task that could not stop its workers, an
executor that stopped answering)."""
from __future__ import annotations

import threading
from typing import Callable

from dist_dl.launch.core.errors import JobTimeout, NotEnoughSlots

__all__ = ["Backstop", "stage_refusal"]


class Backstop:
    """Calls ``cancel`` once ``timeout + 2 * grace`` seconds have passed
    (never where ``timeout`` is None), unless stopped first; ``expired`` says
    whether it did. Use as a context manager around the job."""

    def __init__(self, timeout: float | None, grace: float, cancel: Callable[[], None]):
        self.expired = threading.Event()
        self._timer = None
        if timeout:
            def fire():
                self.expired.set()
                cancel()

            self._timer = threading.Timer(timeout + 2 * grace, fire)
            self._timer.daemon = True

    def __enter__(self) -> "Backstop":
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()


def stage_refusal(text: str, backstop: Backstop, sink, label: str, num_proc: int,
                  timeout: float | None, grace: float, where: str) -> Exception | None:
    """What a failed barrier stage's error ``text`` says before any worker's
    report: Spark's barrier mode found too few slots (``NotEnoughSlots``),
    or the backstop cancelled the job (``JobTimeout``, ``where`` naming what
    was cancelled); else None."""
    if "SPARK-24819" in text or "requires more slots than" in text:
        return NotEnoughSlots(
            f"{label} needs {num_proc} Spark tasks running at the same time, and Spark's "
            f"barrier mode found fewer task slots (executors were lost after the check?). Use "
            f"a smaller np, or add workers or cores.")
    if backstop.expired.is_set() and sink.first("timeout") is None:
        return JobTimeout(
            f"{label}: the job did not finish within its timeout of {timeout:g} s "
            f"(+{2 * grace:g} s grace); {where}")
    return None
