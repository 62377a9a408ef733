"""Java options for the Spark JVMs the tests start.

The suite starts about 150 JVMs (each a Spark application's driver, a
standalone master or worker, or an executor), each running for seconds on
small data. Most of a short-lived JVM's CPU goes to the optimising JIT
compiler (C2), the parallel garbage collector's threads, and loading and
verifying Spark's classes: work that pays off only in long runs. So the
tests' JVMs compile with C1 only and collect with the serial collector, and
the drivers map Spark's classes from a class-data-sharing archive
(:func:`ensure_class_archive`, made once per environment) instead of
parsing them. What the JVMs compute is unchanged; a short Spark session
costs about a third of the CPU. The product leaves the JVM's defaults alone:
these settings are the tests', for jobs of seconds.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QUICK_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# What the archive is made from: a driver that starts Spark, runs SQL (code
# generation) and a Python mapPartitions, and writes and reads Parquet.
_WARM_UP = """
import sys, tempfile
from dist_dl.core.session import get_spark
spark = get_spark("local[2]")
df = spark.range(0, 10000, numPartitions=2)
df.selectExpr("sum(id)", "max(id % 7)").collect()
df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
path = tempfile.mkdtemp() + "/t"
df.write.parquet(path)
spark.read.parquet(path).count()
spark.stop()
"""


@functools.lru_cache(maxsize=None)
def class_archive() -> Path:
    """Where this environment's archive lives: keyed by the Python
    environment, its PySpark install and the ``java`` on PATH, in the ignored
    ``runs/``. An archive fits only the JVM and the class path it was made
    with, jar files' times included: the JVM refuses one made before PySpark
    was installed again (and warns at every start), so the jars folder's
    time is part of the key."""
    import pyspark

    java = shutil.which("java") or ""
    java_id = f"{os.path.realpath(java)}:{os.stat(java).st_mtime_ns}" if java else ""
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    spark_id = f"{pyspark.__version__}:{os.stat(jars).st_mtime_ns if os.path.isdir(jars) else 0}"
    return _ARCHIVES / f"{_ENVIRONMENT}-{_digest(f'{spark_id}|{java_id}')}.jsa"


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


_ARCHIVES = Path(__file__).resolve().parents[2] / "runs" / "tests" / "jvm"
# The start of the names of this Python environment's archives.
_ENVIRONMENT = f"spark-{_digest(sys.prefix)}"


def ensure_class_archive(timeout: float = 300) -> Path | None:
    """Make this environment's class-data-sharing archive if it is missing
    (a driver JVM dumps the classes it loaded as it exits: about 10 s, once);
    returns its path, or None if it could not be made (the JVMs then start
    without it)."""
    try:
        target = class_archive()
    except ImportError:  # no PySpark: the unit tier's environment
        return None
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=target.parent)) / target.name
    env = dict(os.environ, SPARK_SUBMIT_OPTS=f"{QUICK_START} -XX:ArchiveClassesAtExit={partial}")
    try:
        subprocess.run([sys.executable, "-c", _WARM_UP], env=env, capture_output=True,
                       timeout=timeout, check=True)
        if partial.exists():
            os.replace(partial, target)  # whole or not at all: JVMs may read it at once
            # This environment's older archives (made before a reinstall) fit no JVM now.
            for old in _ARCHIVES.glob(f"{_ENVIRONMENT}-*.jsa"):
                if old != target:
                    old.unlink(missing_ok=True)
    except (subprocess.SubprocessError, OSError):
        pass
    finally:
        shutil.rmtree(partial.parent, ignore_errors=True)
    return target if target.exists() else None


def _options() -> str:
    """QUICK_START, and the archive once it exists (a JVM told of a missing
    archive, or of one made with another class path, warns on its output)."""
    try:
        archive = class_archive()
    except ImportError:
        return QUICK_START
    return f"{QUICK_START} -XX:SharedArchiveFile={archive}" if archive.exists() else QUICK_START


def driver_env() -> dict[str, str]:
    """Environment for processes that start a Spark driver JVM through
    PySpark (spark-submit adds SPARK_SUBMIT_OPTS to the driver's options;
    ``local[N]`` executors live in that JVM)."""
    return {"SPARK_SUBMIT_OPTS": _options()}


def daemon_env() -> dict[str, str]:
    """Environment for a standalone master or worker started with
    ``spark-class``: JAVA_TOOL_OPTIONS reaches the daemon and the executors a
    worker forks (they inherit its environment), whatever options each
    application passes. The JVM notes the variable on its standard error,
    which goes to the daemon's and the executors' logs. Their class path is
    the drivers' (PySpark's conf and jars folders), so the archive fits."""
    return {"JAVA_TOOL_OPTIONS": _options()}
