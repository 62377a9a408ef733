"""Replacing a test process's local Spark session whose py4j connection was
interrupted half-way.

pytest-timeout's signal method raises in the test's thread wherever it is,
also inside py4j while it sends a command or reads an answer. py4j closes
the connection where the interruption lands in its socket calls, but not
everywhere (an answer half converted, a callback half served), and a
connection left out of step answers every later call of that process with
another call's reply (py4j ``KeyError: 'm'`` and similar errors in every
later test of that xdist worker). ``discard_session`` ends the session's
JVM and forgets pyspark's handles on it, so that the next ``get_spark``
starts a new JVM with new connections.
"""
from __future__ import annotations

import contextlib
import subprocess


def discard_session() -> bool:
    """End the local Spark session's JVM and forget it; False where there was none.

    ``SparkContext.stop`` is not used: it talks to the JVM over the very
    connections that may be out of step.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    if gateway is None:
        return False
    proc = getattr(gateway, "proc", None)  # set by pyspark's launch_gateway
    with contextlib.suppress(Exception):
        gateway.close()
    if proc is not None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    context = SparkContext._active_spark_context
    if context is not None:
        with contextlib.suppress(Exception):
            context._accumulatorServer.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    return True
