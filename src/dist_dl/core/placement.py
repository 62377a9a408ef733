"""A process's place in its job: its rank, and its rank and count on its host.

Runs in workers (and anywhere else: a process on its own is rank 0); imports
only the standard library. The launcher sets the place in the environment
before the user's function runs; Horovod knows it once initialised. Rank 0
is the process that writes checkpoints and logs to MLflow.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

__all__ = ["Place", "launcher_place", "tf_config_place", "horovod_if_initialized",
           "process_rank", "host_share", "TASK_GPUS_VAR", "HOST_SHARE_VAR"]

# GPU ids Spark's GPU scheduling assigned to the task that hosts a worker
# (``TaskContext.resources()["gpu"]``), set by the tf.distribute engine's tasks.
TASK_GPUS_VAR = "DIST_DL_TASK_GPUS"
# A worker's index and count among all of its job's workers on its host,
# "index/count", where its launcher's local rank and size count fewer (the
# torch engine: LOCAL_RANK and LOCAL_WORLD_SIZE count the workers of one Spark
# task, as torchrun's count those of one node, and tasks may share a host).
HOST_SHARE_VAR = "DIST_DL_HOST_SHARE"

# Where a launcher puts a worker's place in the job before hvd.init():
# Horovod's Gloo launchers (ours, horovod.spark.run: horovod/runner/gloo_run.py
# create_slot_env_vars) set HOROVOD_*; Open MPI's mpirun, which Databricks'
# HorovodRunner starts its workers with, sets OMPI_COMM_WORLD_*. Horovod reads
# the ranks in the same order (horovod/runner/common/util/env.py). torchrun,
# and the torch engine (dist_dl.launch.engines.torch), set RANK, LOCAL_RANK and
# LOCAL_WORLD_SIZE.
_PLACE_VARIABLES = (("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
                    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                     "OMPI_COMM_WORLD_LOCAL_SIZE"),
                    ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))


@dataclass(frozen=True)
class Place:
    """A worker's rank in the job, and its rank and count on its host."""

    rank: int
    local_rank: int
    local_size: int


def launcher_place(environ) -> Place | None:
    """This worker's place as its launcher set it in ``environ`` (Horovod's
    variables, else Open MPI's, else torchrun's, else tf.distribute's
    ``TF_CONFIG``), or None
    if none of them set it."""
    for rank, local_rank, local_size in _PLACE_VARIABLES:
        if rank in environ and local_rank in environ:
            local = int(environ[local_rank])
            return Place(int(environ[rank]), local, int(environ.get(local_size, local + 1)))
    return tf_config_place(environ.get("TF_CONFIG"))


def host_share(environ, place: Place) -> tuple[int, int]:
    """(index, count) of this worker among its job's workers on its host, for
    sharing the host's cores: ``HOST_SHARE_VAR`` where the launcher set it,
    else ``place``'s local rank and size."""
    value = environ.get(HOST_SHARE_VAR, "")
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        return place.local_rank, place.local_size
    return index, count


def tf_config_place(tf_config: str | None) -> Place | None:
    """The place of a tf.distribute worker, from its ``TF_CONFIG`` (JSON:
    ``cluster.worker`` lists every worker's ``host:port``, ``task.index`` is
    this one's): its rank is its index, its local rank and size count the
    workers on the same host. None without a worker task in it."""
    if not tf_config:
        return None
    import json

    try:
        config = json.loads(tf_config)
        workers = list(config["cluster"]["worker"])
        index = int(config["task"]["index"])
        if config["task"].get("type", "worker") != "worker" or not 0 <= index < len(workers):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    hosts = [address.rsplit(":", 1)[0] for address in workers]
    same = [i for i, host in enumerate(hosts) if host == hosts[index]]
    return Place(index, same.index(index), len(same))


def horovod_if_initialized():
    """``horovod.tensorflow`` once ``hvd.init()`` has run in this process, else None."""
    # Only if something imported it already: a process that never did (a
    # tf.distribute worker, where Horovod may not even build) has not
    # initialised it, and must not pay for (or fail on) the import.
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except Exception:  # horovod built without TensorFlow support
        return None


def process_rank(environ=None) -> int:
    """This process's rank in its job: Horovod's once initialised, else the
    rank its launcher set in the environment, else 0 (a process on its own).
    Rank 0 is the one that writes checkpoints and logs."""
    hvd = horovod_if_initialized()
    if hvd is not None:
        return hvd.rank()
    place = launcher_place(os.environ if environ is None else environ)
    return 0 if place is None else place.rank
