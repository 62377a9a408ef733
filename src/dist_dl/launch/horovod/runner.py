"""``HorovodRunner``: the launcher data scientists know from Databricks."""
from __future__ import annotations

from dist_dl.launch.core.backend import Backend
from dist_dl.launch.horovod.backend import select_backend
from dist_dl.launch.runners.base import Runner

__all__ = ["HorovodRunner"]


class HorovodRunner(Runner):
    """Runs a training function on ``np`` workers that form one Horovod job.

    Compatible with Databricks' ``sparkdl.HorovodRunner``: same constructor
    arguments and ``run(main, **kwargs)``; the rest are optional extras.

    Args:
        np: ``np > 0``: that many Spark tasks, started together (fails within
            seconds if the cluster has fewer task slots). ``np < 0``: ``-np``
            processes on the driver machine, Gloo on loopback (development,
            single-node multi-GPU). On a Databricks runtime that ships
            ``sparkdl.HorovodRunner``, ``np > 0`` delegates to it.
        driver_log_verbosity: ``"log_callback_only"`` (the default for
            ``np > 0``): only ``log_to_driver`` messages reach the driver.
            ``"all"`` (the default for ``np < 0``, as sparkdl streams local
            workers' output): every line of every worker's stdout and stderr,
            prefixed with its rank.
        timeout: Seconds the job may run; a worker still running then stops,
            and ``run`` raises ``JobTimeout``. None (default): no limit.
        threads_per_worker: CPU threads for each worker (TensorFlow intra-op,
            OpenMP, BLAS). Default: the host's cores shared evenly among the
            workers on it.
        pin_cpus: Pin each worker to its own share of the host's cores.
        env: Extra environment variables for every worker.
        spark: SparkSession for ``np > 0`` (default: the active one).
        backend: Where the workers run, as in ``TrainConfig.backend``: a name,
            ``"auto"`` (default; the sign of ``np`` decides, as in sparkdl),
            ``"local"`` (needs ``np < 0``) or ``"spark"`` (needs ``np >
            0``); or a launcher object of the
            `dist_dl.launch.core.backend.Backend` protocol (code, not
            configuration: a launcher of your own), used as it is with
            ``abs(np)`` workers.
        check_weights: When the function returns, every worker reports the
            Keras models it trained, and a model whose weights differ from
            rank 0's fails the job with ``WorkersDiverged`` (a function
            without ``hvd.DistributedOptimizer`` or without the broadcast of
            rank 0's weights: each worker trained its own copy); see
            ``dist_dl.launch.core.weights``. False turns the check off.
    """

    engine = "horovod"

    # Its own signature, so that Python's argument errors name this class.
    def __init__(self, *, np: int, driver_log_verbosity: str | None = None,
                 timeout: float | None = None, threads_per_worker: int | None = None,
                 pin_cpus: bool = False, env: dict | None = None, spark=None,
                 backend: str | Backend = "auto", check_weights: bool = True):
        super().__init__(np=np, driver_log_verbosity=driver_log_verbosity, timeout=timeout,
                         threads_per_worker=threads_per_worker, pin_cpus=pin_cpus, env=env,
                         spark=spark, backend=backend, check_weights=check_weights)

    def _default_backend(self) -> Backend:
        return select_backend(self.num_processor, self._spark)

    # What to change when the workers did not train one model (weights.check).
    _sync_fix = ("Wrap the optimizer in hvd.DistributedOptimizer (its gradients averaged over "
                 "the workers) and start from rank 0's weights "
                 "(hvd.callbacks.BroadcastGlobalVariablesCallback(0) in fit's callbacks, or "
                 "hvd.broadcast_variables(model.variables, root_rank=0) in a loop of your own).")
