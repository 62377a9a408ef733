"""An engine's workers as the tasks of one Spark barrier stage, started
through the classic ``SparkContext``.

The tasks of a barrier stage start together; each takes its host from
``BarrierTaskContext.getTaskInfos()`` (the executor's cluster address), picks
a port there (`pick_ports()`) and
``allGather``s ``host:port``, so every task sees the same list of places.
Each task runs its workers as child processes (one runtime per job: a reused
PySpark worker process could not host a second one) and sends their output
to the driver's `OutputServer`. The
children get the task's ``sys.path`` (modules shipped with ``sc.addPyFile``
import in them) and its ``BarrierTaskContext`` (``BarrierTaskContext.get()``,
``barrier()`` and ``allGather()`` work in the worker function as in the task
itself).

A Spark Connect session (no SparkContext) gets the same stage through the
DataFrame API: `BarrierSparkBackend` hands it to
``dist_dl.launch.backends.spark_connect``.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import socket
import tempfile
import time
import traceback
from typing import Any, Callable

import cloudpickle

from dist_dl.core.placement import TASK_GPUS_VAR
from dist_dl.core.session import get_spark, job_group
from dist_dl.core.sessionkind import is_connect
from dist_dl.core.sparkconf import conf_value
from dist_dl.core.stall import SparkStalled
from dist_dl.launch.backends.processes import WorkerProcesses
from dist_dl.launch.core import protocol
from dist_dl.launch.core.channel import DriverChannel, OutputServer
from dist_dl.launch.core.deadline import Backstop, Interrupts, stage_refusal
from dist_dl.launch.core.errors import JobCancelled, cancelled_from_outside, failure_from
from dist_dl.launch.core.protocol import DriverSink
from dist_dl.launch.core.rendezvous import Engine, first_rank, pick_ports, runner_label, with_gpus
from dist_dl.launch.core.slots import check_slots
from dist_dl.launch.core.worker import TASK_CONTEXT_VAR, WorkerOptions
from dist_dl.launch.fork import client as forkserver

__all__ = ["BarrierSparkBackend"]


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
        spark = self.spark or get_spark()
        label = runner_label(options, self.engine, num_proc)
        # --- Spark Connect sessions: the stage through the DataFrame API.
        if is_connect(spark):
            from dist_dl.launch.backends.spark_connect import run_connect

            return run_connect(self, spark, fn, kwargs, num_proc, options, sink, label,
                               _barrier_task)
        # --- end Spark Connect
        sc = spark.sparkContext
        layout = self.layout or [1] * num_proc
        if len(layout) != num_proc:
            raise ValueError(f"{label}: a layout of {len(layout)} tasks for {num_proc} tasks")
        check_slots(spark, num_proc, self.slot_wait, label=label)
        group = f"dist_dl-{self.engine.name}-{options.job_id}"
        host = conf_value(sc, "spark.driver.host") or socket.gethostname()
        server = OutputServer(host, sink, on_failure=lambda: sc.cancelJobGroup(group))
        payload = cloudpickle.dumps((dataclasses.replace(options, engine=self.engine.name), fn,
                                     kwargs))
        task = functools.partial(_barrier_task, payload, server.address, server.token,
                                 options.timeout, self.grace, label, self.engine, layout,
                                 (self.gpu_resource, self.worker_gpus),
                                 forkserver.driver_switch())
        backstop = Backstop(options.timeout, self.grace, lambda: sc.cancelJobGroup(group))
        try:
            with Interrupts(lambda: sc.cancelJobGroup(group)):
                try:
                    with backstop, job_group(sc, group, label):
                        results = sc.parallelize(range(num_proc), num_proc).barrier() \
                            .mapPartitions(task).collect()
                except SparkStalled:
                    raise
                except Exception as exc:
                    server.close()
                    sink.close()
                    refused = stage_refusal(str(exc), backstop, sink, label, num_proc,
                                            options.timeout, self.grace,
                                            "its Spark tasks were cancelled")
                    if refused is not None:
                        raise refused from exc
                    # Cancelled by somebody else (a notebook's cancel, cancelAllJobs,
                    # the Spark UI): Spark says so, not naming the runner's own
                    # job group; or, less certain, no worker reported a failure,
                    # which would have made the runner cancel the job itself.
                    cancelled = cancelled_from_outside(str(exc), group)
                    if cancelled is not None and (cancelled[1] or server.first_failed is None):
                        raise JobCancelled(f"{label}: its Spark job was cancelled from outside "
                                           f"({cancelled[0]}); its workers were stopped") from exc
                    raise failure_from(sink, server.first_failed, options.timeout, label) from exc
        finally:
            server.close()
        sink.close()
        (rank0,) = [result for rank, result in results if rank == 0]
        return cloudpickle.loads(rank0)


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
    first = first_rank(layout, place)
    # A callable ``driver`` opens the task's own channel (Spark Connect:
    # `dist_dl.launch.backends.spark_connect`), else the driver's output server.
    channel = driver(place) if callable(driver) else DriverChannel(driver, token, place)
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
