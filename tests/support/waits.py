"""Waiting for what a job must leave behind to go away."""
from __future__ import annotations

import time
from typing import Callable


def left_after(find: Callable[[], list], seconds: float = 10.0, every: float = 0.2) -> list:
    """Call ``find`` until it returns nothing or ``seconds`` have passed;
    what it found last (empty: all gone in time)."""
    deadline = time.monotonic() + seconds
    while True:
        left = find()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(every)


def workers_left(root: int | None = None, within: float = 10.0) -> list[str]:
    """The library's worker processes under process ``root`` (default: this
    one) still running ``within`` seconds from now (Spark's Python workers
    included: they are children of its JVM). A failed job's other ranks end as
    their Spark tasks are cancelled, which may come a moment after the error
    is raised: the launcher's tests give them the same 10 s."""
    import psutil

    def running() -> list[str]:
        left = []
        for proc in psutil.Process(root).children(recursive=True):
            try:
                if ("dist_dl.launch.core._worker_main" in " ".join(proc.cmdline())
                        and proc.status() != psutil.STATUS_ZOMBIE):
                    left.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
            except psutil.Error:
                pass
        return left

    return left_after(running, within)
