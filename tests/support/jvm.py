"""Java options for the Spark JVMs the tests start.

The suite starts about 150 JVMs (each a Spark application's driver, a
standalone master or worker, or an executor), each running for seconds on
small data. Most of a short-lived JVM's CPU goes to the optimising JIT
compiler (C2) and the parallel garbage collector's threads, work that pays
off only in long runs. Client compilation only (C1) and the serial collector
start the same Spark about twice as cheaply in CPU on two cores; what the
JVMs compute is unchanged. The product leaves the JVM's defaults alone: these
settings are the tests', for jobs of seconds.
"""
from __future__ import annotations

QUICK_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def driver_env() -> dict[str, str]:
    """Environment for processes that start a Spark driver JVM through
    PySpark (spark-submit adds SPARK_SUBMIT_OPTS to the driver's options;
    ``local[N]`` executors live in that JVM)."""
    return {"SPARK_SUBMIT_OPTS": QUICK_START}


def daemon_env() -> dict[str, str]:
    """Environment for a standalone master or worker started with
    ``spark-class``: JAVA_TOOL_OPTIONS reaches the daemon and the executors a
    worker forks (they inherit its environment), whatever options each
    application passes. The JVM notes the variable on its standard error,
    which goes to the daemon's and the executors' logs."""
    return {"JAVA_TOOL_OPTIONS": QUICK_START}
