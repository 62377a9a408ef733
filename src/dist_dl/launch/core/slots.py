"""Driver-side checks made before Spark tasks start: enough task slots
(`check_slots()`, `wait_for_free_slots()`), and what the drop-in
runners (``MirroredStrategyRunner``, ``TorchDistributor``) check besides:
TLS, Spark's GPU scheduling, the driver's own GPUs."""
from __future__ import annotations

import os
import time
import warnings

from dist_dl.core.session import task_slots
from dist_dl.core.sessionkind import configured_slots, is_connect, session_conf, session_master
from dist_dl.launch.core.errors import JobTimeout, NotEnoughSlots

__all__ = ["SSL_KEY", "check_slots", "check_connect_slots", "wait_for_free_slots", "check_encryption", "conf_bool",
           "task_gpu_amount", "driver_gpus", "split", "check_task_slots", "LazySpark"]

SSL_KEY = "spark.ssl.enabled"


def check_slots(spark, num_proc: int, wait: float, runner: str = "HorovodRunner",
                every: float | None = None, label: str | None = None) -> int:
    """Wait up to ``wait`` seconds for ``num_proc`` task slots; return the count.

    Horovod on Spark needs all its tasks running at once; with fewer slots its
    tasks would wait for each other until ``start_timeout`` (10 minutes by
    default). This fails within seconds instead. With ``every``, a line of
    progress is printed that often while it waits. ``label`` names the runner
    in the messages as its user wrote it (default ``runner(np=num_proc)``).
    """
    label = label or f"{runner}(np={num_proc})"
    # --- Spark Connect sessions: the slots their configuration states.
    if is_connect(spark):
        return check_connect_slots(spark, num_proc, label) or num_proc
    # --- end Spark Connect
    start = time.monotonic()
    reported = None
    while True:
        slots = task_slots(spark)
        if slots >= num_proc:
            if reported is not None:
                print(f"{label}: {slots} task slots after "
                      f"{time.monotonic() - start:.0f} s, starting", flush=True)
            return slots
        waited = time.monotonic() - start
        master = spark.sparkContext.master
        if waited >= wait:
            raise NotEnoughSlots(
                f"{label} needs {num_proc} Spark tasks running at the same "
                f"time, but the cluster ({master}) has {slots} task slot(s) now "
                f"(executor cores / spark.task.cpus; waited {waited:.0f} s). Use np <= {slots}, "
                f"add workers or cores, or run on the driver machine with np=-{num_proc}.")
        if every is not None and (reported is None or time.monotonic() - reported >= every):
            print(f"{label}: waiting for {num_proc} task slots, the cluster "
                  f"({master}) has {slots} (waited {waited:.0f} s of {wait:g})", flush=True)
            reported = time.monotonic()
        time.sleep(0.5)


def check_connect_slots(spark, num_proc: int, label: str) -> int | None:
    """The task slots of a Connect session's cluster where its configuration
    states them (None where it does not: Spark's barrier mode checks when the
    stage starts).

    Raises:
        NotEnoughSlots: fewer than ``num_proc``.
    """
    slots = configured_slots(spark)
    if slots is not None and slots < num_proc:
        raise NotEnoughSlots(
            f"{label} needs {num_proc} Spark tasks running at the same time, and this Spark "
            f"Connect session's cluster ({session_master(spark)}) has {slots} task slot(s) "
            f"(executor cores / spark.task.cpus): use fewer processes, or add workers or cores.")
    return slots


def _busy_slots(sc) -> int:
    tracker = sc.statusTracker()
    stages = (tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds())
    return sum(stage.numActiveTasks for stage in stages if stage is not None)


def wait_for_free_slots(spark, num_proc: int, slots: int, timeout: float | None = None,
                        every: float = 10.0) -> None:
    """Wait until ``num_proc`` of the cluster's ``slots`` are free, printing
    a progress line every ``every`` seconds, as Databricks' HorovodRunner
    does: started while other jobs hold slots, only some of Horovod's tasks
    would run and the rest would fail on its start timeout.

    Raises:
        JobTimeout: still not enough free slots after ``timeout`` seconds.
    """
    start = time.monotonic()
    reported = None
    while True:
        free = slots - _busy_slots(spark.sparkContext)
        if free >= num_proc:
            if reported is not None:
                print(f"HorovodRunner(np={num_proc}): {free} task slots free, starting", flush=True)
            return
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            raise JobTimeout(
                f"HorovodRunner(np={num_proc}) waited {waited:.0f} s (its timeout) for {num_proc} "
                f"free task slots; other Spark jobs still hold {slots - free} of {slots}")
        if reported is None or time.monotonic() - reported >= every:
            print(f"HorovodRunner(np={num_proc}): waiting for {num_proc} free task slots: "
                  f"{max(free, 0)} of {slots} free, other Spark jobs run on the rest "
                  f"(waited {waited:.0f} s)", flush=True)
            reported = time.monotonic()
        time.sleep(0.5)


class LazySpark:
    """A runner's SparkSession: the one it was given (``self._session``),
    else the active or a new one, started on first use."""

    _session = None

    def _spark_session(self):
        if self._session is None:
            from dist_dl.core.session import get_spark

            self._session = get_spark()
        return self._session

    @property
    def sc(self):
        """The SparkContext the runner uses (started on first use); a Spark
        Connect session has none (``spark_context`` says so)."""
        from dist_dl.core.sessionkind import spark_context

        return spark_context(self._spark_session(), type(self).__name__,
                             "Use its SparkSession instead.")


def conf_bool(spark, key: str) -> bool:
    """The Spark configuration ``key`` as a boolean ('true' or 'false'; unset: false)."""
    value = (session_conf(spark, key, "false") or "false").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"the Spark configuration {key} must be 'true' or 'false', got {value!r}")
    return value == "true"


def check_encryption(spark, label: str, ignore_key: str, traffic: str) -> None:
    """Refuse a cluster that encrypts Spark's traffic (``spark.ssl.enabled``),
    since the workers' ``traffic`` (the engine's collectives) is not
    encrypted, unless ``ignore_key`` is true; then warn.

    Raises:
        RuntimeError: TLS is on and ``ignore_key`` is not true.
    """
    if not conf_bool(spark, SSL_KEY):
        return
    if conf_bool(spark, ignore_key):
        warnings.warn(
            f"{label}: this cluster has TLS encryption on ({SSL_KEY}=true), and the workers' "
            f"{traffic} traffic (gradients, model parameters) is not encrypted; running anyway "
            f"because {ignore_key}=true", stacklevel=4)
        return
    raise RuntimeError(
        f"{label}: this cluster has TLS encryption on ({SSL_KEY}=true), and the workers' "
        f"{traffic} traffic (gradients, model parameters, possibly training data) would cross "
        f"the network unencrypted. To run anyway, set {ignore_key} to true in the Spark "
        f"configuration.")


def task_gpu_amount(spark, resource: str, label: str) -> int:
    """``spark.task.resource.<resource>.amount``: the whole GPUs each Spark task gets.

    Raises:
        ValueError: it is unset, or not a positive integer.
    """
    key = f"spark.task.resource.{resource}.amount"
    value = session_conf(spark, key)
    if value is None:
        raise ValueError(
            f"{label}: GPU training (use_gpu=True, the default) needs Spark's GPU scheduling, "
            f"and {key} is unset in the Spark configuration. On a GPU cluster set {key} (with "
            f"spark.executor.resource.{resource}.amount and its discovery script); to train on "
            f"CPU, pass use_gpu=False.")
    try:
        amount = float(value)
    except ValueError:
        raise ValueError(f"{label}: {key} is {value!r}, not a number") from None
    if amount < 1 or amount != int(amount):
        raise ValueError(
            f"{label}: {key} is {value}; GPU training needs whole GPUs per task (1 or more): "
            f"set {key} to a positive integer")
    return int(amount)


def driver_gpus(session, resource: str) -> list[str]:
    """The driver's GPUs: its Spark resource ``resource`` where GPU scheduling
    names one (as CUDA_VISIBLE_DEVICES names them), else those visible to it.
    ``session``: the runner's SparkSession, None for the active one if any."""
    from dist_dl.launch.core.device import visible_gpus

    if session is None:
        try:
            from pyspark.sql import SparkSession
        except ImportError:  # no Spark here: the visible GPUs
            return visible_gpus()
        session = SparkSession.getActiveSession()
    found = None
    if session is not None and not is_connect(session):
        # A Connect client's own GPUs are the visible ones (as pyspark's
        # TorchDistributor takes them): the server's resources are not its.
        found = session.sparkContext.resources.get(resource)
    if found is None:
        return visible_gpus()
    addresses = list(found.addresses)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        names = visible.split(",")
        addresses = [names[int(a)] for a in addresses]
    return addresses


def split(total: int, parts: int) -> list[int]:
    """``total`` GPUs (or processes) over ``parts`` tasks, the first ones taking one more."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def check_task_slots(spark, tasks: int, label: str, *, count: str, per_task: int, unit: str,
                     on_driver: str, wait: float = 10.0) -> None:
    """Fail within seconds where the cluster cannot run ``tasks`` Spark tasks
    at once, saying which ``count`` (the runner's argument) fits: the slots
    times ``per_task`` ``unit``, or ``on_driver`` (the same job on the driver).

    Raises:
        NotEnoughSlots: fewer task slots than ``tasks`` after ``wait`` seconds.
    """
    try:
        check_slots(spark, tasks, wait, label=label)
    except NotEnoughSlots:
        if is_connect(spark):
            raise  # its message names what the configuration states
        slots = task_slots(spark)
        raise NotEnoughSlots(
            f"{label} needs {tasks} Spark tasks running at the same time, and the cluster "
            f"({spark.sparkContext.master}) has {slots} task slot(s) now (executor cores / "
            f"spark.task.cpus; waited {wait:g} s): use {count} <= {slots * per_task} {unit}, "
            f"add workers, or train on the driver with {on_driver}.") from None
