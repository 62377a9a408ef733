"""Progress lines of long Spark steps (dist_dl.core.progress), on a real local Spark."""
from __future__ import annotations

import re
import time

import pytest

from dist_dl.core.progress import SparkProgress


@pytest.mark.timeout(120)
def test_lines_follow_tasks_and_items_of_the_job_group(spark):
    sc = spark.sparkContext
    done = sc.accumulator(0)

    def slow(rows):
        rows = list(rows)
        time.sleep(1.0)
        done.add(len(rows))
        return rows

    lines = []
    sc.setJobGroup("progress-test", "progress test")
    try:
        with SparkProgress(sc, "progress-test", label="decode", counter=done, total=40,
                           every=0.3, out=lines.append):
            # 4 tasks of 10 rows on 2 slots: two waves of about 1 s each.
            assert sc.parallelize(range(40), 4).mapPartitions(slow).count() == 40
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    running = [line for line in lines[:-1] if "tasks" in line]
    assert running, lines
    pattern = (r"decode: tasks ([0-4])/4, (\d+)/40 images \([\d.]+ images/s\), "
               r"(\d+m\d\ds|\?) left, \d+m\d\ds elapsed")
    seen = [re.fullmatch(pattern, line) for line in running]
    assert all(seen), running
    # Lines between the waves see the first wave's images and a time left.
    # (Task counts come from Spark's status store, which lags the tasks by up
    # to a second here, so they are only checked for their form.)
    assert any(m[2] in ("20", "30") and m[3] != "?" for m in seen), "\n".join(lines)
    assert re.fullmatch(r"decode: 40/40 images \([\d.]+ images/s\), \d+m\d\ds in all",
                        lines[-1]), lines[-1]


def test_no_lines_when_turned_off(spark):
    lines = []
    with SparkProgress(spark.sparkContext, "none", label="x", every=None, out=lines.append):
        spark.range(3).count()
    assert lines == []
