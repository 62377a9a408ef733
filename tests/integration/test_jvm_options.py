"""The tests' own JVM options (tests/support/jvm.py) take effect: a Spark
driver started with them maps the environment's class archive. A JVM that
cannot use the archive it is given only warns and parses every class again
(about twice the CPU of a short session); with ``-Xshare:on`` it refuses to
start instead, which is what this test looks for."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import jvm

_SESSION = ("from dist_dl.core.session import get_spark\n"
            "spark = get_spark('local[1]')\n"
            "assert spark.range(5).count() == 5\n"
            "spark.stop()\n")


@pytest.mark.timeout(240)
def test_a_spark_driver_maps_the_class_archive_of_this_environment():
    archive = jvm.ensure_class_archive()
    assert archive is not None and archive.exists(), "the class archive could not be made"
    options = jvm.driver_env()["SPARK_SUBMIT_OPTS"]
    assert f"-XX:SharedArchiveFile={archive}" in options
    done = subprocess.run([sys.executable, "-c", _SESSION], capture_output=True, text=True,
                          timeout=200,
                          env=dict(os.environ, SPARK_SUBMIT_OPTS=f"{options} -Xshare:on"))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Unable to use shared archive" not in done.stderr
