"""The tf.distribute engine: workers that form one
``tf.distribute.MultiWorkerMirroredStrategy`` job, as processes on the driver
(``np < 0``) or as the tasks of a Spark barrier stage (``np > 0``).

Every worker gets a ``TF_CONFIG`` naming all workers' ``host:port`` and its
own index; the strategy's gRPC server listens on that port and its
collectives (RING on CPU, NCCL on GPUs: :func:`multi_worker_strategy`) run
between those addresses. No Horovod import anywhere on this path.

Ports. TensorFlow's gRPC server binds the port named in ``TF_CONFIG`` itself
and without ``SO_REUSEPORT`` (checked: a reserving socket held open with it
makes the server fail with "Could not start gRPC server"), so a port cannot
stay reserved until the server takes it. Ports are picked instead below the
kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), where
no ``bind(port 0)`` and no outgoing connection of another program is ever
given one, after checking that each is free; a collision needs another
program to bind that very port explicitly in the seconds before the worker
starts. On Spark, tasks sharing a host pick independently, so the gathered
list is checked for duplicates and picked again until every address is
distinct.

Spark. The ``np`` tasks of a barrier stage start together; each takes its
host from ``BarrierTaskContext.getTaskInfos()`` (the executor's cluster
address), picks a port there and ``allGather``s ``host:port``, so every task
builds the same cluster. Each task runs its worker as a child process (one
TensorFlow runtime per job: a reused PySpark worker process could not host a
second strategy) and sends the child's output to a small TCP server on the
driver (at ``spark.driver.host``, authenticated by a random token per job)
that feeds the :class:`~dist_dl.launch.protocol.DriverSink`, so output arrives
rank-prefixed and live, as with the other backends. The child gets the task's
``sys.path`` (modules shipped with ``sc.addPyFile`` import in it) and its
``BarrierTaskContext`` (``BarrierTaskContext.get()``, ``barrier()`` and
``allGather()`` work in the worker function as in the task itself).
"""
from __future__ import annotations

import dataclasses
import functools
import hmac
import json
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

from dist_dl.core import compat
from dist_dl.core.placement import TASK_GPUS_VAR
from dist_dl.core.session import get_spark, job_group
from dist_dl.core.sparkconf import conf_value
from dist_dl.core.stall import SparkStalled
from dist_dl.launch import protocol
from dist_dl.launch.device import WORKER_GPUS_VAR
from dist_dl.launch.errors import JobTimeout, NotEnoughSlots, failure_from
from dist_dl.launch.local import LocalBackend, run_processes
from dist_dl.launch.processes import WorkerProcesses
from dist_dl.launch.protocol import DriverSink
from dist_dl.launch.worker import TASK_CONTEXT_VAR, WorkerOptions

__all__ = ["ENGINE", "TFLocalBackend", "TFSparkBackend", "multi_worker_strategy", "tf_config",
           "pick_ports"]

ENGINE = "tensorflow"
RUNNER = "TFDistributeRunner"
# Variables by which another launcher places a worker; inherited from a
# driver that is itself a worker, they would override TF_CONFIG's place.
_FOREIGN_PLACE = ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_SIZE",
                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE")
_PORT_FLOOR = 20000


def tf_config(workers: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of ``workers`` (``host:port``)."""
    return json.dumps({"cluster": {"worker": list(workers)},
                       "task": {"type": "worker", "index": index}})


def worker_env(base: dict, workers: list[str], index: int) -> dict:
    # Keras 2 (tf-keras) as tf.keras where Keras 3 is the default and tf-keras
    # is installed, unless the environment chose: Keras 3's fit under this
    # strategy does not sum the workers' gradients (keras-team/keras#19891;
    # TF 2.16.1, Keras 3.2.1), and with Keras 3.5.0 on TF 2.17.0 (runtime
    # 16.4 LTS ML) it fails outright: "Attempt to convert a value (PerReplica
    # ...)" for a tf.data.Dataset, "Unrecognized data type" for the dataset
    # distribute_datasets_from_function returns (keras-team/keras#20585,
    # tensorflow#72388). With tf-keras 2.17 both train as one process does.
    env = {k: v for k, v in {**compat.worker_env(), **base}.items() if k not in _FOREIGN_PLACE}
    env["TF_CONFIG"] = tf_config(workers, index)
    return env


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


def multi_worker_strategy(**kwargs):
    """``tf.distribute.MultiWorkerMirroredStrategy`` for a worker of this
    engine, with the collective implementation fixed by the devices: NCCL
    where GPUs are visible, RING (gRPC) on CPU. Call it first in the worker
    function, before any other TensorFlow op (the strategy must configure the
    runtime). Keyword arguments go to the strategy (``communication_options``
    replaces the choice)."""
    import tensorflow as tf

    if "communication_options" not in kwargs:
        implementation = tf.distribute.experimental.CommunicationImplementation
        chosen = (implementation.NCCL if tf.config.list_physical_devices("GPU")
                  else implementation.RING)
        kwargs["communication_options"] = tf.distribute.experimental.CommunicationOptions(
            implementation=chosen)
    return tf.distribute.MultiWorkerMirroredStrategy(**kwargs)


def _label(options: WorkerOptions, num_proc: int) -> str:
    """The runner as its user wrote it, for messages."""
    return options.runner or f"{RUNNER}(np={num_proc})"


def _with_gpus(env: dict, gpus: list[str]) -> dict:
    # From the start (TensorFlow may be imported while the payload is
    # unpickled), and kept by the worker's device plan.
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(gpus), WORKER_GPUS_VAR: ",".join(gpus)}


class TFLocalBackend(LocalBackend):
    """Worker processes on the driver machine, on 127.0.0.1.

    Args:
        grace: As :class:`~dist_dl.launch.local.LocalBackend`'s.
        worker_gpus: The GPU ids each worker gets, all of them its own (an
            empty list: none, CPU training); None: the device plan's one GPU
            per worker where the host has GPUs.
    """

    name = "tf-local"

    def __init__(self, grace: float = 15.0, worker_gpus: list[list[str]] | None = None):
        super().__init__(grace)
        self.worker_gpus = worker_gpus

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        workers = [f"127.0.0.1:{port}" for port in pick_ports(num_proc)]
        envs = [worker_env(dict(os.environ), workers, i) for i in range(num_proc)]
        if self.worker_gpus is not None:
            envs = [_with_gpus(env, gpus) for env, gpus in zip(envs, self.worker_gpus)]
        return run_processes(fn, kwargs, envs, dataclasses.replace(options, engine=ENGINE), sink,
                             self.grace)


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


class TFSparkBackend:
    """Workers as the tasks of one Spark barrier stage.

    Args:
        spark: SparkSession to run on (default: the active one, else local).
        slot_wait: Seconds to wait for enough task slots before failing.
        grace: Seconds past the job's timeout before a task kills its worker,
            and again before the driver cancels the Spark job.
        worker_gpus: How many of its task's GPUs (Spark resource
            ``gpu_resource``) each rank's worker gets, all of them its own
            (0: none, CPU training); None: the task's first GPU, if any.
        gpu_resource: The name of the GPU resource in Spark's configuration.
    """

    name = "tf-spark"

    def __init__(self, spark=None, slot_wait: float = 10.0, grace: float = 15.0,
                 worker_gpus: list[int] | None = None, gpu_resource: str = "gpu"):
        self.spark = spark
        self.slot_wait = slot_wait
        self.grace = grace
        self.worker_gpus = worker_gpus
        self.gpu_resource = gpu_resource

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        from dist_dl.launch.spark import check_slots

        spark = self.spark or get_spark()
        sc = spark.sparkContext
        label = _label(options, num_proc)
        check_slots(spark, num_proc, self.slot_wait, label=label)
        group = f"dist_dl-tf-{options.job_id}"
        host = conf_value(sc, "spark.driver.host") or socket.gethostname()
        server = _OutputServer(host, sink, on_failure=lambda: sc.cancelJobGroup(group))
        payload = cloudpickle.dumps((dataclasses.replace(options, engine=ENGINE), fn, kwargs))
        task = functools.partial(_barrier_task, payload, server.address, server.token,
                                 options.timeout, self.grace, label,
                                 (self.gpu_resource, self.worker_gpus))
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
                    f"the job did not finish within its timeout of {options.timeout:g} s "
                    f"(+{2 * self.grace:g} s grace); its Spark tasks were cancelled") from exc
            raise failure_from(sink, server.first_failed, options.timeout) from exc
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

    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        cloudpickle.dump((dict(vars(ctx)), BarrierTaskContext._port, BarrierTaskContext._secret), f)


def _barrier_task(payload: bytes, driver: tuple[str, int], token: str, timeout: float | None,
                  grace: float, label: str, gpu_plan: tuple[str, list[int] | None],
                  _partition) -> Any:
    """One Spark barrier task: runs worker ``rank`` of the job as a child
    process and yields (rank, pickled result for rank 0 else None)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    channel = _DriverChannel(driver, token, rank)
    code = None
    try:
        if not channel.go:
            raise RuntimeError(f"Spark started rank {rank} of this job again (a retried barrier "
                               f"stage); {label} does not retry a failed job")
        workers = _cluster(ctx, rank)
        workdir = tempfile.mkdtemp(prefix="dist_dl-tf-")
        try:
            payload_path = os.path.join(workdir, "payload.pkl")
            result_path = os.path.join(workdir, "result.pkl")
            context_path = os.path.join(workdir, "context.pkl")
            with open(payload_path, "wb") as f:
                f.write(payload)
            _save_task_context(ctx, context_path)
            processes = WorkerProcesses(channel.send)
            try:
                env = worker_env(dict(os.environ), workers, rank)
                env[TASK_CONTEXT_VAR] = context_path
                resource, counts = gpu_plan
                gpus = ctx.resources().get(resource)
                if counts is not None:
                    env = _with_gpus(env, _task_gpus(ctx, rank, resource, counts))
                elif gpus is not None and gpus.addresses:
                    # This task's own GPUs (Spark's GPU scheduling), not the host's.
                    env[TASK_GPUS_VAR] = ",".join(gpus.addresses)
                proc = processes.start(payload_path, result_path, env)
                deadline = time.monotonic() + timeout + grace if timeout else None
                processes.wait(deadline)
            finally:
                processes.stop()
            code = proc.returncode
            if code != 0:
                raise RuntimeError(f"worker rank {rank} ended with exit code {code}; its error "
                                   "is reported on the driver")
            result = None
            if rank == 0:
                with open(result_path, "rb") as f:
                    result = f.read()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        yield rank, result
    except BaseException as exc:
        if code is None:  # the task failed before its worker ran: say why
            code = 1
            channel.send(protocol.encode_control(
                "error", rank, type=type(exc).__name__, message=str(exc),
                traceback="".join(traceback.format_exception(exc))))
        raise
    finally:
        channel.send(protocol.encode_control("exit", rank, code=code or 0))
        channel.close()
