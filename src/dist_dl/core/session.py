"""The Spark session the library runs in: the caller's, or an embedded local one.

Driver-side only. On Databricks (or inside any existing pipeline) the active
session is used as it is; locally, `get_spark()` starts a hermetic
`local[N]` session (UI off, temporary directories, loopback only), or
one on a cluster's master with the driver reachable from the other hosts.
"""
from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import shutil
import socket
import sys
import tempfile

__all__ = ["get_spark", "driver_address", "task_slots", "job_group"]


def get_spark(master: str | None = None, app_name: str = "dist_dl", conf: dict | None = None,
              *, replace: bool = False):
    """Return the active SparkSession, or start one.

    Args:
        master: Spark master URL. None uses the active session if there is one,
            else ``local[2]``.
        app_name: Application name of a new session.
        conf: Extra Spark configuration for a new session.
        replace: If a session with another master is active, stop it and start
            one on ``master``. Without it that is an error: the active session
            is the caller's (a notebook's, a pipeline's), and one process holds
            one SparkContext.

    A local master (``local[N]``, or a standalone master on loopback) keeps
    the driver on 127.0.0.1. Any other master gets the driver's address on
    the interface that routes to the master host (``driver_address``), so
    executors on other hosts can call back; ``spark.driver.host`` in ``conf``
    overrides it.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    if active is not None:
        # From the session's configuration: a Spark Connect session has no SparkContext.
        active_master = active.conf.get("spark.master", "")
        if active_master == master:
            return active
        if not replace:
            raise ValueError(
                f"a SparkSession on master {active_master!r} is active, and one "
                f"process can hold only one SparkContext, so none can start on {master!r}. "
                "Leave master unset (or pass spark=) to use the active session, or stop it "
                "first (spark.stop()).")
        active.stop()
    master = master or "local[2]"
    # Executors must run this interpreter (the one that has dist_dl and its
    # stack), and nothing should listen on a public interface locally.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = dict(conf or {})
    # One look-up (it may ask DNS): what the executors are told, unless the
    # caller's conf names the driver's address itself.
    routed = driver_address(master)
    if routed == "127.0.0.1":
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    scratch = tempfile.mkdtemp(prefix="dist_dl-spark-")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", os.path.join(scratch, "local"))
        .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
        .config("spark.sql.shuffle.partitions", "4")
        # What opening a file costs, in bytes read in the same time, when
        # Spark packs files into a scan's tasks. Spark's default (4 MB) is
        # sized for object stores; the sessions started here read a local
        # disk or a mounted shared folder, where opening a file costs about
        # as much as reading 128 KB. With the default, a folder of 1,800 images
        # of 1 KB becomes 57 tasks per pass, mostly task overhead.
        .config("spark.sql.files.openCostInBytes", str(128 * 1024))
    )
    java_options = [f"-Dderby.system.home={scratch}"]
    if not _user_log4j2(conf):
        java_options.append(f"-Dlog4j2.configurationFile={_write_log4j2(scratch)}")
    # The caller's own driver options come last (and win where they repeat one).
    java_options.append(conf.pop("spark.driver.extraJavaOptions", ""))
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options).strip())
    host = conf.get("spark.driver.host") or routed
    if host is not None:
        # Executors call the driver at spark.driver.host. Bound to that one
        # address, not to every interface: on loopback for a local master.
        builder = builder.config("spark.driver.host", host)
        builder = builder.config("spark.driver.bindAddress",
                                 conf.get("spark.driver.bindAddress", host))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # The session's scratch folder goes with the process (Spark removes only
    # the folders it made inside spark.local.dir): every session used to
    # leave one in /tmp.
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return spark


# The driver JVM's logging for an embedded session: Spark's own defaults at
# WARN (as its shells use), without the start-up lines that bury the
# commands' output and say nothing to act on: the "Setting default log
# level" banner (printed when the shell logger's level differs from the
# root's), Hadoop's missing native library (pure-Java code paths are used),
# and SparkConf's note on spark.local.dir, which this module sets itself.
# Every other warning and error is kept.
_LOG4J2 = r"""
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = warn
logger.jetty.name = org.sparkproject.jetty.util.component.AbstractLifeCycle
logger.jetty.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = error
logger.conf.name = org.apache.spark.SparkConf
logger.conf.filter.localdir.type = RegexFilter
logger.conf.filter.localdir.regex = .*spark\.local\.dir will be overridden.*
logger.conf.filter.localdir.onMatch = DENY
logger.conf.filter.localdir.onMismatch = NEUTRAL
"""


def _user_log4j2(conf: dict) -> bool:
    """Whether the caller configured the driver's log4j 2 already: in the
    driver's Java options, or with a log4j2.properties in SPARK_CONF_DIR."""
    if "log4j2.configurationFile" in conf.get("spark.driver.extraJavaOptions", ""):
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    return bool(conf_dir) and os.path.exists(os.path.join(conf_dir, "log4j2.properties"))


def _write_log4j2(scratch: str) -> str:
    path = os.path.join(scratch, "log4j2.properties")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_LOG4J2.lstrip())
    return path


def _master_host(master: str) -> str | None:
    """The first host of a ``spark://`` URL (``spark://a:7077,b:7077``: ``a``)."""
    if not master.startswith("spark://"):
        return None
    first = master[len("spark://"):].split(",")[0]
    return first.rsplit(":", 1)[0].strip("[]") or None


def driver_address(master: str) -> str | None:
    """The address executors of ``master`` should call the driver at.

    ``local[...]``: 127.0.0.1. ``spark://host:port``: this machine's address
    on the interface that routes to ``host`` (127.0.0.1 when the master is on
    loopback), or ``SPARK_LOCAL_IP`` when that is set to a routable address.
    Other masters (YARN, Kubernetes): None, Spark's own default.

    Raises:
        ValueError: the master's host name does not resolve.
    """
    if master.startswith("local"):
        return "127.0.0.1"
    host = _master_host(master)
    if host is None:
        return None
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 7077, proto=socket.IPPROTO_UDP)[0]
    except socket.gaierror as exc:
        raise ValueError(f"the Spark master's host {host!r} (from {master!r}) does not resolve "
                         f"on this machine: {exc}. Use its address or a name this host's DNS "
                         "knows.") from exc
    if ipaddress.ip_address(sockaddr[0]).is_loopback:
        return "127.0.0.1"
    local_ip = os.environ.get("SPARK_LOCAL_IP")
    if local_ip and not ipaddress.ip_address(local_ip).is_loopback:
        return local_ip
    # A UDP "connect" sends nothing: it asks the kernel which source address
    # it would use for that destination, i.e. the interface that routes there.
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return probe.getsockname()[0]


def task_slots(spark) -> int:
    """How many Spark tasks can run at the same time right now.

    Uses the scheduler's own count (executors registered now, times their
    cores, divided by ``spark.task.cpus``), the figure Spark's barrier mode
    checks against.
    """
    # A classic session's; a Spark Connect session states its slots in its
    # configuration, if anywhere (dist_dl.core.sessionkind.configured_slots).
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

    Off ``local[...]``, a `StallWatch` turns jobs that
    cannot run (no executor starts, executors keep dying) into
    `SparkStalled` after ``spark.dist_dl.stallTimeout``.
    """
    from dist_dl.core.stall import SparkStalled, StallWatch

    sc.setJobGroup(group, description, interruptOnCancel=True)
    watch = StallWatch(sc, group, description)  # idle on local[...] masters
    try:
        with watch:
            yield group
    except BaseException as exc:
        sc.cancelJobGroup(group)
        if watch.stalled:
            raise SparkStalled(watch.message) from exc
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
