"""The tf.distribute engine: workers that form one
``tf.distribute.MultiWorkerMirroredStrategy`` job, as processes on the driver
(``np < 0``) or as the tasks of a Spark barrier stage (``np > 0``), launched
by a backend of `dist_dl.launch.backends`.

Every worker gets a ``TF_CONFIG`` naming all workers' ``host:port`` and its
own index; the strategy's gRPC server listens on that port and its
collectives (RING on CPU, NCCL on GPUs: `multi_worker_strategy()`) run
between those addresses. No Horovod import anywhere on this path.
"""
from __future__ import annotations

import json

from dist_dl.core import compat
from dist_dl.launch.backends.processes import BarrierLocalBackend
from dist_dl.launch.backends.spark_classic import BarrierSparkBackend
from dist_dl.launch.core.rendezvous import Engine, without_foreign_place

__all__ = ["ENGINE", "TFLocalBackend", "TFSparkBackend", "multi_worker_strategy", "tf_config"]

ENGINE = "tensorflow"
RUNNER = "TFDistributeRunner"


def tf_config(workers: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of ``workers`` (``host:port``)."""
    return json.dumps({"cluster": {"worker": list(workers)},
                       "task": {"type": "worker", "index": index}})


def worker_env(base: dict, workers: list[str], index: int, _local: int = 0,
               _layout: list[int] | None = None) -> dict:
    """The environment of worker ``index`` (one worker per place)."""
    # Keras 2 (tf-keras) as tf.keras where Keras 3 is the default and tf-keras
    # is installed, unless the environment chose: Keras 3's fit under this
    # strategy does not sum the workers' gradients (keras-team/keras#19891;
    # TF 2.16.1, Keras 3.2.1), and with Keras 3.5.0 on TF 2.17.0 (runtime
    # 16.4 LTS ML) it fails outright: "Attempt to convert a value (PerReplica
    # ...)" for a tf.data.Dataset, "Unrecognized data type" for the dataset
    # distribute_datasets_from_function returns (keras-team/keras#20585,
    # tensorflow#72388). With tf-keras 2.17 both train as one process does.
    env = without_foreign_place({**compat.worker_env(), **base})
    env["TF_CONFIG"] = tf_config(workers, index)
    return env


# A place (and a port) per worker.
TF_ENGINE = Engine(name=ENGINE, runner=RUNNER, worker_env=worker_env,
                   local_layout=lambda num_proc: [1] * num_proc)


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


class TFLocalBackend(BarrierLocalBackend):
    """Worker processes on the driver machine, on 127.0.0.1.

    Args:
        grace: As `BarrierLocalBackend`'s.
        worker_gpus: The GPU ids each worker gets, all of them its own (an
            empty list: none, CPU training); None: the device plan's one GPU
            per worker where the host has GPUs.
    """

    name = "tf-local"

    def __init__(self, grace: float = 15.0, worker_gpus: list[list[str]] | None = None):
        super().__init__(TF_ENGINE, grace, worker_gpus)


class TFSparkBackend(BarrierSparkBackend):
    """Workers as the tasks of one Spark barrier stage, one worker per task.

    Args: as `BarrierSparkBackend`'s;
    ``worker_gpus``: how many of its task's GPUs each rank's worker gets (0:
    none, CPU training; None: the task's GPUs for the device plan).
    """

    name = "tf-spark"

    def __init__(self, spark=None, slot_wait: float = 10.0, grace: float = 15.0,
                 worker_gpus: list[int] | None = None, gpu_resource: str = "gpu"):
        super().__init__(TF_ENGINE, spark, slot_wait, grace, worker_gpus, gpu_resource)
