"""``TFDistributeRunner``: ``HorovodRunner``'s counterpart for tf.distribute's
MultiWorkerMirroredStrategy, where Horovod is not installed."""
from __future__ import annotations

from dist_dl.launch.core.backend import Backend
from dist_dl.launch.runners.base import Runner

__all__ = ["TFDistributeRunner"]


class TFDistributeRunner(Runner):
    """Runs a training function on ``np`` workers that form one
    ``tf.distribute.MultiWorkerMirroredStrategy`` job: the counterpart of
    `HorovodRunner` on runtimes without Horovod (Databricks Runtime
    16.0 ML and later). Same arguments and guarantees (task slots checked
    first, the failing rank's error on the driver, timeout, no process left,
    rank-prefixed output): ``np`` keeps sparkdl's name and sign convention
    (a count and a place in one number, unlike ``num_workers``, a count), so
    moving a job from one runner to the other changes the class name only.

    Every worker has ``TF_CONFIG`` set; ``main`` creates the strategy first
    (``dist_dl.launch.multi_worker_strategy()``: NCCL on GPUs, RING on CPU; or
    ``tf.distribute.MultiWorkerMirroredStrategy()`` itself) and builds and
    fits its model under ``strategy.scope()``. ``np > 0`` runs a Spark
    barrier stage of ``np`` tasks; ``np < 0`` runs ``-np`` processes on the
    driver, on 127.0.0.1.

    When the function returns, every worker reports the Keras models it
    trained and the driver compares them with rank 0's
    (``dist_dl.launch.core.weights``): weights that differ (a model built outside
    the strategy's scope: every worker trained its own) fail the job with
    ``WorkersDiverged``; a model every worker trained alone, ending alike,
    warns. ``check_weights=False`` turns this off.
    """

    engine = "tensorflow"
    framework = "tensorflow"
    strategy_models = True

    # Its own signature, so that Python's argument errors name this class.
    def __init__(self, *, np: int, driver_log_verbosity: str | None = None,
                 timeout: float | None = None, threads_per_worker: int | None = None,
                 pin_cpus: bool = False, env: dict | None = None, spark=None,
                 backend: str | Backend = "auto", check_weights: bool = True):
        super().__init__(np=np, driver_log_verbosity=driver_log_verbosity, timeout=timeout,
                         threads_per_worker=threads_per_worker, pin_cpus=pin_cpus, env=env,
                         spark=spark, backend=backend, check_weights=check_weights)

    def _default_backend(self) -> Backend:
        from dist_dl.launch.engines.tensorflow import TFLocalBackend, TFSparkBackend

        return TFLocalBackend() if self.num_processor < 0 else TFSparkBackend(self._spark)

    # What to change when the workers did not train one model (weights.check).
    _sync_fix = ("Create the strategy first in the function (strategy = "
                 "dist_dl.launch.multi_worker_strategy()) and build and compile the model under "
                 "`with strategy.scope():`.")
