"""The driver's backstop to a job's timeout: each place stops its own
workers at the job's deadline; past it and twice the grace, the driver
cancels the Spark job itself (a task that could not stop its workers, an
executor that stopped answering). And Ctrl-C while the job's stage runs
(`Interrupts`)."""
from __future__ import annotations

import signal
import threading
from typing import Callable

from dist_dl.launch.core.errors import JobTimeout, NotEnoughSlots

__all__ = ["Backstop", "Interrupts", "stage_refusal"]


class Interrupts:
    """Ctrl-C (SIGINT) on the driver's main thread while a Spark stage runs:
    cancels the stage with ``cancel`` from a thread of its own, and raises
    KeyboardInterrupt when the block ends, whatever the cancelled stage
    raised. Use as a context manager around the stage; elsewhere than on the
    main thread it does nothing (signals reach only that one).

    PySpark's own handler cancels every job from inside the handler: a py4j
    call on the connection that the main thread is blocked on (``collect``),
    which pyspark 4.1 refuses ("RuntimeError: reentrant call inside
    <_io.BufferedReader>"), so the stage failed with that error instead of
    KeyboardInterrupt and a training retried it as a failed attempt.
    """

    def __init__(self, cancel: Callable[[], None]):
        self._cancel = cancel
        self.received = False
        self._previous = None

    def _handler(self, signum, frame) -> None:
        if not self.received:
            self.received = True
            threading.Thread(target=self._cancel, daemon=True,
                             name="dist_dl-interrupt").start()

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self.received:
            raise KeyboardInterrupt


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
