"""Which device, how many CPU threads and which Horovod cycle time each worker gets.

Pure functions of (local rank, local size, what the host has), applied to the
worker's environment before TensorFlow is imported, so they are tested here on
both sides: with GPUs described, and with none.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, MutableMapping

__all__ = ["DevicePlan", "WORKER_GPUS_VAR", "plan_devices", "visible_gpus",
           "horovod_env_fixes", "default_cycle_time", "cpu_cycle_time_ms", "CPU_CYCLE_TIME_MS",
           "CPU_LARGE_MODEL_CYCLE_TIME_MS", "LARGE_GRADIENT_BYTES", "DEFAULT_CYCLE_TIME_VAR"]

# Horovod's background thread wakes every cycle (1 ms by default since
# Horovod 0.21, chosen for GPU servers) and negotiates with the other ranks.
# On CPU workers that thread and Gloo's socket loop take their CPU from the
# compute on the same few cores. With two one-core workers 5 ms beats 1 ms
# on ResNet50; for ResNet50 (94 MB of gradients) 20 ms beats 5 ms and halves
# the communication threads' system time, while on the small CNN (0.4 MB)
# 20 ms is level with 5 ms (figures in benchmarks/RESULTS.md). A cycle
# can delay each step's last allreduce by up to its length, which a model
# with millisecond steps would feel, so the long cycle is for large
# gradients only: at 16 MB or more (4 M float32 parameters) an allreduce
# takes tens of milliseconds itself.
CPU_CYCLE_TIME_MS = 5.0
CPU_LARGE_MODEL_CYCLE_TIME_MS = 20.0
LARGE_GRADIENT_BYTES = 16 * 2 ** 20
# Set beside HOROVOD_CYCLE_TIME, to the same value, when that value is our
# default rather than a choice: a worker that knows its model may raise it.
DEFAULT_CYCLE_TIME_VAR = "DIST_DL_DEFAULT_CYCLE_TIME"


# GPU ids a launcher gives one worker, all of them its own ('' for none), in
# place of the plan's one GPU per worker: MirroredStrategyRunner's workers
# mirror their model over several local GPUs.
WORKER_GPUS_VAR = "DIST_DL_WORKER_GPUS"


@dataclass(frozen=True)
class DevicePlan:
    """What one worker uses.

    Attributes:
        gpu: The GPU id this worker sees as its only GPU, or None on CPU.
        threads: Intra-op threads for TensorFlow/OpenMP/BLAS.
        cpus: CPU cores to pin the worker to, or None for no pinning.
        env: Environment variables that realise the plan.
    """

    gpu: str | None
    threads: int
    cpus: tuple[int, ...] | None
    env: dict


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """GPU ids a process with ``env`` (default: this one's environment) may
    use: ``CUDA_VISIBLE_DEVICES`` if set (a Spark task with GPU scheduling, a
    user's restriction), else what ``nvidia-smi`` lists, else none."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [g.strip() for g in value.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def plan_devices(local_rank: int, local_size: int, *, gpus: list[str], cpu_count: int,
                 threads: int | None = None, pin_cpus: bool = False,
                 own_gpus: bool = False) -> DevicePlan:
    """Plan one worker's devices.

    Args:
        local_rank: The worker's rank on its host.
        local_size: Workers on its host.
        gpus: GPU ids the host offers to these workers (see ``visible_gpus``).
        cpu_count: Cores usable on the host.
        threads: CPU threads per worker; None shares the cores evenly.
        pin_cpus: Pin each worker to its own share of the cores.
        own_gpus: ``gpus`` are this worker's alone (Spark's GPU scheduling gave
            them to its task), not the host's: it takes the first of them,
            whatever its local rank.

    Raises:
        ValueError: More workers on a host than GPUs, or bad counts.
    """
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local_rank {local_rank} is not in [0, local_size={local_size})")
    if threads is not None and threads < 1:
        raise ValueError(f"threads_per_worker must be >= 1, got {threads}")
    share = max(1, cpu_count // local_size)
    threads = threads or share
    env = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        # Inter-op: independent ops of a step run concurrently; two keeps the
        # input pipeline and the model step overlapping without oversubscribing.
        "TF_NUM_INTEROP_THREADS": str(min(2, threads)),
    }
    gpu = None
    if gpus and own_gpus:
        gpu = gpus[0]
        env["CUDA_VISIBLE_DEVICES"] = gpu
    elif gpus:
        if local_size > len(gpus):
            raise ValueError(
                f"{local_size} workers on this host but only {len(gpus)} GPU(s) ({','.join(gpus)}): "
                f"run at most {len(gpus)} workers per host (np), or give each task one GPU "
                "with spark.task.resource.gpu.amount=1")
        gpu = gpus[local_rank]
        # Each worker sees exactly one GPU (its local rank's), as device 0.
        env["CUDA_VISIBLE_DEVICES"] = gpu
    cpus = None
    if pin_cpus and cpu_count >= local_size:
        cpus = tuple(range(local_rank * share, local_rank * share + share))
    return DevicePlan(gpu=gpu, threads=threads, cpus=cpus, env=env)


def horovod_env_fixes(environ: dict) -> list[str]:
    """Corrections for Horovod settings that are present but not numbers.

    Horovod 0.28.1's function launcher (``horovod.runner.run``) builds its
    argument object with ``cycle_time_ms = None,`` and ``cache_capacity = None,``
    (trailing commas make tuples, horovod/runner/__init__.py), so its workers
    get ``HOROVOD_CYCLE_TIME="(None,)"``. The C++ core parses that with strtof
    to 0 ms, and the background thread spins (about half a core per idle
    worker). Any such value is dropped, so Horovod's own default
    (or the user's real value) applies. Returns the names of the variables to
    remove.
    """
    fixes = []
    for name in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_FUSION_THRESHOLD"):
        value = environ.get(name)
        if value is None:
            continue
        try:
            float(value)
        except ValueError:
            fixes.append(name)
    return fixes


def cpu_cycle_time_ms(gradient_bytes: int = 0) -> float:
    """The cycle time CPU workers get when nobody chose one: 20 ms for
    ``gradient_bytes`` (one step's float32 gradients) of 16 MB or more, else
    5 ms (also when the model is not known yet)."""
    return (CPU_LARGE_MODEL_CYCLE_TIME_MS if gradient_bytes >= LARGE_GRADIENT_BYTES
            else CPU_CYCLE_TIME_MS)


def default_cycle_time(environ: MutableMapping[str, str], *, chosen: bool, gpus: list[str],
                       gradient_bytes: int = 0) -> str | None:
    """Give a CPU worker ``cpu_cycle_time_ms(gradient_bytes)`` as
    ``HOROVOD_CYCLE_TIME``, unless a cycle time was chosen. Must run before
    ``hvd.init()``, which reads it once.

    A value already in ``environ`` counts as chosen, unless it is this
    function's own default (``DEFAULT_CYCLE_TIME_VAR`` holds the same value):
    that one is replaced, so the training worker can raise the launcher's
    default once it knows its model's size, and a process that hosts a second
    job (in-process delegation) does not take the first job's default for a
    choice. GPU workers keep Horovod's default.

    Args:
        environ: The worker's environment (``os.environ``), changed in place.
        chosen: The job sets a cycle time (``HorovodRunner(env=...)``,
            ``TrainConfig.cycle_time_ms``).
        gpus: GPU ids this worker may use (see ``visible_gpus``).
        gradient_bytes: Bytes of one step's float32 gradients; 0 if unknown.

    Returns:
        The value set, or None when the environment keeps its own (or none).
    """
    ours = environ.pop(DEFAULT_CYCLE_TIME_VAR, None)
    if not chosen and ours is not None and environ.get("HOROVOD_CYCLE_TIME") == ours:
        del environ["HOROVOD_CYCLE_TIME"]
    if chosen or gpus or "HOROVOD_CYCLE_TIME" in environ:
        return None
    value = str(cpu_cycle_time_ms(gradient_bytes))
    environ["HOROVOD_CYCLE_TIME"] = environ[DEFAULT_CYCLE_TIME_VAR] = value
    return value
