"""The Spark session the library runs in: the caller's, or an embedded local one.

Driver-side only. On Databricks (or inside any existing pipeline) the active
session is used as it is; locally, `get_spark()` starts a hermetic
`local[N]` session (UI off, temporary directories, loopback only).
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

__all__ = ["get_spark", "task_slots", "job_group"]


def get_spark(master: str | None = None, app_name: str = "dist_dl", conf: dict | None = None):
    """Return the active SparkSession, or start a local one.

    Args:
        master: Spark master URL. None uses the active session if there is one,
            else ``local[2]``. If a session with another master is active, it is
            stopped and a new one is started (one SparkContext per process).
        app_name: Application name of a new session.
        conf: Extra Spark configuration for a new session.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        return active
    if active is not None:
        active.stop()
    master = master or "local[2]"
    # Executors must run this interpreter (the one that has dist_dl and its
    # stack), and nothing should listen on a public interface locally.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith(("local", "spark://127.0.0.1", "spark://localhost")):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    scratch = tempfile.mkdtemp(prefix="dist_dl-spark-")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", os.path.join(scratch, "local"))
        .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={scratch}")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def task_slots(spark) -> int:
    """How many Spark tasks can run at the same time right now.

    Uses the scheduler's own count (executors registered now, times their
    cores, divided by ``spark.task.cpus``), the figure Spark's barrier mode
    checks against.
    """
    jsc = spark.sparkContext._jsc.sc()
    # `maxNumConcurrentTasks` is private[spark] in Scala, public in bytecode.
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


@contextlib.contextmanager
def job_group(sc, group: str, description: str):
    """Run the block's Spark jobs (from this thread) in job group ``group``.

    If the block raises, or is interrupted (Ctrl-C in a notebook), the
    group's running jobs are cancelled (their tasks interrupted) before the
    error goes on. Either way the thread's job group and description are
    cleared at the end, so later jobs of the caller are not filed under it.
    """
    sc.setJobGroup(group, description, interruptOnCancel=True)
    try:
        yield group
    except BaseException:
        sc.cancelJobGroup(group)
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
