"""``MirroredStrategyRunner``: a drop-in for spark-tensorflow-distributor's
runner of the same name (deprecated, and not installed from Databricks
Runtime 16.0 ML), on the library's tf.distribute launcher.

Semantics kept from the original: ``num_slots`` counts GPUs (``use_gpu=True``,
the default: ``ceil(num_slots / spark.task.resource.<gpu>.amount)`` Spark
tasks, each worker given its share of its task's GPUs) or Spark tasks
(``use_gpu=False``); ``local_mode=True`` trains in one process on the driver
with ``num_slots`` of its GPUs (on CPU, ``num_slots`` must be 1);
``use_custom_strategy=False`` builds a ``MultiWorkerMirroredStrategy`` and
calls the function inside its scope; ``run`` returns rank 0's (the chief's)
return value; a cluster with TLS (``spark.ssl.enabled``) is refused unless
``tensorflow.spark.distributor.ignoreSsl`` is true.

What the launcher adds: ``num_slots < 0`` runs ``-num_slots`` processes on the
driver; task slots and GPU settings are checked before the barrier stage; a
failing worker's error reaches the driver with its rank, host and traceback;
``timeout``; nothing left running; the workers' output streamed to the driver
with rank prefixes; tf-keras as ``tf.keras`` where Keras 3 is the default;
modules shipped with ``sc.addPyFile`` import in the workers; the weights
check of `TFDistributeRunner`.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

from dist_dl.core.optional import require_installed
from dist_dl.launch.runners.base import Runner
from dist_dl.launch.core.slots import (LazySpark, check_encryption, check_task_slots, driver_gpus,
                                        split, task_gpu_amount)

__all__ = ["MirroredStrategyRunner"]

IGNORE_SSL_KEY = "tensorflow.spark.distributor.ignoreSsl"


def _in_strategy_scope(train_fn: Callable[..., Any], /, **kwargs) -> Any:
    """A worker's call of ``train_fn`` for ``use_custom_strategy=False``:
    inside the scope of the job's multi-worker strategy."""
    from dist_dl.launch.engines.tensorflow import multi_worker_strategy

    strategy = multi_worker_strategy()
    with strategy.scope():
        return train_fn(**kwargs)


class MirroredStrategyRunner(LazySpark, Runner):
    """Runs a TensorFlow training function on Spark tasks (or on the driver)
    as one ``MultiWorkerMirroredStrategy`` job; code written for
    ``spark_tensorflow_distributor.MirroredStrategyRunner`` runs with only
    its import changed.

    Args:
        num_slots: With ``use_gpu=True``: the GPUs to train on in all, over
            ``ceil(num_slots / spark.task.resource.<gpu_resource_name>.amount)``
            Spark tasks, each worker seeing its share of its task's GPUs
            (``CUDA_VISIBLE_DEVICES``). With ``use_gpu=False``: the number of
            Spark tasks, each a CPU worker. With ``local_mode=True``: the
            driver's GPUs for its one process (1 on CPU). Negative:
            ``-num_slots`` worker processes on the driver (one GPU each with
            ``use_gpu=True``). Not 0.
        local_mode: Train in one process on the driver.
        use_gpu: Train on GPUs (Spark's GPU scheduling must be configured for
            Spark tasks); False: CPU only, the workers see no GPU.
        gpu_resource_name: The GPU resource's name in Spark's configuration.
        use_custom_strategy: False: the runner creates the strategy and calls
            the function inside ``strategy.scope()``, so single-worker Keras
            code trains distributed. True: the function creates its own
            ``tf.distribute.MultiWorkerMirroredStrategy``.
        driver_log_verbosity: ``"all"`` (default): every line the workers
            print reaches the driver, prefixed with its rank;
            ``"log_callback_only"``: only ``log_to_driver`` messages.
        timeout: Seconds the job may run (None: no limit); then ``run``
            raises ``JobTimeout`` and no worker is left.
        threads_per_worker, pin_cpus, env, spark: As ``TFDistributeRunner``'s.
        check_weights: Compare the Keras models the workers trained with rank
            0's at the end of the job (see ``TFDistributeRunner``).

    Raises:
        ValueError: ``num_slots`` is 0; GPU training on Spark tasks without
            ``spark.task.resource.<gpu_resource_name>.amount``; more local
            slots than the driver has GPUs; local CPU training with
            ``num_slots`` > 1.
    """

    engine = "tensorflow"
    framework = "tensorflow"
    strategy_models = True

    def __init__(self, num_slots: int | None = None, *, local_mode: bool = False,
                 use_gpu: bool = True, gpu_resource_name: str = "gpu",
                 use_custom_strategy: bool = False, driver_log_verbosity: str = "all",
                 timeout: float | None = None, threads_per_worker: int | None = None,
                 pin_cpus: bool = False, env: dict | None = None, spark=None,
                 check_weights: bool = True):
        name = type(self).__name__
        if num_slots is None:
            raise TypeError(f"{name}() needs num_slots: the GPUs (use_gpu=True) or CPU Spark "
                            f"tasks (use_gpu=False) to train on")
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots == 0:
            raise ValueError(
                f"{name}: num_slots is {num_slots!r}, and must be a non-zero integer: the GPUs "
                f"(use_gpu=True) or CPU Spark tasks (use_gpu=False) to train on, or -N for N "
                f"processes on the driver")
        self.num_slots = num_slots
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.gpu_resource_name = gpu_resource_name
        self.use_custom_strategy = bool(use_custom_strategy)
        self._session = spark
        self._distributed = num_slots > 0 and not self.local_mode
        if self._distributed:
            from dist_dl.launch.engines.tensorflow import TFSparkBackend

            counts = self._task_gpus() if self.use_gpu else [0] * num_slots
            np = len(counts)
            backend = TFSparkBackend(self._spark_session(), worker_gpus=counts,
                                     gpu_resource=gpu_resource_name)
        else:
            from dist_dl.launch.engines.tensorflow import TFLocalBackend

            gpus = self._local_gpus()
            np = -len(gpus)
            backend = TFLocalBackend(worker_gpus=gpus)
        super().__init__(np=np, driver_log_verbosity=driver_log_verbosity, timeout=timeout,
                         threads_per_worker=threads_per_worker, pin_cpus=pin_cpus, env=env,
                         spark=spark, backend=backend, check_weights=check_weights)

    # -- Spark --------------------------------------------------------------

    def _task_gpus(self) -> list[int]:
        """The GPUs each Spark task's worker gets, one entry per task."""
        amount = task_gpu_amount(self._spark_session(), self.gpu_resource_name, self._label())
        self._gpus_per_task = amount
        return split(self.num_slots, math.ceil(self.num_slots / amount))

    def _local_gpus(self) -> list[list[str]]:
        """The GPU ids of each process on the driver, one entry per process."""
        processes = abs(self.num_slots) if self.num_slots < 0 else 1
        if not self.use_gpu:
            if self.num_slots > 1:
                raise ValueError(
                    f"{self._label()}: local CPU training runs one process on the driver, so "
                    f"num_slots must be 1 with local_mode=True and use_gpu=False; for "
                    f"{self.num_slots} processes on the driver use num_slots=-{self.num_slots}")
            return [[] for _ in range(processes)]
        owned = self._driver_gpus()
        wanted = abs(self.num_slots)
        if not owned:
            raise ValueError(
                f"{self._label()}: GPU training (use_gpu=True, the default) on the driver, and "
                f"the driver has no GPU (no spark.driver.resource.{self.gpu_resource_name} and "
                f"none visible): pass use_gpu=False to train on CPU")
        if wanted > len(owned):
            raise ValueError(
                f"{self._label()}: {wanted} GPU slots requested for training on the driver, "
                f"and the driver has {len(owned)} GPU(s) ({','.join(owned)}): use num_slots <= "
                f"{len(owned)}")
        if self.num_slots < 0:
            return [[gpu] for gpu in owned[:wanted]]
        return [owned[:wanted]]

    def _driver_gpus(self) -> list[str]:
        """The driver's GPUs (Spark's GPU resource, else those visible)."""
        return driver_gpus(self._session, self.gpu_resource_name)

    def get_num_tasks(self) -> int:
        """The number of workers the job runs: Spark tasks, or processes on
        the driver (``local_mode``, ``num_slots < 0``)."""
        return abs(self.num_processor)

    def _check_encryption(self) -> None:
        check_encryption(self._spark_session(), self._label(), IGNORE_SSL_KEY, "TensorFlow")

    def _check_slots(self, wait: float = 10.0) -> None:
        """Fail within seconds, saying which num_slots fits, where the
        cluster cannot run all the tasks at once."""
        check_task_slots(
            self._spark_session(), self.get_num_tasks(), self._label(), count="num_slots",
            per_task=self._gpus_per_task if self.use_gpu else 1,
            unit="GPU slots" if self.use_gpu else "CPU slots (Spark tasks)",
            on_driver=f"num_slots=-{self.num_slots}", wait=wait)

    # -- running ------------------------------------------------------------

    def _label(self) -> str:
        local = ", local_mode=True" if self.local_mode else ""
        return f"{type(self).__name__}(num_slots={self.num_slots}{local})"

    @property
    def _sync_fix(self) -> str:
        if self.use_custom_strategy:
            return ("Build and compile the model under `with strategy.scope():` of the "
                    "MultiWorkerMirroredStrategy the function creates, or let the runner create "
                    "it (use_custom_strategy=False).")
        return ("The runner calls the function inside its strategy's scope "
                "(use_custom_strategy=False): build the model in the function, not in a "
                "strategy or thread of its own.")

    def run(self, train_fn: Callable[..., Any], **kwargs) -> Any:
        """Run ``train_fn(**kwargs)`` on every worker (inside the strategy's
        scope unless ``use_custom_strategy``) and return rank 0's (the
        chief's) return value.

        Raises:
            WorkerError: a worker raised or died (its rank, host, traceback).
            JobTimeout: the job outlived ``timeout``.
            NotEnoughSlots: the cluster cannot run the tasks at once.
            WorkersDiverged: the workers ended with different weights.
            RuntimeError: the cluster has TLS on and
                ``tensorflow.spark.distributor.ignoreSsl`` is not true.
            ImportError: TensorFlow is not installed here (before any worker
                starts).
        """
        if not callable(train_fn):
            raise TypeError(f"{self._label()}.run: train_fn must be a function, got "
                            f"{type(train_fn).__name__}")
        require_installed(self.framework, type(self).__name__)
        if self._distributed:
            self._check_encryption()
            self._check_slots()
        fn = train_fn if self.use_custom_strategy else functools.partial(_in_strategy_scope,
                                                                          train_fn)
        return super().run(fn, **kwargs)
