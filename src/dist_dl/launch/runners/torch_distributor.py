"""``TorchDistributor``: a drop-in for pyspark's
``pyspark.ml.torch.distributor.TorchDistributor``, on the library's launcher
(`dist_dl.launch.engines.torch`).

Semantics kept from the original: ``run(train_object, *args, **kwargs)``
takes a function (its return value on rank 0 comes back) or the path of a
script (run with ``args`` as its command-line arguments, as strings; keyword
arguments refused; returns None); every process gets torchrun's variables
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``), so ``torch.distributed.init_process_group()`` works
unchanged; ``local_mode=True`` runs ``num_processes`` processes on the driver,
each on the GPU of its local rank with ``use_gpu``; ``local_mode=False`` runs
a Spark barrier stage of ``ceil(num_processes /
spark.task.resource.gpu.amount)`` tasks with ``use_gpu``, ``num_processes``
tasks on CPU; a cluster with TLS (``spark.ssl.enabled``) is refused unless
``pytorch.spark.distributor.ignoreSsl`` is true.

What the launcher adds: task slots checked before the barrier stage
(``NotEnoughSlots``); a failing worker's error reaches the driver as
``WorkerError`` with its rank, host and traceback; ``timeout``
(``JobTimeout``); nothing left running; the workers' output streamed to the
driver with rank prefixes; Gloo and NCCL on the interface of each task's
cluster address; modules shipped with ``sc.addPyFile`` import in the workers.
The local mode needs no Spark.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable

from dist_dl.core.optional import require_installed
from dist_dl.launch.runners.base import Runner
from dist_dl.launch.core.slots import (LazySpark, check_encryption, check_task_slots, driver_gpus,
                                        split, task_gpu_amount)

__all__ = ["TorchDistributor"]

IGNORE_SSL_KEY = "pytorch.spark.distributor.ignoreSsl"
GPU_RESOURCE = "gpu"


class TorchDistributor(LazySpark, Runner):
    """Runs a PyTorch training function or script on ``num_processes``
    processes that form one ``torch.distributed`` job; code written for
    pyspark's ``TorchDistributor`` runs with only its import changed.

    Args:
        num_processes: The processes to train with: with ``use_gpu``, one
            per GPU.
        local_mode: True: the processes run on the driver (no Spark needed).
            False: on the tasks of a Spark barrier stage.
        use_gpu: Train on GPUs: each process uses the GPU of its local rank
            (Spark's GPU scheduling must be configured for Spark tasks:
            ``spark.task.resource.gpu.amount``). False: CPU only, the
            processes see no GPU.
        driver_log_verbosity: As ``HorovodRunner``'s; the default, ``"all"``,
            streams what every process prints (as pyspark's does), each line
            prefixed with its rank.
        timeout: Seconds the job may run (None: no limit); then ``run``
            raises ``JobTimeout``, with no process left.
        threads_per_worker: CPU threads for each process (default: the
            host's cores shared evenly among its processes).
        pin_cpus: Pin each process to its own share of the host's cores.
        env: Extra environment variables for every process.
        spark: SparkSession for ``local_mode=False`` (default: the active
            one); unused in local mode.

    Raises:
        ValueError: ``num_processes`` is not a positive integer; GPU training
            on Spark tasks without ``spark.task.resource.gpu.amount``; GPU
            training on a driver with fewer GPUs than ``num_processes``.
    """

    engine = "torch"
    framework = "torch"

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, *,
                 driver_log_verbosity: str = "all", timeout: float | None = None,
                 threads_per_worker: int | None = None, pin_cpus: bool = False,
                 env: dict | None = None, spark=None):
        name = type(self).__name__
        if (isinstance(num_processes, bool) or not isinstance(num_processes, int)
                or num_processes < 1):
            raise ValueError(f"{name}: num_processes is {num_processes!r}, and must be a positive "
                             f"integer: the processes to train with (one per GPU with use_gpu)")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self._session = spark
        self._gpus_per_task = 1
        if self.local_mode:
            from dist_dl.launch.engines.torch import local_backend

            backend = local_backend(self._local_gpus())
            np = -num_processes
        else:
            from dist_dl.launch.engines.torch import spark_backend

            if self.use_gpu:
                self._gpus_per_task = task_gpu_amount(self._spark_session(), GPU_RESOURCE, self._label())
                layout = split(num_processes, math.ceil(num_processes / self._gpus_per_task))
                gpus = layout
            else:
                layout, gpus = [1] * num_processes, [0] * num_processes
            np = len(layout)
            backend = spark_backend(self._spark_session(), layout, gpus, GPU_RESOURCE)
        self.num_tasks = abs(np)
        super().__init__(np=np, driver_log_verbosity=driver_log_verbosity, timeout=timeout,
                         threads_per_worker=threads_per_worker, pin_cpus=pin_cpus, env=env,
                         spark=spark, backend=backend)

    def _local_gpus(self) -> list[str]:
        """The driver's GPUs the processes see (none on CPU)."""
        if not self.use_gpu:
            return []
        owned = driver_gpus(self._session, GPU_RESOURCE)
        if not owned:
            raise ValueError(
                f"{self._label()}: GPU training (use_gpu=True, the default) on the driver, and "
                f"the driver has no GPU (no spark.driver.resource.{GPU_RESOURCE} and none "
                f"visible): pass use_gpu=False to train on CPU")
        if self.num_processes > len(owned):
            raise ValueError(
                f"{self._label()}: {self.num_processes} processes, one per GPU, and the driver "
                f"has {len(owned)} GPU(s) ({','.join(owned)}): use num_processes <= "
                f"{len(owned)}, or use_gpu=False")
        return owned[:self.num_processes]

    # What to change when the workers did not train one model (weights.check,
    # which compares the Keras models a function trained, if any).
    _sync_fix = ("Average the gradients over the processes and start every process from rank 0's "
                 "weights (for a Keras model, build it under a tf.distribute strategy's scope).")

    def _label(self) -> str:
        where = "" if self.local_mode else ", local_mode=False"
        return f"{type(self).__name__}(num_processes={self.num_processes}{where})"

    def _check_encryption(self) -> None:
        check_encryption(self._spark_session(), self._label(), IGNORE_SSL_KEY, "torch.distributed")

    def _check_slots(self, wait: float = 10.0) -> None:
        check_task_slots(
            self._spark_session(), self.num_tasks, self._label(), count="num_processes",
            per_task=self._gpus_per_task if self.use_gpu else 1,
            unit="GPU processes" if self.use_gpu else "CPU processes (Spark tasks)",
            on_driver="local_mode=True", wait=wait)

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run ``train_object`` on every process.

        Args:
            train_object: A function, called as ``train_object(*args,
                **kwargs)``; or the path of a Python script (on the driver in
                local mode, else where every Spark task can read it: DBFS,
                Volumes, workspace files), run as ``python path *args``.
            args: The function's positional arguments, or the script's
                command-line arguments (each passed as ``str(arg)``).
            kwargs: The function's keyword arguments (not for a script).

        Returns:
            Rank 0's return value for a function; None for a script.

        Raises:
            WorkerError: a process raised or died (its rank, host, traceback).
            JobTimeout: the job outlived ``timeout``.
            NotEnoughSlots: the cluster cannot run the tasks at once.
            ValueError: keyword arguments with a script; a script path that
                is not a file.
            RuntimeError: the cluster has TLS on and
                ``pytorch.spark.distributor.ignoreSsl`` is not true.
            ImportError: torch is not installed here (before any process starts).
        """
        from dist_dl.launch.engines.torch import call_function, run_script

        if isinstance(train_object, (str, os.PathLike)):
            fn = functools.partial(run_script, self._script(train_object, kwargs),
                                   tuple(str(a) for a in args))
        elif callable(train_object):
            fn = functools.partial(call_function, train_object, args, kwargs)
        else:
            raise TypeError(f"{self._label()}.run: train_object must be a function or the path "
                            f"of a Python script, got {type(train_object).__name__}")
        require_installed(self.framework, type(self).__name__)
        if not self.local_mode:
            self._check_encryption()
            self._check_slots()
        return super().run(fn)

    def _script(self, path, kwargs: dict) -> str:
        """The absolute path of the training script ``path``, checked."""
        from dist_dl.core.locations import local_path

        if kwargs:
            raise ValueError(
                f"{self._label()}.run: a script takes its arguments as command-line strings in "
                f"args (run(path, '--lr', '0.1')); keyword arguments are for a function, got "
                f"{sorted(kwargs)}")
        found = local_path(path, "the training script")
        if not os.path.isfile(found):
            raise ValueError(
                f"{self._label()}.run: the training script {os.fspath(path)!r} is not a file "
                f"here ({found}); give the path of a Python file"
                + ("" if self.local_mode else " that every Spark task can read (DBFS, Volumes, "
                                              "workspace files)"))
        return found
