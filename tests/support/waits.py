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
