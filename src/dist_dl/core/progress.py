"""Progress lines for long Spark steps on the driver.

Training reports its own progress from rank 0 (steps, images/s, time left;
``dist_dl.train.engines``). Steps that are plain Spark jobs, such as writing
image shards, report through ``SparkProgress``: a daemon thread on the driver
that reads Spark's status tracker for one job group every ``every`` seconds
(tasks done of the stages running) and, when given one, an accumulator the
tasks add their items to (images decoded). Spark hands a task's accumulator
updates to the driver when the task ends, so counts move a task at a time;
task counts come from Spark's status store, which can lag them by a second.

The console progress bar of Spark is off in ``dist_dl.core.session`` (its
carriage returns garble notebook and job logs); these are whole lines.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

__all__ = ["SparkProgress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``1m05s`` or ``2h03m``; ``?`` for an unknown time."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class SparkProgress:
    """Context manager: while its body runs, print a line every ``every``
    seconds on the Spark jobs of ``group`` (set with ``setJobGroup``), and one
    line at the end.

    Args:
        sc: The SparkContext.
        group: The job group whose jobs are followed.
        label: What the lines start with (e.g. ``"prepare-data"``).
        counter: Optional accumulator the tasks add processed items to.
        total: Items expected (with ``counter``: gives the time left).
        unit: Name of the items (``"images"``).
        every: Seconds between lines; ``None`` or 0 prints nothing.
        out: Where lines go (default ``print``, flushed).
    """

    def __init__(self, sc, group: str, *, label: str, counter=None, total: int | None = None,
                 unit: str = "images", every: float | None = 30.0,
                 out: Callable[[str], None] | None = None):
        self.sc, self.group, self.label = sc, group, label
        self.counter, self.total, self.unit = counter, total, unit
        self.every = every
        self.out = out or (lambda line: print(line, flush=True))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> "SparkProgress":
        self._start = time.perf_counter()
        if self.every:
            self._thread = threading.Thread(target=self._run, name=f"progress-{self.group}",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if exc_type is None:
                self.out(self.line(final=True))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.out(self.line())
            except Exception:  # a status query during shutdown: stop reporting
                return

    def _tasks(self) -> tuple[int, int]:
        """(completed, total) tasks of the stages of this group's running jobs."""
        tracker = self.sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None or job.status != "RUNNING":
                continue
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None and stage.numActiveTasks + stage.numCompletedTasks:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    def line(self, final: bool = False) -> str:
        """The current progress line."""
        elapsed = time.perf_counter() - self._start
        parts = [f"{self.label}:"]
        if not final:
            done_tasks, total_tasks = self._tasks()
            if total_tasks:
                parts.append(f"tasks {done_tasks}/{total_tasks},")
        if self.counter is not None:
            items = int(self.counter.value)
            rate = items / elapsed if elapsed > 0 else 0.0
            of = f"/{self.total:,}" if self.total else ""
            parts.append(f"{items:,}{of} {self.unit} ({rate:,.1f} {self.unit}/s),")
            if self.total and not final:
                left = (self.total - items) / rate if rate > 0 else math.inf
                parts.append(f"{format_duration(left)} left,")
        parts.append(f"{format_duration(elapsed)} {'in all' if final else 'elapsed'}")
        return " ".join(parts)
