"""The torch engine: workers that form one ``torch.distributed`` job, placed
as torchrun places its workers, as processes on the driver or on the tasks of
a Spark barrier stage (any backend of `dist_dl.launch.backends`).

Every worker gets torchrun's variables, so ``torch.distributed.init_process_group``
with its default ``env://`` works unchanged: ``MASTER_ADDR`` and ``MASTER_PORT``
(the first place's address: 127.0.0.1 on the driver, else rank 0's Spark task's
cluster address, with a free port picked on that host), ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, and ``GROUP_RANK`` /
``NODE_RANK`` (the place's index, which PyTorch Lightning reads). Gloo and
NCCL are told the interface that holds the place's own address
(``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``) unless the environment sets
them: left to themselves they take the interface the host's name resolves
to, which on many hosts is loopback. A job whose places span hosts and name
a loopback address fails before any worker starts.

The workers on one host share its cores (``threads_per_worker``'s default),
whichever Spark task each belongs to. A worker that sees GPUs uses the one
of its local rank (``torch.cuda.set_device(LOCAL_RANK)``) before the user's
code runs: each process of a place sees all of that place's GPUs, as under
torchrun. No TensorFlow import anywhere on this path.
"""
from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Callable

from dist_dl.core.placement import HOST_SHARE_VAR
from dist_dl.launch.backends.processes import BarrierLocalBackend
from dist_dl.launch.backends.spark_classic import BarrierSparkBackend
from dist_dl.launch.core.rendezvous import Engine, without_foreign_place
from dist_dl.launch.core.network import IFNAME_VARS, interface_holding, is_loopback, resolve

__all__ = ["ENGINE", "TORCH_ENGINE", "torch_env", "local_backend", "spark_backend",
           "call_function", "run_script", "IFNAME_VARS"]

ENGINE = "torch"
RUNNER = "TorchDistributor"


def torch_env(base: dict, places: list[str], place: int, local: int,
              layout: list[int]) -> dict:
    """The environment of worker ``local`` of place ``place``: torchrun's
    variables, and the interface of this place's address for Gloo and NCCL.

    Raises:
        RuntimeError: the places span hosts and one of them is a loopback
            address (workers on other hosts could not reach it).
    """
    env = without_foreign_place(base)
    master_host, master_port = places[0].rsplit(":", 1)
    env.update({
        "MASTER_ADDR": master_host, "MASTER_PORT": master_port,
        "RANK": str(sum(layout[:place]) + local), "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(sum(layout)), "LOCAL_WORLD_SIZE": str(layout[place]),
        "GROUP_RANK": str(place), "NODE_RANK": str(place),
        "GROUP_WORLD_SIZE": str(len(layout)),
    })
    hosts = [p.rsplit(":", 1)[0] for p in places]
    addresses = [resolve(h) or h for h in hosts]
    # The host's cores are shared among every worker on it, of all its tasks.
    here = [i for i, a in enumerate(addresses) if a == addresses[place]]
    index = sum(layout[i] for i in here if i < place) + local
    env[HOST_SHARE_VAR] = f"{index}/{sum(layout[i] for i in here)}"
    if len(set(addresses)) > 1:
        looped = [h for h, a in zip(hosts, addresses) if _loopback(a)]
        if looped:
            raise RuntimeError(
                f"the job's Spark tasks run on {len(set(addresses))} hosts and Spark gives "
                f"{looped[0]!r}, a loopback address, as the address of one: workers on other "
                f"hosts cannot reach it. Give each executor its cluster address "
                f"(SPARK_LOCAL_IP, or a host name that does not resolve to loopback).")
    name = interface_holding(addresses[place])
    if name is not None:
        for var in IFNAME_VARS:
            env.setdefault(var, name)
    return env


def _loopback(address: str) -> bool:
    try:
        return is_loopback(address)
    except ValueError:  # a name that does not resolve: not known to be loopback
        return False


# On the driver, one place holds every worker, as under `torchrun --standalone`.
TORCH_ENGINE = Engine(name=ENGINE, runner=RUNNER, worker_env=torch_env,
                      local_layout=lambda num_proc: [num_proc])


def local_backend(worker_gpus: list[str] | None, grace: float = 15.0) -> BarrierLocalBackend:
    """Worker processes on the driver, seeing ``worker_gpus`` (None: the host's)."""
    return BarrierLocalBackend(TORCH_ENGINE, grace,
                               None if worker_gpus is None else [worker_gpus])


def spark_backend(spark, layout: list[int], gpus: list[int] | None,
                  gpu_resource: str = "gpu", grace: float = 15.0) -> BarrierSparkBackend:
    """``layout[i]`` worker processes on Spark task ``i``, seeing the first
    ``gpus[i]`` GPUs of their task (None: the task's GPUs, if any)."""
    return BarrierSparkBackend(TORCH_ENGINE, spark, grace=grace, worker_gpus=gpus,
                               gpu_resource=gpu_resource, layout=layout)


def _use_local_gpu() -> None:
    """Make the GPU of this worker's local rank torch's current device, where
    it sees GPUs (CUDA_VISIBLE_DEVICES names some)."""
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def call_function(train_fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """A worker's call of the user's function: ``train_fn(*args, **kwargs)``
    on the GPU of its local rank."""
    _use_local_gpu()
    return train_fn(*args, **kwargs)


def run_script(path: str, args: tuple) -> None:
    """A worker's run of the user's script, as ``python path *args`` would run
    it: ``__main__``, ``sys.argv``, the script's folder first on ``sys.path``.
    ``sys.exit(0)`` (or None) ends it as success; any other exit code fails
    the worker with ``SystemExit``."""
    _use_local_gpu()
    # The worker process ends with the script: nothing to put back.
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
