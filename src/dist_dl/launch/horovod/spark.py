"""``np > 0`` off Databricks: ``np`` Spark tasks form one Horovod job, through
Horovod's own Spark runner (``horovod.spark.run``, Gloo)."""
from __future__ import annotations

import codecs
import functools
import re
import shutil
import os
import signal
import socket
import sys
import threading
from typing import Any, Callable

from dist_dl.core import compat
from dist_dl.core.session import get_spark
from dist_dl.core.sessionkind import spark_context
from dist_dl.core.sparkconf import conf_value
from dist_dl.core.stall import SparkStalled, StallWatch
from dist_dl.launch.fork import client as forkserver
from dist_dl.launch.core.network import interface_holding, is_loopback, resolve
from dist_dl.launch.core.errors import (JobCancelled, JobTimeout, cancelled_from_outside,
                                        failure_from, runner_prefix)
from dist_dl.launch.core.protocol import DriverSink
from dist_dl.launch.core.slots import check_slots, wait_for_free_slots
from dist_dl.launch.core.worker import WorkerOptions, launcher_path_env, run_worker

__all__ = ["SparkBackend", "cluster_nics", "DEAD_PEER_SECONDS"]

NICS_KEY = "spark.dist_dl.nics"

# One Horovod Spark job at a time per driver: the timeout backstop cancels
# "the" running job group, whose name Horovod derives from a counter.
_RUN_LOCK = threading.Lock()
# Why the running job's Spark job failed (the exception its Spark thread saw),
# and whether Horovod's launch had failed before (then Horovod cancelled the
# job itself), recorded by _record_spark_failures; one job at a time (_RUN_LOCK).
_SPARK_FAILURE: list[tuple[BaseException, bool]] = []
_LAUNCH_FAILED = threading.Event()


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
    address = resolve(host) if host else None
    if not address or is_loopback(address):
        return None
    name = interface_holding(address)
    return None if name is None else {name}


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
            `cluster_nics()`).
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
        spark = self.spark or get_spark()
        # --- Spark Connect sessions: Horovod's Spark runner needs RDDs.
        spark_context(spark, f"HorovodRunner(np={num_proc}) (Horovod's Spark runner, RDDs)",
                      "Run the function with TFDistributeRunner (tf.distribute) or "
                      "TorchDistributor (torch.distributed), which run on Connect sessions, or "
                      "on a classic session (a dedicated cluster).")
        # --- end Spark Connect
        import horovod.spark
        from horovod.spark.driver import job_id

        slots = check_slots(spark, num_proc, self.slot_wait)
        wait_for_free_slots(spark, num_proc, slots, options.timeout)
        _patch_shutdown_event()
        _stream_output_live()
        _workers_exit_without_final_collection()
        _wrap_horovod_tasks()
        _detect_dead_task_services()
        _record_spark_failures()
        worker_fn = functools.partial(run_worker, options, fn, kwargs)
        stream = sink.stream()
        with _RUN_LOCK:
            _SPARK_FAILURE.clear()
            _LAUNCH_FAILED.clear()
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
            signals = _RunSignals()
            _SIGNALS.append(signals)
            try:
                with stall:
                    results = horovod.spark.run(
                        worker_fn, num_proc=num_proc, start_timeout=int(self.start_timeout),
                        use_gloo=True, stdout=stream, stderr=stream, verbose=0,
                        env={**compat.worker_env(), **forkserver.driver_switch()},
                        nics=set(self.nics) if self.nics else cluster_nics(spark))
            except Exception as exc:
                sink.close()
                signals.restore()
                if signals.received is not None:
                    # Ctrl-C (or SIGTERM) stopped the workers: that is the error.
                    try:
                        signals.deliver()
                    except KeyboardInterrupt as interrupt:
                        raise interrupt from exc
                if stall.stalled:
                    raise SparkStalled(stall.message) from exc
                if "Timed out waiting for Spark tasks to start" in str(exc):
                    raise SparkStalled(
                        f"the {num_proc} Spark tasks of HorovodRunner(np={num_proc}) did not all "
                        f"start within start_timeout={self.start_timeout:g} s. "
                        + stall.describe()) from exc
                spark_failure, after_launch = (_SPARK_FAILURE[0] if _SPARK_FAILURE
                                               else (None, True))
                cancelled = cancelled_from_outside(str(spark_failure), group)
                if not expired.is_set() and not after_launch and cancelled is not None:
                    raise JobCancelled(
                        f"the Spark job of HorovodRunner(np={num_proc}) was cancelled from "
                        f"outside ({cancelled[0]}); its workers were stopped") from exc
                if expired.is_set() and sink.first("timeout") is None:
                    raise JobTimeout(
                        f"{runner_prefix(options.runner)}the job did not finish within its "
                        f"timeout of {options.timeout:g} s (+{self.grace:g} s grace); its Spark "
                        "tasks were cancelled") from exc
                raise failure_from(sink, _first_failed(exc), options.timeout,
                                   options.runner) from exc
            finally:
                if backstop is not None:
                    backstop.cancel()
                signals.restore()
                _SIGNALS.remove(signals)
        sink.close()
        signals.deliver()
        return results[0]


def _record_spark_failures() -> None:
    """Keep the exception that failed a Horovod job's Spark job.

    ``horovod.spark.run`` runs its Spark job in a thread of its own; when that
    job fails, the thread calls ``SparkDriverService.notify_spark_job_failed``
    inside its ``except`` block and re-raises into nowhere (the thread ends),
    and ``run`` raises only "Spark job has failed, see the error above". The
    exception is read here, in that call, so the driver can tell a
    cancellation from a failure. When Horovod's launch fails first (a
    worker's error, a timeout, Ctrl-C), ``run`` cancels its own Spark job:
    that cancellation is a consequence, told apart by the order (the launch
    is wrapped to note its failure).
    """
    from horovod.spark import runner
    from horovod.spark.driver.driver_service import SparkDriverService

    original = SparkDriverService.notify_spark_job_failed
    if getattr(original, "_dist_dl_wrapped", False):
        return

    def notify_spark_job_failed(self):
        exc = sys.exc_info()[1]
        if exc is not None and not _SPARK_FAILURE:
            _SPARK_FAILURE.append((exc, _LAUNCH_FAILED.is_set()))
        return original(self)

    launch = runner._launch_job

    def _launch_job(*args, **kwargs):
        try:
            return launch(*args, **kwargs)
        except BaseException:
            _LAUNCH_FAILED.set()
            raise

    notify_spark_job_failed._dist_dl_wrapped = True
    SparkDriverService.notify_spark_job_failed = notify_spark_job_failed
    runner._launch_job = _launch_job


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
    reach the driver only in 64 KiB batches or when the worker exits (a
    worker's error record can arrive tens of seconds after it is written). The task
    side writes unbuffered, so only the driver side is changed: the copy
    forwards whatever bytes are available.
    """
    from horovod.runner.common.util import network

    if not isinstance(network.shutil, _LiveCopy):
        network.shutil = _LiveCopy()


# What Horovod's Spark launcher runs in each task's worker process, and ours.
_HOROVOD_ENTRY = "horovod.spark.task.gloo_exec_fn"
_WORKER_ENTRY = "dist_dl.launch.horovod._spark_worker_main"


def _workers_exit_without_final_collection() -> None:
    """Each worker process on a Spark task ends as a local worker does
    (`dist_dl.launch.core._worker_main`): exit handlers, flushed streams,
    then ``os._exit``, without the interpreter's last garbage collection.

    Horovod starts them as ``python -m horovod.spark.task.gloo_exec_fn ...``,
    which returns from ``main`` into a normal interpreter exit. That last
    collection can destroy a tf.data iterator whose map thread is inside
    Petastorm's Python generator and needs the GIL the destructor holds
    (tensorflow/tensorflow#22632): the worker hangs after its result is sent,
    and Horovod's driver waits for its exit code for ever, its threads in
    ``wait_for_command_exit_code`` for that rank (tests/test_reliability.py,
    F5, on the cluster of separate hosts). The command is rewritten to run
    our entry module, which
    calls Horovod's ``main`` with the same arguments."""
    from horovod.spark import gloo_run as spark_gloo_run

    launch = spark_gloo_run.launch_gloo
    if getattr(launch, "_dist_dl_wrapped", False):
        return

    def launch_gloo(command, *args, **kwargs):
        command = tuple(_WORKER_ENTRY if part == _HOROVOD_ENTRY else part for part in command)
        return launch(command, *args, **kwargs)

    launch_gloo._dist_dl_wrapped = True
    spark_gloo_run.launch_gloo = launch_gloo


def _wrap_horovod_tasks() -> None:
    """Each Spark task of a Horovod job runs a prologue before Horovod's task
    function (``horovod.spark.runner._make_mapper``'s mapper, wrapped here
    once per process):

    - the task's input read through: Horovod's mapper ignores it (a number
      per task), and PySpark does not return a Python worker to its pool
      when input is left unread after the task's function (pyspark/worker.py,
      "check end of stream"), so every Horovod job started new Python
      workers;
    - `dist_dl.launch.horovod.termination.prompt_termination()`: the task ends
      its worker processes promptly when the job is aborted or the task
      killed (Horovod's own sequence waits out 5 s it can never use);
    - `dist_dl.launch.horovod.sparkfork.install()`: the worker processes are
      forked from the executor's fork server, which imports the frameworks
      the driver had imported when the job started;
    - the task's ``sys.path`` into its environment
      (`dist_dl.launch.core.worker.launcher_path_env()`), which the worker
      takes before it unpickles the user's function
      (`dist_dl.launch.horovod._spark_worker_main`): modules PySpark put on the
      task's path (``sc.addPyFile``, ``spark.submit.pyFiles``) import in the
      workers as in the task. Horovod's task service starts the worker with a
      copy of the task's environment, and PySpark adds shipped files to the
      task's ``sys.path`` only."""
    from horovod.spark import runner

    from dist_dl.launch.horovod import sparkfork
    from dist_dl.launch.horovod.termination import prompt_termination

    make_mapper = runner._make_mapper
    if getattr(make_mapper, "_dist_dl_wrapped", False):
        return

    def _make_mapper(*args, **kwargs):
        mapper = make_mapper(*args, **kwargs)
        frameworks = forkserver.imported_frameworks()

        def task(index, rows):
            for _ in rows:
                pass
            prompt_termination()
            sparkfork.install(frameworks)
            os.environ.update(launcher_path_env())
            return mapper(index, rows)

        return task

    _make_mapper._dist_dl_wrapped = True
    runner._make_mapper = _make_mapper


# Keepalive of the driver's connections to the tasks' services: the first
# probe after 10 s without traffic, then every 5 s; 3 unanswered end it.
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
# Keepalive probes are sent only while nothing is in flight: data sent and not
# acknowledged (a request written just before the peer's host dropped off the
# network) is retransmitted for about 15 minutes before Linux gives up
# (tcp_retries2), and a connect() to such a host retries its SYN for about
# 2 minutes (tcp_syn_retries). TCP_USER_TIMEOUT (tcp(7)) bounds the first, a
# timeout on connect() the second, to what keepalive allows an idle connection.
DEAD_PEER_SECONDS = KEEPALIVE["TCP_KEEPIDLE"] + KEEPALIVE["TCP_KEEPINTVL"] * KEEPALIVE["TCP_KEEPCNT"]


class _BoundedSocket(socket.socket):
    """A TCP socket whose connect() gives up on a host that does not answer
    within `DEAD_PEER_SECONDS`; once connected it blocks as before
    (a wait for a worker's exit code may rightly last hours)."""

    def connect(self, address):
        previous = self.gettimeout()
        self.settimeout(DEAD_PEER_SECONDS)
        try:
            super().connect(address)
        finally:
            self.settimeout(previous)


class _KeepAliveSockets:
    """Stands in for the ``socket`` module inside Horovod's network code:
    its TCP sockets are made with keepalive on (`KEEPALIVE`), unacknowledged
    data bounded by TCP_USER_TIMEOUT and connect() by a timeout
    (`DEAD_PEER_SECONDS`)."""

    def __getattr__(self, name):
        return getattr(socket, name)

    @staticmethod
    def socket(family=socket.AF_INET, type=socket.SOCK_STREAM, *args, **kwargs):
        if type != socket.SOCK_STREAM:
            return socket.socket(family, type, *args, **kwargs)
        sock = _BoundedSocket(family, type, *args, **kwargs)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in KEEPALIVE.items():
            if hasattr(socket, name):   # Linux; macOS lacks some
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        if hasattr(socket, "TCP_USER_TIMEOUT"):   # Linux
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            DEAD_PEER_SECONDS * 1000)
        return sock


def _detect_dead_task_services() -> None:
    """A task whose host drops off the network ends the job, not hangs it.

    For every worker, Horovod's driver holds one connection to the task
    service in its Spark task and waits on it for the worker's exit code
    (``BasicTaskClient.wait_for_command_exit_code``, a request the service
    answers when the command ends), with no timeout, and it opens a new
    connection for every other request (``BasicClient._send_one``: abort,
    command status), with no connect timeout. When a host is cut off the
    network, the end of the waiting connection never arrives, and a request
    opened or written to that host meanwhile waits on TCP's retransmissions
    (minutes). The sockets of Horovod's network module get keepalive,
    TCP_USER_TIMEOUT and a connect timeout (`_KeepAliveSockets`): each
    of these ends within `DEAD_PEER_SECONDS` of the host going silent,
    Horovod then sees a failed worker, and the launch fails as for any other.
    Horovod 0.28.1 (its last release) sets no socket options there, so its
    module's ``socket`` is replaced, as ``shutil`` is above; the task
    services' listening sockets are made elsewhere (``socketserver``) and are
    not touched."""
    from horovod.runner.common.util import network

    if not isinstance(network.socket, _KeepAliveSockets):
        network.socket = _KeepAliveSockets()


class _RunSignals:
    """Ctrl-C and SIGTERM during one ``horovod.spark.run`` on the main thread.

    Horovod's Gloo launcher (``horovod.runner.gloo_run.register_shutdown_event``)
    replaces the process's SIGINT and SIGTERM handlers with one that sets an
    event (on which it stops its workers) and never puts the old ones back:
    after one Horovod job, Ctrl-C no longer interrupts the user's program (a
    notebook's interrupt button included) and SIGTERM no longer ends it, and
    Ctrl-C during the job surfaces as some other error, or as none. Here the
    handlers set Horovod's event and remember the signal; after the job they
    are restored, and the signal is delivered as it was meant: SIGINT as
    KeyboardInterrupt, SIGTERM to the restored handler.
    """

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def install(self) -> threading.Event:
        event = threading.Event()

        def handler(signum, frame):
            if self.received is None:
                self.received = signum
            event.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, handler)
        return event

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def deliver(self) -> None:
        """After `restore()`: act on the signal received, if any."""
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is not None:
            os.kill(os.getpid(), self.received)


# The running job's signals (one job at a time: _RUN_LOCK).
_SIGNALS: list[_RunSignals] = []


def _patch_shutdown_event() -> None:
    """Horovod's ``register_shutdown_event``, made safe.

    Off the main thread it raised ValueError (Python allows signal handlers
    only there), so ``horovod.spark.run`` failed from a notebook's execution
    thread, a web service or a pipeline's worker thread: there it returns an
    event without handlers. On the main thread during a job of this module,
    the handlers are `_RunSignals`'s. Horovod is unmaintained (0.28.1 is
    its last release), so the function is wrapped here.
    """
    from horovod.runner import gloo_run

    original = gloo_run.register_shutdown_event
    if getattr(original, "_dist_dl_wrapped", False):
        return

    def register_shutdown_event():
        if threading.current_thread() is not threading.main_thread():
            return threading.Event()
        if _SIGNALS:
            return _SIGNALS[-1].install()
        return original()

    register_shutdown_event._dist_dl_wrapped = True
    gloo_run.register_shutdown_event = register_shutdown_event
