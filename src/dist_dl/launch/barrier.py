"""Workers that meet at addresses they pick themselves, as processes on the
driver or as the tasks of one Spark barrier stage: the part of the
tf.distribute engine (``tfdist.py``) and the torch engine (``torchdist.py``)
that does not depend on the engine. An :class:`Engine` says what differs: the
environment that places each worker in its job (``TF_CONFIG``; torchrun's
``MASTER_ADDR``, ``RANK``, ...), and how many worker processes each place
holds.

Ports. Each place (a Spark task, or the driver for local workers) picks one
port below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
where no ``bind(port 0)`` and no outgoing connection of another program is
ever given one, after checking that it is free; the engine's server binds it
itself (TensorFlow's gRPC server, torch's TCPStore), and a port cannot stay
reserved until then (TensorFlow's server binds without ``SO_REUSEPORT``:
a reserving socket held open makes it fail with "Could not start gRPC
server"). A collision needs another program to bind that very port
explicitly in the seconds before the worker starts. On Spark, tasks sharing
a host pick independently, so the gathered list is checked for duplicates
and picked again until every address is distinct.

Spark. The tasks of a barrier stage start together; each takes its host from
``BarrierTaskContext.getTaskInfos()`` (the executor's cluster address), picks
a port there and ``allGather``s ``host:port``, so every task sees the same
list of places. Each task runs its workers as child processes (one runtime
per job: a reused PySpark worker process could not host a second one) and
sends their output to a small TCP server on the driver (at
``spark.driver.host``, authenticated by a random token per job) that feeds
the :class:`~dist_dl.launch.protocol.DriverSink`, so output arrives
rank-prefixed and live, as with the other backends. The children get the
task's ``sys.path`` (modules shipped with ``sc.addPyFile`` import in them)
and its ``BarrierTaskContext`` (``BarrierTaskContext.get()``, ``barrier()``
and ``allGather()`` work in the worker function as in the task itself).
"""
from __future__ import annotations

import dataclasses
import functools
import hmac
import os
import random
import secrets
import shutil
import socket
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

import cloudpickle

from dist_dl.core.placement import TASK_GPUS_VAR
from dist_dl.core.session import get_spark, job_group
from dist_dl.core.sparkconf import conf_value
from dist_dl.core.stall import SparkStalled
from dist_dl.launch import forkserver, protocol
from dist_dl.launch.device import WORKER_GPUS_VAR
from dist_dl.launch.errors import JobTimeout, NotEnoughSlots, failure_from
from dist_dl.launch.local import LocalBackend, run_processes
from dist_dl.launch.processes import WorkerProcesses
from dist_dl.launch.protocol import DriverSink
from dist_dl.launch.worker import TASK_CONTEXT_VAR, WorkerOptions

__all__ = ["Engine", "BarrierLocalBackend", "BarrierSparkBackend", "pick_ports",
           "without_foreign_place", "with_gpus"]

# Variables by which another launcher places a worker; inherited from a
# driver that is itself a worker, they would override the engine's place.
_FOREIGN_PLACE = ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_SIZE",
                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE",
                  "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
_PORT_FLOOR = 20000


@dataclasses.dataclass(frozen=True)
class Engine:
    """What an engine's workers need from the launch.

    Attributes:
        name: ``WorkerOptions.engine`` of its workers.
        runner: Its runner's class name, for messages.
        worker_env: ``(base, places, place, local, layout) -> env``: the
            environment of worker ``local`` of place ``place``, given the
            environment it starts from, every place's ``host:port`` and the
            number of workers of each place. Called where the worker runs
            (in its Spark task), so it may look at that host.
        local_layout: ``num_proc -> layout`` for workers on the driver:
            ``[1] * n`` (a place, and a port, per worker) or ``[n]`` (one
            place holding them all).
    """

    name: str
    runner: str
    worker_env: Callable[[dict, list, int, int, list], dict]
    local_layout: Callable[[int], list]


def without_foreign_place(env: dict) -> dict:
    """``env`` less the variables by which another launcher places a worker."""
    return {k: v for k, v in env.items() if k not in _FOREIGN_PLACE}


def with_gpus(env: dict, gpus: list[str]) -> dict:
    """``env`` with ``gpus`` the only GPUs its worker sees, from the start
    (a framework may be imported while the payload is unpickled), and kept
    by the worker's device plan."""
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(gpus), WORKER_GPUS_VAR: ",".join(gpus)}


def _first_rank(layout: list[int], place: int) -> int:
    return sum(layout[:place])


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _port_free(port: int) -> bool:
    # TensorFlow's server binds every interface, so that is what is checked.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, exclude: set[int] = frozenset()) -> list[int]:
    """``count`` distinct free ports of this host, below its ephemeral range
    (see the module's notes), not in ``exclude``."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    chosen: list[int] = []
    if low - _PORT_FLOOR >= 1000:
        candidates = range(_PORT_FLOOR, low)
        for _ in range(200 * count):
            port = rng.choice(candidates)
            if port not in chosen and port not in exclude and _port_free(port):
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    # A host whose ephemeral range starts low: the kernel's own choice.
    while len(chosen) < count:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in chosen and port not in exclude:
            chosen.append(port)
    return chosen


def _label(options: WorkerOptions, engine: Engine, num_proc: int) -> str:
    """The runner as its user wrote it, for messages."""
    return options.runner or f"{engine.runner}(np={num_proc})"


class BarrierLocalBackend(LocalBackend):
    """An engine's worker processes on the driver machine, on 127.0.0.1.

    Args:
        engine: The engine.
        grace: As :class:`~dist_dl.launch.local.LocalBackend`'s.
        worker_gpus: The GPU ids each place's workers see, all of them their
            own (an empty list: none, CPU training); None: the device plan's
            one GPU per worker where the host has GPUs.
    """

    name = "barrier-local"

    def __init__(self, engine: Engine, grace: float = 15.0,
                 worker_gpus: list[list[str]] | None = None):
        super().__init__(grace)
        self.engine = engine
        self.worker_gpus = worker_gpus

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        layout = self.engine.local_layout(num_proc)
        places = [f"127.0.0.1:{port}" for port in pick_ports(len(layout))]
        envs = []
        for place, count in enumerate(layout):
            for local in range(count):
                env = self.engine.worker_env(dict(os.environ), places, place, local, layout)
                if self.worker_gpus is not None:
                    env = with_gpus(env, self.worker_gpus[place])
                envs.append(env)
        options = dataclasses.replace(options, engine=self.engine.name)
        return run_processes(fn, kwargs, envs, options, sink, self.grace)


class _OutputServer:
    """The driver's end of the tasks' output: a TCP server that accepts
    connections presenting the job's token and feeds their lines to ``sink``.

    A task sends ``exit`` control records when its worker ends; the first
    non-zero one is kept as ``first_failed`` and reported to ``on_failure``
    (which cancels the Spark job, so that Spark does not retry the barrier
    stage with the surviving ranks waiting on a dead peer).
    """

    def __init__(self, host: str, sink: DriverSink, on_failure: Callable[[], None]):
        self.token = secrets.token_hex(16)
        self.first_failed: tuple[int, int] | None = None
        self._sink = sink
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._server = socket.create_server((host, 0))
        self.address = (host, self._server.getsockname()[1])
        self._closed = False
        self._started: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True,
                                          name="dist_dl-output-server")
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                      name="dist_dl-output")
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            conn.settimeout(30)  # for the token line only
            try:
                presented = stream.readline().strip()
            except OSError:
                return
            if not hmac.compare_digest(presented, self.token.encode()):
                return
            # Each rank runs once per job: Spark resubmits a failed barrier
            # stage (a lost executor ends a task without an exit record), and
            # a half-run training job must not start again on its own.
            try:
                rank = int(stream.readline())
            except (OSError, ValueError):
                return
            with self._lock:
                again = rank in self._started
                self._started.add(rank)
            conn.sendall(b"no\n" if again else b"go\n")
            conn.settimeout(None)
            for raw in stream:
                line = raw.decode(errors="replace")
                record = protocol.decode_control(line)
                if record is not None and record.get("kind") == "exit" and record.get("code"):
                    with self._lock:
                        first = self.first_failed is None
                        if first:
                            self.first_failed = (record["rank"], record["code"])
                    if first:
                        self._on_failure()
                self._sink.feed(line)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # Wakes the accepting thread (close alone leaves it blocked in accept).
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        self._accepter.join(5)
        for thread in self._threads:
            thread.join(5)


class BarrierSparkBackend:
    """An engine's workers on the tasks of one Spark barrier stage.

    Args:
        engine: The engine.
        spark: SparkSession to run on (default: the active one, else local).
        slot_wait: Seconds to wait for enough task slots before failing.
        grace: Seconds past the job's timeout before a task kills its workers,
            and again before the driver cancels the Spark job.
        worker_gpus: How many of its task's GPUs (Spark resource
            ``gpu_resource``) each task's workers see, all of them their own
            (0: none, CPU training); None: the task's GPUs, if any, for the
            device plan.
        gpu_resource: The name of the GPU resource in Spark's configuration.
        layout: The number of worker processes of each task (default: one).
    """

    name = "barrier-spark"

    def __init__(self, engine: Engine, spark=None, slot_wait: float = 10.0, grace: float = 15.0,
                 worker_gpus: list[int] | None = None, gpu_resource: str = "gpu",
                 layout: list[int] | None = None):
        self.engine = engine
        self.spark = spark
        self.slot_wait = slot_wait
        self.grace = grace
        self.worker_gpus = worker_gpus
        self.gpu_resource = gpu_resource
        self.layout = layout

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        """Run ``fn(**kwargs)`` in the workers of ``num_proc`` tasks; return
        rank 0's result."""
        from dist_dl.launch.spark import check_slots

        spark = self.spark or get_spark()
        sc = spark.sparkContext
        label = _label(options, self.engine, num_proc)
        layout = self.layout or [1] * num_proc
        if len(layout) != num_proc:
            raise ValueError(f"{label}: a layout of {len(layout)} tasks for {num_proc} tasks")
        check_slots(spark, num_proc, self.slot_wait, label=label)
        group = f"dist_dl-{self.engine.name}-{options.job_id}"
        host = conf_value(sc, "spark.driver.host") or socket.gethostname()
        server = _OutputServer(host, sink, on_failure=lambda: sc.cancelJobGroup(group))
        payload = cloudpickle.dumps((dataclasses.replace(options, engine=self.engine.name), fn,
                                     kwargs))
        task = functools.partial(_barrier_task, payload, server.address, server.token,
                                 options.timeout, self.grace, label, self.engine, layout,
                                 (self.gpu_resource, self.worker_gpus),
                                 forkserver.driver_switch())
        expired = threading.Event()
        backstop = None
        if options.timeout:

            def cancel():
                expired.set()
                sc.cancelJobGroup(group)

            backstop = threading.Timer(options.timeout + 2 * self.grace, cancel)
            backstop.daemon = True
            backstop.start()
        try:
            with job_group(sc, group, label):
                results = sc.parallelize(range(num_proc), num_proc).barrier() \
                    .mapPartitions(task).collect()
        except SparkStalled:
            raise
        except Exception as exc:
            server.close()
            sink.close()
            text = str(exc)
            if "SPARK-24819" in text or "requires more slots than" in text:
                raise NotEnoughSlots(
                    f"{label} needs {num_proc} Spark tasks running at the same "
                    f"time, and Spark's barrier mode found fewer task slots (executors were "
                    f"lost after the check?). Use a smaller np, or add workers or cores."
                ) from exc
            if expired.is_set() and sink.first("timeout") is None:
                raise JobTimeout(
                    f"{label}: the job did not finish within its timeout of {options.timeout:g} "
                    f"s (+{2 * self.grace:g} s grace); its Spark tasks were cancelled") from exc
            raise failure_from(sink, server.first_failed, options.timeout, label) from exc
        finally:
            if backstop is not None:
                backstop.cancel()
            server.close()
        sink.close()
        (rank0,) = [result for rank, result in results if rank == 0]
        return cloudpickle.loads(rank0)


class _DriverChannel:
    """A task's connection to the driver's output server: whole lines, from
    several threads."""

    def __init__(self, address: tuple[str, int], token: str, rank: int):
        try:
            self._sock = socket.create_connection(address, timeout=30)
        except OSError as exc:
            raise ConnectionError(
                f"this Spark task cannot reach the driver's output server at "
                f"{address[0]}:{address[1]} ({exc}); executors must be able to connect to "
                "spark.driver.host on any port (check firewalls, and that spark.driver.host is "
                "the driver's cluster address)") from exc
        self._lock = threading.Lock()
        self.send(f"{token}\n{rank}\n")
        with self._sock.makefile("rb") as reply:
            self.go = reply.readline().strip() == b"go"
        self._sock.settimeout(None)

    def send(self, line: str) -> None:
        with self._lock:
            try:
                self._sock.sendall(line.encode())
            except OSError:
                pass  # the driver went away; the job is over

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._sock.close()


def _cluster(ctx, rank: int) -> list[str]:
    """Every task's ``host:port``, the same list in every task."""
    host = ctx.getTaskInfos()[rank].address.rsplit(":", 1)[0]
    taken: set[int] = set()
    for _ in range(10):
        port = pick_ports(1, exclude=taken)[0]
        workers = ctx.allGather(f"{host}:{port}")
        if len(set(workers)) == len(workers):
            return workers
        # Two tasks on one host picked the same port: all pick again.
        taken.update(int(w.rsplit(":", 1)[1]) for w in workers)
    raise RuntimeError("the tasks could not agree on distinct ports in 10 rounds")


def _task_gpus(ctx, rank: int, resource: str, counts: list[int]) -> list[str]:
    """The GPU ids, as CUDA_VISIBLE_DEVICES names them here, that rank
    ``rank``'s worker gets: the first ``counts[rank]`` of its task's."""
    wanted = counts[rank]
    if wanted == 0:
        return []
    found = ctx.resources().get(resource)
    if found is None:
        raise RuntimeError(
            f"this Spark task has no {resource!r} resource: set spark.task.resource.{resource}."
            f"amount (and the executors' spark.executor.resource.{resource}.amount and discovery "
            f"script) for GPU training, or train on CPU (use_gpu=False)")
    addresses = list(found.addresses)
    if not all(a.isdigit() and (a == "0" or not a.startswith("0")) for a in addresses):
        raise RuntimeError(f"the task's GPU addresses {addresses} are not CUDA device ordinals "
                           f"(integers without leading zeros); fix the {resource!r} discovery script")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        # The executor sees only these devices: Spark's addresses index them.
        names = visible.split(",")
        addresses = [names[int(a)] for a in addresses]
    if len(addresses) < wanted:
        raise RuntimeError(f"rank {rank} needs {wanted} GPU(s) and its task has "
                           f"{len(addresses)} ({','.join(addresses)})")
    return addresses[:wanted]


def _save_task_context(ctx, path: str) -> None:
    """Write what a child process needs to act as this barrier task in
    ``BarrierTaskContext.get()`` (its fields, and the local port and secret
    of the task's barrier server in the executor)."""
    from pyspark import BarrierTaskContext

    # The barrier server's address: `_conn_info` from PySpark 4.1 on (a port, or
    # a Unix socket's path), `_port` before; `_initialize` takes what it keeps.
    address = (BarrierTaskContext._conn_info if hasattr(BarrierTaskContext, "_conn_info")
               else BarrierTaskContext._port)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        cloudpickle.dump((dict(vars(ctx)), address, BarrierTaskContext._secret), f)


def _barrier_task(payload: bytes, driver: tuple[str, int], token: str, timeout: float | None,
                  grace: float, label: str, engine: Engine, layout: list[int],
                  gpu_plan: tuple[str, list[int] | None], switch: dict[str, str],
                  _partition) -> Any:
    """One Spark barrier task: runs its workers of the job as child processes
    and yields (its first rank, pickled result for rank 0 else None).
    ``switch``: the driver's setting of the fork server's switch, if any."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    place = ctx.partitionId()
    first = _first_rank(layout, place)
    channel = _DriverChannel(driver, token, place)
    code, failed_rank = None, first
    try:
        if not channel.go:
            raise RuntimeError(f"Spark started task {place} of this job again (a retried "
                               f"barrier stage); {label} does not retry a failed job")
        places = _cluster(ctx, place)
        workdir = tempfile.mkdtemp(prefix=f"dist_dl-{engine.name}-")
        try:
            payload_path = os.path.join(workdir, "payload.pkl")
            result_path = os.path.join(workdir, "result.pkl")
            context_path = os.path.join(workdir, "context.pkl")
            with open(payload_path, "wb") as f:
                f.write(payload)
            _save_task_context(ctx, context_path)
            processes = WorkerProcesses(channel.send, engine.name)
            try:
                resource, counts = gpu_plan
                gpus = ctx.resources().get(resource)
                own = _task_gpus(ctx, place, resource, counts) if counts is not None else None
                for local in range(layout[place]):
                    env = engine.worker_env({**os.environ, **switch}, places, place, local,
                                            layout)
                    env[TASK_CONTEXT_VAR] = context_path
                    if own is not None:
                        env = with_gpus(env, own)
                    elif gpus is not None and gpus.addresses:
                        # This task's own GPUs (Spark's GPU scheduling), not the host's.
                        env[TASK_GPUS_VAR] = ",".join(gpus.addresses)
                    processes.start(payload_path, result_path, env)
                deadline = time.monotonic() + timeout + grace if timeout else None
                first_failed, _ = processes.wait(deadline)
            finally:
                processes.stop()
            codes = [proc.returncode for proc in processes.procs]
            if first_failed is None:
                first_failed = next(((i, c) for i, c in enumerate(codes) if c != 0), None)
            code = 0 if first_failed is None else first_failed[1]
            if first_failed is not None:
                failed_rank = first + first_failed[0]
                raise RuntimeError(f"worker rank {failed_rank} ended with exit code {code}; its "
                                   "error is reported on the driver")
            result = None
            if first == 0:
                with open(result_path, "rb") as f:
                    result = f.read()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        yield first, result
    except BaseException as exc:
        if code is None:  # the task failed before its workers ran: say why
            code = 1
            channel.send(protocol.encode_control(
                "error", first, type=type(exc).__name__, message=str(exc),
                traceback="".join(traceback.format_exception(exc))))
        raise
    finally:
        channel.send(protocol.encode_control("exit", failed_rank, code=code or 0))
        channel.close()
