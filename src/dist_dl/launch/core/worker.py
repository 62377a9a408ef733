"""What runs inside every worker process, around the user's function.

Shipped to workers by every backend (pickled into Horovod's Spark task, or
started as ``python -m dist_dl.launch.core._worker_main`` by the local backend). Before
the user's function runs it: fixes Horovod's environment, gives the worker its
device, CPU threads and (on CPU) a 5 ms Horovod cycle time, routes the
worker's output to the driver with its rank, and arms the deadline. If the
function raises, the error and its traceback go to the driver as a record
before the process exits non-zero.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from dist_dl.core import compat
from dist_dl.core import placement
from dist_dl.core.redact import redact_secrets
from dist_dl.launch.core import device, protocol, termination

__all__ = ["WorkerOptions", "run_worker", "log_to_driver"]

TIMEOUT_EXIT_CODE = 124
# sparkdl's log_to_driver cuts longer messages; so does ours, to stay a drop-in.
MAX_LOG_CHARS = 4000


@dataclass(frozen=True)
class WorkerOptions:
    """Per-job settings every worker receives.

    Attributes:
        job_id: Identifier of the launch (names temp files, shows in logs).
        timeout: Seconds the worker may run before it stops itself; None: no limit.
        threads_per_worker: CPU threads per worker; None shares the host's cores.
        pin_cpus: Pin each worker to its own cores.
        capture_output: Route output to the driver through the protocol. Off
            when another launcher (Databricks' HorovodRunner) carries the logs.
        env: Extra environment variables for the worker.
        engine: ``"horovod"``, ``"tensorflow"`` (tf.distribute) or
            ``"torch"``: which engine's settings the worker gets.
        runner: The runner as its user wrote it (``TFDistributeRunner(np=2)``),
            for the driver's messages; '' names the engine's runner.
        check_weights: Report the Keras models the function trained when it
            returns (``dist_dl.launch.core.weights``), for the driver to compare.
    """

    job_id: str
    timeout: float | None = None
    threads_per_worker: int | None = None
    pin_cpus: bool = False
    capture_output: bool = True
    env: dict = field(default_factory=dict)
    engine: str = "horovod"
    runner: str = ""
    check_weights: bool = False


_capture: "_OutputCapture | None" = None
_delegate_log: Callable[[str], None] | None = None


def log_to_driver(message: str) -> None:
    """Send ``message`` from a worker to the driver's output, whatever the
    runner's ``driver_log_verbosity``. Outside a worker, prints it. Only the
    first 4,000 characters are sent, as with Databricks' ``log_to_driver``."""
    message = str(message)[:MAX_LOG_CHARS]
    if _capture is not None:
        _capture.control(protocol.encode_control("log", _rank(), message=str(message)))
    elif _delegate_log is not None:
        _delegate_log(str(message))
    else:
        print(message, flush=True)


def _place() -> placement.Place:
    # Outside a launched job (a test, a direct call): the only worker.
    return placement.launcher_place(os.environ) or placement.Place(rank=0, local_rank=0, local_size=1)


def _rank() -> int:
    return _place().rank


class LoopbackHostname(RuntimeError):
    """A multi-host Gloo job on a host whose name resolves to loopback."""


def check_gloo_host_address(env) -> None:
    """Fail with the fix, not an abort, where Horovod's Gloo would bind to loopback.

    Horovod 0.28.1 builds the Gloo context of every process set, the global
    one included, with the process set's own interface name, which is never
    set (``horovod/common/gloo/gloo_context.cc``,
    ``GlooContext::InitializeForProcessSet``: ``device_attr.iface =
    gloo_iface_``, empty there), so ``HOROVOD_GLOO_IFACE`` is ignored and Gloo
    falls back to the address this host's name resolves to. Where that is a
    loopback address (Debian's ``127.0.1.1 <hostname>`` line, a container's
    ``127.0.0.1 <hostname>``), workers on other hosts are told to connect to
    127.x and every worker aborts in ``hvd.init()`` (exit code 134, no
    message). Horovod is unmaintained, so the job fails here, before
    ``hvd.init()``, naming the fix.

    Only for Gloo jobs that span hosts (``HOROVOD_CROSS_SIZE`` > 1);
    mpirun-started workers (Databricks' HorovodRunner) do not use Gloo.

    Raises:
        LoopbackHostname: the host name resolves to a loopback address.
    """
    if not env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return
    try:
        hosts = int(env.get("HOROVOD_CROSS_SIZE", "1"))
    except ValueError:
        return
    if hosts <= 1:
        return
    import ipaddress

    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return  # Gloo's own lookup fails with its own message
    if ipaddress.ip_address(address).is_loopback:
        raise LoopbackHostname(
            f"this host's name {name!r} resolves to {address}, a loopback address, and "
            f"Horovod 0.28.1 binds its process sets' connections to that address (ignoring "
            f"HOROVOD_GLOO_IFACE={env.get('HOROVOD_GLOO_IFACE')!r}), so the workers on the "
            f"{hosts} hosts of this job cannot connect to each other. Make {name!r} resolve "
            "to this host's cluster address on every worker host (its /etc/hosts line or "
            "DNS; replace a '127.0.1.1 <hostname>' line).")


def prepare_environment(options: WorkerOptions) -> device.DevicePlan:
    """Apply the Horovod fixes, the extra env, the CPU cycle-time default and
    the device plan to os.environ, and the Keras fixes
    (``compat.keras_worker_fixes``) to this process.

    Must run before TensorFlow is imported in this process: thread counts and
    visible GPUs are read once, when TensorFlow initialises (and the cycle
    time once, in ``hvd.init()``), and so is which Keras ``tf.keras`` is. The
    backends also start each worker process with ``compat.worker_env()``, for
    TensorFlow imported while the function is unpickled.
    """
    for name, value in compat.worker_env().items():
        os.environ.setdefault(name, value)
    os.environ.update(options.env)
    task_gpus = [g for g in os.environ.get(placement.TASK_GPUS_VAR, "").split(",") if g]
    gpus = task_gpus or device.visible_gpus()
    worker_gpus = os.environ.pop(device.WORKER_GPUS_VAR, None)
    if worker_gpus is not None:
        # The launcher chose this worker's GPUs, all of them its own ('' for
        # none: CPU training); the plan leaves the devices alone.
        os.environ["CUDA_VISIBLE_DEVICES"] = worker_gpus
        gpus = task_gpus = []
    if options.engine == "horovod":
        for name in device.horovod_env_fixes(os.environ):
            del os.environ[name]
        check_gloo_host_address(os.environ)
        # CPU workers: 5 ms unless the job or the environment set a cycle time
        # (the training worker raises it for large models, see device.py).
        device.default_cycle_time(os.environ, chosen="HOROVOD_CYCLE_TIME" in options.env,
                                  gpus=gpus)
    local_rank, local_size = placement.host_share(os.environ, _place())
    plan = device.plan_devices(local_rank, local_size, gpus=gpus,
                               cpu_count=len(os.sched_getaffinity(0)),
                               threads=options.threads_per_worker, pin_cpus=options.pin_cpus,
                               own_gpus=bool(task_gpus))
    for name, value in plan.env.items():
        # A value the user set explicitly for the job wins over the plan.
        if name not in options.env:
            os.environ[name] = value
    if plan.cpus:
        os.sched_setaffinity(0, plan.cpus)
    compat.keras_worker_fixes()
    return plan


def run_worker(options: WorkerOptions, fn: Callable[..., Any], kwargs: dict) -> Any:
    """Run ``fn(**kwargs)`` as one worker of a job; returns its result."""
    global _capture
    rank = _rank()
    # Children that exist already are not this job's: in-process delegation
    # (sparkdl's worker, a test) runs us inside a process that has its own
    # children, such as the Spark JVM of a driver, which must survive.
    preexisting = termination.child_pids()
    if options.capture_output:
        _capture = _OutputCapture(rank)
    try:
        prepare_environment(options)
        if _capture is not None:
            _capture.control(protocol.encode_control(
                "start", rank, pid=os.getpid(), host=socket.gethostname(), time=time.time()))
        deadline = _Deadline(options.timeout, rank, preexisting)
        try:
            result = fn(**kwargs)
            if options.check_weights and _capture is not None:
                _report_weights(rank)
            return result
        finally:
            deadline.cancel()
    except BaseException as exc:
        # Redacted here, with this worker's own environment (a cluster's
        # secrets may be set on the executors only): the record reaches the
        # driver's output, and from there MLflow tags.
        record = protocol.encode_control(
            "error", rank, type=type(exc).__name__, message=redact_secrets(str(exc)),
            traceback=redact_secrets("".join(traceback.format_exception(exc))))
        if _capture is not None:
            _capture.control(record)
        else:
            sys.stderr.write(record)
            sys.stderr.flush()
        raise
    finally:
        # Nothing a worker started may outlive it: Horovod's Spark task
        # service stops only the worker process itself when it exits on its
        # own, so a child (a data-loader pool, a subprocess) would be left
        # orphaned. Children that existed before the function started stay.
        termination.end_children(preexisting)
        if _capture is not None:
            _capture.close()
            _capture = None


def _report_weights(rank: int) -> None:
    """Send the driver the Keras models this worker trained (see
    ``dist_dl.launch.core.weights``); a report that fails is left out, and the
    driver then compares nothing."""
    from dist_dl.launch.core import weights

    try:
        models = weights.report()
    except Exception as exc:
        print(f"dist_dl: the weights of this worker's models could not be read for the "
              f"check against rank 0's ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    _capture.control(protocol.encode_control(weights.RECORD, rank, models=models))


class _Deadline:
    """Ends this worker when the job's timeout passes, so that a worker stuck
    in a collective or a loop never outlives the job (the driver has its own
    backstop too)."""

    def __init__(self, timeout: float | None, rank: int, keep: frozenset = frozenset()):
        self._timer = None
        if timeout:
            self._timer = threading.Timer(timeout, self._expire, args=(timeout, rank, keep))
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    @staticmethod
    def _expire(timeout: float, rank: int, keep: frozenset) -> None:
        record = protocol.encode_control("timeout", rank, seconds=timeout)
        if _capture is not None:
            _capture.control(record)
        else:
            sys.stderr.write(record)
            sys.stderr.flush()
        termination.end_children(keep, grace=1.0)
        if _capture is not None:
            _capture.close(join_timeout=2)
        os._exit(TIMEOUT_EXIT_CODE)


_REDRAW = re.compile(rb"\r(?![\r\n])")


class _OutputCapture:
    """Redirects this process's fds 1 and 2 (so output of C++ code and child
    processes is caught too) through pipes whose lines are prefixed with the
    rank and written to the original fds, which lead to the driver."""

    def __init__(self, rank: int):
        self._lock = threading.Lock()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._real = {1: os.dup(1), 2: os.dup(2)}
        self._threads = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(target=self._pump, name=f"dist_dl-{name}", daemon=True,
                                      args=(read_end, self._real[fd],
                                            protocol.line_prefix(rank, name).encode()))
            thread.start()
            self._threads.append(thread)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(line_buffering=True)
            except (AttributeError, ValueError):
                pass
        self._closed = False

    def _pump(self, read_end: int, out_fd: int, prefix: bytes) -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not line.endswith(b"\n"):
                    line += b"\n"
                # A progress bar redraws its line after each carriage return:
                # every redraw gets the prefix, or it would overwrite it.
                self._write(out_fd, prefix + _REDRAW.sub(b"\r" + prefix, line))

    def _write(self, fd: int, data: bytes) -> None:
        with self._lock:
            view = memoryview(data)
            while view:
                try:
                    written = os.write(fd, view)
                except OSError:
                    return  # the driver went away; nothing left to tell
                view = view[written:]

    def control(self, line: str) -> None:
        self._write(self._real[2], line.encode())

    def close(self, join_timeout: float = 10) -> None:
        if self._closed:
            return
        self._closed = True
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        # Point fds 1 and 2 back at the originals: that closes the pipes' last
        # write ends (unless a child process still holds them), so the pumps
        # drain and stop.
        for fd, real in self._real.items():
            os.dup2(real, fd)
        for thread in self._threads:
            thread.join(join_timeout)


def main(argv: list[str]) -> int:
    """Entry point of a worker process started by the local backend:
    ``python -m dist_dl.launch.core._worker_main PAYLOAD RESULT``."""
    import cloudpickle

    payload_path, result_path = argv
    folder = folder_of_payload(payload_path)
    if folder is not None:
        # The launcher's folder of this job, removed with the job however it
        # ends: where the worker's own scratch files belong (`job_folder()`).
        os.environ[JOB_FOLDER_VAR] = folder
    _watch_parent(folder)
    take_launcher_imports()
    with open(payload_path, "rb") as f:
        options, fn, kwargs = cloudpickle.load(f)
    try:
        result = run_worker(options, fn, kwargs)
    except BaseException:  # reported to the driver by run_worker
        return 1
    if _rank() == 0:
        tmp = result_path + ".tmp"
        with open(tmp, "wb") as f:
            cloudpickle.dump(result, f)
        os.replace(tmp, result_path)
    return 0


# Set by the process that starts a worker: JSON list of that process's
# sys.path, so that what it imports (modules PySpark put there from
# sc.addPyFile or spark.submit.pyFiles, a notebook's folder) imports here.
SYS_PATH_VAR = "DIST_DL_SYS_PATH"
# Set by a Spark barrier task that starts a worker: a file holding the task's
# BarrierTaskContext (see dist_dl.launch.core.rendezvous).
TASK_CONTEXT_VAR = "DIST_DL_TASK_CONTEXT"
# Set by a worker for itself (and what it starts): its job's folder (`job_folder()`).
JOB_FOLDER_VAR = "DIST_DL_JOB_FOLDER"


def launcher_path_env() -> dict[str, str]:
    """The variable that gives a worker this process's ``sys.path``."""
    import json

    return {SYS_PATH_VAR: json.dumps([p for p in sys.path if p])}


def take_launcher_imports() -> None:
    """Before the payload is unpickled: the starting process's ``sys.path``
    entries this process lacks, in that process's order ahead of this one's
    own (PySpark puts shipped files first too), and its barrier task context."""
    import json

    try:
        theirs = json.loads(os.environ.pop(SYS_PATH_VAR, "[]"))
    except ValueError:
        theirs = []
    if theirs:
        ours = [p for p in sys.path[1:] if p not in theirs]
        sys.path[1:] = [p for p in theirs if p != sys.path[0]] + ours
    context_file = os.environ.pop(TASK_CONTEXT_VAR, None)
    if context_file:
        restore_task_context(context_file)


def restore_task_context(path: str) -> None:
    """In a worker started by a barrier task: make ``BarrierTaskContext.get()``
    (and ``TaskContext.get()``) return that task's context, whose
    ``barrier()`` and ``allGather()`` go to the task's barrier server."""
    import cloudpickle
    from pyspark import BarrierTaskContext, TaskContext

    with open(path, "rb") as f:
        fields, address, secret = cloudpickle.load(f)
    ctx = BarrierTaskContext._getOrCreate()
    vars(ctx).update(fields)
    BarrierTaskContext._initialize(address, secret)
    TaskContext._taskContext = ctx


def folder_of_payload(payload_path: str) -> str | None:
    """The job folder a launcher of this library made for a worker's payload
    (a ``tempfile.mkdtemp(prefix="dist_dl-...")``), or None where the payload
    is elsewhere (nothing to remove then)."""
    folder = os.path.dirname(os.path.abspath(payload_path))
    return folder if os.path.basename(folder).startswith("dist_dl-") else None


def job_folder() -> str | None:
    """In a worker of a launcher of this library: the job's folder on this
    host (its payload's), which the launcher removes when the job ends, also
    when its task or driver was killed; None elsewhere. Scratch files that a
    worker killed mid-write would leave behind belong there."""
    folder = os.environ.get(JOB_FOLDER_VAR)
    return folder if folder and os.path.isdir(folder) else None


def _watch_parent(workdir: str | None, every: float = 0.5) -> None:
    """End this worker, and what it started, when the process that started it
    is gone: a Spark task killed on cancellation (PySpark's daemon kills the
    Python worker with SIGKILL) or a driver killed outright cannot stop its
    workers itself, and they run in process groups of their own. The job's
    folder of that process (``workdir``: the payload's, a
    ``tempfile.mkdtemp`` of the launcher's), which it can no longer remove,
    goes too: nobody reads the result any more."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        termination.end_children(grace=1.0)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        os._exit(TIMEOUT_EXIT_CODE + 1)

    threading.Thread(target=watch, daemon=True, name="dist_dl-parent-watch").start()
