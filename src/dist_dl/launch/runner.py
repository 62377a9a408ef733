"""``HorovodRunner``: the launcher data scientists know from Databricks; and
``TFDistributeRunner``, the same for tf.distribute's
MultiWorkerMirroredStrategy, where Horovod is not installed."""
from __future__ import annotations

import uuid
from typing import Any, Callable

import cloudpickle

from dist_dl.core.compat import pickle_tensorflow_lazy_modules_by_name
from dist_dl.core.optional import require_installed
from dist_dl.launch import weights
from dist_dl.launch.backend import Backend, select_backend
from dist_dl.launch.protocol import VERBOSITIES, DriverSink
from dist_dl.launch.worker import WorkerOptions

__all__ = ["HorovodRunner", "TFDistributeRunner", "BACKEND_NAMES"]

# The names of where workers run, as ``TrainConfig.backend`` spells them.
BACKEND_NAMES = ("auto", "local", "spark")


class HorovodRunner:
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
            :class:`dist_dl.launch.backend.Backend` protocol (code, not
            configuration: a launcher of your own), used as it is with
            ``abs(np)`` workers.
        check_weights: When the function returns, every worker reports the
            Keras models it trained, and a model whose weights differ from
            rank 0's fails the job with ``WorkersDiverged`` (a function
            without ``hvd.DistributedOptimizer`` or without the broadcast of
            rank 0's weights: each worker trained its own copy); see
            ``dist_dl.launch.weights``. False turns the check off.
    """

    engine = "horovod"
    # The package the workers' framework is (checked on the driver before they
    # start; None: Horovod, which select_backend checks, with TensorFlow or torch).
    framework: str | None = None
    # Whether the workers' models are expected to be built under a
    # multi-worker strategy (tf.distribute), for the weights check's messages.
    strategy_models = False

    def __init__(self, *, np: int, driver_log_verbosity: str | None = None,
                 timeout: float | None = None, threads_per_worker: int | None = None,
                 pin_cpus: bool = False, env: dict | None = None, spark=None,
                 backend: str | Backend = "auto", check_weights: bool = True):
        name = type(self).__name__
        # The workers report the Keras models they trained, for the driver to
        # compare with rank 0's (dist_dl.launch.weights).
        self.check_weights = bool(check_weights)
        if isinstance(np, bool) or not isinstance(np, int) or np == 0:
            raise ValueError(
                f"{name}: np must be a non-zero integer: np > 0 runs np Spark tasks, np < 0 runs "
                f"-np processes on the driver; got {np!r}")
        if driver_log_verbosity is None:
            driver_log_verbosity = "all" if np < 0 else "log_callback_only"
        if driver_log_verbosity not in VERBOSITIES:
            raise ValueError(f"{name}: driver_log_verbosity must be one of {VERBOSITIES}, got "
                             f"{driver_log_verbosity!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"{name}: timeout must be a positive number of seconds or None, "
                             f"got {timeout!r}")
        if threads_per_worker is not None and (not isinstance(threads_per_worker, int)
                                               or threads_per_worker < 1):
            raise ValueError(f"{name}: threads_per_worker must be a positive integer or None, "
                             f"got {threads_per_worker!r}")
        backend = _checked_backend(backend, np)
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity
        self.timeout = timeout
        self.threads_per_worker = threads_per_worker
        self.pin_cpus = pin_cpus
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self._spark = spark
        self._backend = backend

    def run(self, main: Callable[..., Any], **kwargs) -> Any:
        """Run ``main(**kwargs)`` on every worker; return rank 0's return value.

        Raises:
            WorkerError: a worker raised (the error names its rank and carries
                its traceback) or died; no worker is left running.
            JobTimeout: the job outlived ``timeout``.
            NotEnoughSlots: ``np`` exceeds the cluster's task slots.
            ImportError: what the workers need is not installed here: Horovod
                (``HorovodRunner``), TensorFlow (``TFDistributeRunner``) or
                torch (``TorchDistributor``); raised before any worker starts.
        """
        if not callable(main):
            raise TypeError(f"{self._label()}.run: main must be a function, got "
                            f"{type(main).__name__}")
        if self.framework is not None:
            require_installed(self.framework, type(self).__name__)
        # A notebook's `from tensorflow import keras`, captured by main, is a
        # module object TensorFlow loads lazily: shipped by its name.
        pickle_tensorflow_lazy_modules_by_name()
        try:
            cloudpickle.dumps((main, kwargs))
        except Exception as exc:
            raise TypeError(
                f"{self._label()}.run: main and its keyword arguments must be picklable to reach "
                f"the workers "
                f"({exc}); create unpicklable objects (sessions, locks, open files) inside main"
            ) from exc
        backend = self._backend or select_backend(self.num_processor, self._spark, self.engine)
        options = WorkerOptions(job_id=uuid.uuid4().hex[:12], timeout=self.timeout,
                                threads_per_worker=self.threads_per_worker,
                                pin_cpus=self.pin_cpus, env=self.env, engine=self.engine,
                                runner=self._label(), check_weights=self.check_weights)
        sink = DriverSink(self.driver_log_verbosity)
        result = backend.run(main, kwargs, abs(self.num_processor), options, sink)
        if self.check_weights:
            weights.check(sink.records, abs(self.num_processor), self._label(), self._sync_fix,
                          strategy=self.strategy_models)
        return result

    def _label(self) -> str:
        """This runner as its user wrote it, for messages."""
        return f"{type(self).__name__}(np={self.num_processor})"

    # What to change when the workers did not train one model (weights.check).
    _sync_fix = ("Wrap the optimizer in hvd.DistributedOptimizer (its gradients averaged over "
                 "the workers) and start from rank 0's weights "
                 "(hvd.callbacks.BroadcastGlobalVariablesCallback(0) in fit's callbacks, or "
                 "hvd.broadcast_variables(model.variables, root_rank=0) in a loop of your own).")


def _checked_backend(backend, np: int):
    """The launcher object given, or None for a name (checked against ``np``)."""
    if backend is None:
        return None
    if isinstance(backend, str):
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES} or a launcher object, "
                             f"got {backend!r}")
        if (backend == "local" and np > 0) or (backend == "spark" and np < 0):
            where = "processes on the driver" if np < 0 else "Spark tasks"
            raise ValueError(f"backend={backend!r} but np={np} runs {abs(np)} {where}: pass "
                             f"np={-np} for backend={backend!r}, or leave backend out")
        return None
    if not callable(getattr(backend, "run", None)):
        raise TypeError(f"backend must be a name {BACKEND_NAMES} or a launcher object with a "
                        f"run(fn, kwargs, num_proc, options, sink) method, "
                        f"got {type(backend).__name__}")
    return backend


class TFDistributeRunner(HorovodRunner):
    """Runs a training function on ``np`` workers that form one
    ``tf.distribute.MultiWorkerMirroredStrategy`` job: the counterpart of
    :class:`HorovodRunner` on runtimes without Horovod (Databricks Runtime
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
    (``dist_dl.launch.weights``): weights that differ (a model built outside
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

    # What to change when the workers did not train one model (weights.check).
    _sync_fix = ("Create the strategy first in the function (strategy = "
                 "dist_dl.launch.multi_worker_strategy()) and build and compile the model under "
                 "`with strategy.scope():`.")
