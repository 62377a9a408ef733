"""``np > 0`` off Databricks: ``np`` Spark tasks form one Horovod job, through
Horovod's own Spark runner (``horovod.spark.run``, Gloo)."""
from __future__ import annotations

import codecs
import functools
import ipaddress
import re
import shutil
import socket
import threading
import time
from typing import Any, Callable

from dist_dl import compat
from dist_dl.launch.errors import JobTimeout, NotEnoughSlots, failure_from
from dist_dl.launch.protocol import DriverSink
from dist_dl.launch.worker import WorkerOptions, run_worker
from dist_dl.session import get_spark, task_slots
from dist_dl.sparkconf import conf_value
from dist_dl.stall import SparkStalled, StallWatch

__all__ = ["SparkBackend", "check_slots", "wait_for_free_slots", "cluster_nics"]

NICS_KEY = "spark.dist_dl.nics"

# One Horovod Spark job at a time per driver: the timeout backstop cancels
# "the" running job group, whose name Horovod derives from a counter.
_RUN_LOCK = threading.Lock()


def cluster_nics(spark) -> set[str] | None:
    """The network interfaces Horovod and Gloo use between Spark tasks.

    ``spark.dist_dl.nics`` (comma-separated names) if set; else, off a local
    master, the driver's interface that holds ``spark.driver.host`` (the one
    that routes to the cluster: cluster nodes share interface names, e.g.
    ``eth0``); else None (Horovod's own choice, fine on one machine).

    Horovod left to itself intersects the interfaces the tasks report, which
    on separate hosts is ``{"eth0", "lo"}``, then takes the first of that set
    for the driver's rendezvous address (``horovod.runner.util.network.
    get_driver_ip``) and for Gloo: with Python's randomised string hashing,
    half the driver processes pick ``lo``, so workers on other hosts are told
    to meet at 127.0.0.1 and abort (exit code 134).
    """
    sc = spark.sparkContext
    given = [n.strip() for n in (conf_value(sc, NICS_KEY, "") or "").split(",") if n.strip()]
    if given:
        return set(given)
    if sc.master.startswith("local"):
        return None
    host = conf_value(sc, "spark.driver.host", "") or ""
    try:
        address = socket.gethostbyname(host) if host else ""
    except OSError:
        return None
    if not address or ipaddress.ip_address(address).is_loopback:
        return None
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return {name}
    return None


def check_slots(spark, num_proc: int, wait: float, runner: str = "HorovodRunner") -> int:
    """Wait up to ``wait`` seconds for ``num_proc`` task slots; return the count.

    Horovod on Spark needs all its tasks running at once; with fewer slots its
    tasks would wait for each other until ``start_timeout`` (10 minutes by
    default). This fails within seconds instead.
    """
    deadline = time.monotonic() + wait
    while True:
        slots = task_slots(spark)
        if slots >= num_proc:
            return slots
        if time.monotonic() >= deadline:
            master = spark.sparkContext.master
            raise NotEnoughSlots(
                f"{runner}(np={num_proc}) needs {num_proc} Spark tasks running at the same "
                f"time, but the cluster ({master}) has {slots} task slot(s) now "
                f"(executor cores / spark.task.cpus). Use np <= {slots}, add workers or cores, "
                f"or run on the driver machine with np=-{num_proc}.")
        time.sleep(0.5)


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


class SparkBackend:
    """Runs workers as Spark tasks with ``horovod.spark.run``.

    Args:
        spark: SparkSession to run on (default: the active one, else local).
        slot_wait: Seconds to wait for enough task slots (executors may still
            be registering) before failing.
        start_timeout: Seconds Horovod waits for all tasks to start and register.
        grace: Seconds past the job's timeout before the driver cancels the
            Spark job of workers that did not stop themselves.
        nics: Network interfaces for Horovod and Gloo (default:
            :func:`cluster_nics`).
    """

    name = "spark"

    def __init__(self, spark=None, slot_wait: float = 10.0, start_timeout: float = 120.0,
                 grace: float = 15.0, nics: list[str] | None = None):
        self.spark = spark
        self.slot_wait = slot_wait
        self.start_timeout = start_timeout
        self.grace = grace
        self.nics = nics

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        import horovod.spark
        from horovod.spark.driver import job_id

        spark = self.spark or get_spark()
        slots = check_slots(spark, num_proc, self.slot_wait)
        wait_for_free_slots(spark, num_proc, slots, options.timeout)
        _allow_off_main_thread()
        _stream_output_live()
        worker_fn = functools.partial(run_worker, options, fn, kwargs)
        stream = sink.stream()
        with _RUN_LOCK:
            expired = threading.Event()
            backstop = None
            # Horovod names its job group after a counter it increments at
            # the start of run(): the group is the next number.
            group = f"horovod.spark.run.{job_id.JOB_ID + 1}"
            stall = StallWatch(spark.sparkContext, group, f"HorovodRunner(np={num_proc})")
            if options.timeout:

                def cancel():
                    expired.set()
                    spark.sparkContext.cancelJobGroup(group)

                backstop = threading.Timer(options.timeout + self.grace, cancel)
                backstop.daemon = True
                backstop.start()
            try:
                with stall:
                    results = horovod.spark.run(
                        worker_fn, num_proc=num_proc, start_timeout=int(self.start_timeout),
                        use_gloo=True, stdout=stream, stderr=stream, verbose=0,
                        env=compat.worker_env(),
                        nics=set(self.nics) if self.nics else cluster_nics(spark))
            except Exception as exc:
                sink.close()
                if stall.stalled:
                    raise SparkStalled(stall.message) from exc
                if "Timed out waiting for Spark tasks to start" in str(exc):
                    raise SparkStalled(
                        f"the {num_proc} Spark tasks of HorovodRunner(np={num_proc}) did not all "
                        f"start within start_timeout={self.start_timeout:g} s. "
                        + stall.describe()) from exc
                if expired.is_set() and sink.first("timeout") is None:
                    raise JobTimeout(
                        f"the job did not finish within its timeout of {options.timeout:g} s "
                        f"(+{self.grace:g} s grace); its Spark tasks were cancelled") from exc
                raise failure_from(sink, _first_failed(exc), options.timeout) from exc
            finally:
                if backstop is not None:
                    backstop.cancel()
        sink.close()
        return results[0]


def _first_failed(exc: Exception) -> tuple[int, int] | None:
    """Rank and exit code from Horovod's launcher message, if it has them."""
    text = str(exc)
    name = re.search(r"Process name: (\d+)", text)
    code = re.search(r"Exit code: (-?\d+)", text)
    if name and code:
        return int(name.group(1)), int(code.group(1))
    return None


class _LiveCopy:
    """Stands in for the ``shutil`` module inside Horovod's network code."""

    def __getattr__(self, name):
        return getattr(shutil, name)

    @staticmethod
    def copyfileobj(src, dst, length=0):
        raw = getattr(src, "stream", None)  # codecs.StreamReader over the socket
        if raw is None or not hasattr(raw, "read1"):
            return shutil.copyfileobj(src, dst, length) if length else shutil.copyfileobj(src, dst)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            chunk = raw.read1(65536)
            if not chunk:
                tail = decoder.decode(b"", final=True)
                if tail:
                    dst.write(tail)
                return None
            dst.write(decoder.decode(chunk))


def _stream_output_live() -> None:
    """Make worker output reach the driver as it is written.

    Horovod's driver-side client copies a task's output stream with
    ``shutil.copyfileobj(codecs.StreamReader(socket_file), stream)``
    (``horovod/runner/common/util/network.py``, ``BasicClient._send_one``):
    each read asks the buffered socket file for 64 KiB and blocks until that
    much has arrived, so a worker's lines (and its ``log_to_driver`` messages)
    reach the driver only in 64 KiB batches or when the worker exits. Measured
    here: a worker's error record arrived 20 s after it was written. The task
    side writes unbuffered, so only the driver side is changed: the copy
    forwards whatever bytes are available.
    """
    from horovod.runner.common.util import network

    if not isinstance(network.shutil, _LiveCopy):
        network.shutil = _LiveCopy()


def _allow_off_main_thread() -> None:
    """Let ``horovod.spark.run`` work from a thread other than the main one.

    Its Gloo launcher installs SIGINT/SIGTERM handlers
    (``horovod.runner.gloo_run.register_shutdown_event``), which Python allows
    only in the main thread: from any other thread (a notebook's execution
    thread, a web service, a pipeline's worker thread) it raises ValueError.
    Horovod is unmaintained (0.28.1 is its last release), so the function is
    wrapped here: off the main thread it returns an event without handlers.
    """
    from horovod.runner import gloo_run

    original = gloo_run.register_shutdown_event
    if getattr(original, "_dist_dl_wrapped", False):
        return

    def register_shutdown_event():
        if threading.current_thread() is threading.main_thread():
            return original()
        return threading.Event()

    register_shutdown_event._dist_dl_wrapped = True
    gloo_run.register_shutdown_event = register_shutdown_event
