"""Which kind of SparkSession the library was given, and the one way to its
SparkContext.

A classic session (``SparkSession.builder.master(...)``, a dedicated
Databricks cluster) runs the driver's JVM in this process and has a
``sparkContext``. A Spark Connect session (``SparkSession.builder.remote(...)``;
on Databricks: serverless notebooks and jobs, standard access mode, Databricks
Connect) is a client of a server elsewhere: it has no ``sparkContext``, no
RDDs, no broadcast variables, no ``addFile``; what it has is the DataFrame API
(``mapInArrow(..., barrier=True)`` for a barrier stage, since pyspark 3.5) and
the session's configuration through ``spark.conf``.

A step of the library that can run on both kinds reads the configuration
with `session_conf()`, groups its jobs with `session_jobs()`, runs a
probe with `call_in_task()`; a step that needs the SparkContext asks
`spark_context()` for it, which fails on a Connect session before any work
starts, naming the session kind, what needs the SparkContext and what to use
instead.
"""
from __future__ import annotations

import contextlib
import re
import sys

__all__ = ["ClassicSessionRequired", "is_connect", "spark_context", "session_conf",
           "session_master", "configured_slots", "connect_barrier_problem", "session_jobs",
           "default_parallelism", "call_in_task"]


class ClassicSessionRequired(RuntimeError):
    """A step that needs the classic SparkContext was given a Spark Connect session."""


def is_connect(spark) -> bool:
    """True where ``spark`` is a Spark Connect session (pyspark's own class)."""
    # A Connect session exists only once its module is imported: looked up,
    # never imported here. Importing it where the client's packages are
    # missing ends the process on pyspark 4.2 (pyspark.sql.connect.utils's
    # dependency check calls sys.exit when grpc is absent: Runtime 19 ML's
    # stack without TensorFlow, which brings grpcio elsewhere).
    module = sys.modules.get("pyspark.sql.connect.session")
    return module is not None and isinstance(spark, module.SparkSession)


def spark_context(spark, needs: str, use: str):
    """``spark``'s SparkContext, for ``needs`` (what needs it, as the user
    called it).

    Raises:
        ClassicSessionRequired: ``spark`` is a Spark Connect session, which has
            none; the message says to ``use`` instead.
    """
    if is_connect(spark):
        raise ClassicSessionRequired(
            f"{needs} needs the classic SparkContext, and this is a Spark Connect session "
            f"(SparkSession.builder.remote(...); on Databricks: serverless compute, standard "
            f"access mode, Databricks Connect), which has none. {use}")
    return spark.sparkContext


def session_conf(spark, key: str, default: str | None = None) -> str | None:
    """``key`` in ``spark``'s configuration, on either kind of session.

    A classic session reads its SparkContext's live SparkConf (``conf_value``,
    which also sees settings only the JVM holds); a Connect session asks the
    server through ``spark.conf``, which a session fills from the SparkConf
    it started with.
    """
    if is_connect(spark):
        return spark.conf.get(key, default)
    from dist_dl.core.sparkconf import conf_value

    return conf_value(spark.sparkContext, key, default)


def session_master(spark) -> str:
    """The session's master URL (``spark.master``), on either kind of session."""
    return session_conf(spark, "spark.master", "") or ""


_LOCAL = re.compile(r"local(?:\[(\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def configured_slots(spark) -> int | None:
    """The task slots a Connect session's configuration states, or None where
    it does not: ``local[N]``, ``local`` and ``local-cluster[n, c, m]``
    masters, or ``spark.executor.instances`` times ``spark.executor.cores``
    (both set, without dynamic allocation), each divided by ``spark.task.cpus``.

    A Connect client cannot ask the scheduler how many executors run now
    (what `dist_dl.core.session.task_slots()` asks on a classic session);
    where the configuration does not say, Spark's barrier mode makes the
    check itself when the stage starts.
    """
    master = session_master(spark).replace(" ", "")
    task_cpus = int(session_conf(spark, "spark.task.cpus", "1") or 1)
    local = _LOCAL.match(master)
    if local:
        return int(local.group(1) or 1) // task_cpus
    cluster = _LOCAL_CLUSTER.match(master)
    if cluster:
        return int(cluster.group(1)) * int(cluster.group(2)) // task_cpus
    if (session_conf(spark, "spark.dynamicAllocation.enabled", "false") or "").lower() == "true":
        return None
    instances = session_conf(spark, "spark.executor.instances")
    cores = session_conf(spark, "spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return int(instances) * int(cores) // task_cpus
    return None


def connect_barrier_problem() -> str | None:
    """Why a barrier stage cannot start from a Connect session here (pyspark
    before 3.5 has no ``mapInArrow(..., barrier=True)``), or None."""
    import pyspark

    version = tuple(int(p) for p in re.findall(r"\d+", pyspark.__version__)[:2])
    if version < (3, 5):
        return (f"a Spark barrier stage from a Spark Connect session needs pyspark 3.5 or later "
                f"(DataFrame.mapInArrow(..., barrier=True)), and this is pyspark "
                f"{pyspark.__version__}: upgrade pyspark (Databricks Runtime 15.4 LTS or later), "
                f"or use a classic session (a dedicated cluster)")
    return None


@contextlib.contextmanager
def session_jobs(spark, group: str, description: str):
    """Run the block's Spark jobs as one group on either kind of session:
    `dist_dl.core.session.job_group()` on a classic session; on a
    Connect session the group is an operation tag (``spark.addTag``), and
    the block's running operations are interrupted (``spark.interruptTag``)
    if it raises or is interrupted."""
    if not is_connect(spark):
        from dist_dl.core.session import job_group

        with job_group(spark.sparkContext, group, description) as name:
            yield name
        return
    spark.addTag(group)
    try:
        yield group
    except BaseException:
        spark.interruptTag(group)
        raise
    finally:
        spark.removeTag(group)


def default_parallelism(spark) -> int:
    """How many tasks the cluster runs at once, for sizing a job: the
    SparkContext's ``defaultParallelism`` on a classic session; on a
    Connect session what its configuration states (``spark.default.parallelism``,
    else `configured_slots()`), else 2."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    stated = session_conf(spark, "spark.default.parallelism")
    if stated and stated.isdigit():
        return int(stated)
    return configured_slots(spark) or 2


def call_in_task(spark, fn, *args):
    """``fn(*args)`` computed in one Spark task, on either kind of session
    (``fn``, its arguments and its result picklable).

    ``fn`` and its arguments are pickled here by cloudpickle (not by
    pyspark's copy of it, which pickles the task), on both kinds of session:
    what the caller registered by value (``cloudpickle.register_pickle_by_value``)
    travels by value.
    """
    import cloudpickle

    call = cloudpickle.dumps((fn, args))
    if not is_connect(spark):
        return spark.sparkContext.parallelize([call], 1).map(_call).collect()[0]

    def task(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays(
            [pa.array([cloudpickle.dumps(_call(call))], pa.binary())], names=["result"])

    (row,) = spark.range(0, 1, 1, 1).mapInArrow(task, "result binary").collect()
    return cloudpickle.loads(row.result)


def _call(call: bytes):
    """In the task: the result of the function and arguments pickled in ``call``."""
    import cloudpickle

    function, arguments = cloudpickle.loads(call)
    return function(*arguments)
