"""The cases of tests/integration/test_progress.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import math
from dist_dl.core.progress import format_duration


def test_durations_read_as_minutes_and_hours():
    assert format_duration(65.9) == "1m05s"
    assert format_duration(2 * 3600 + 3 * 60 + 59) == "2h03m"
    assert format_duration(math.inf) == "?" and format_duration(-1) == "?"
