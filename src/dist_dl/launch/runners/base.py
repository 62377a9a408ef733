"""What every runner shares: ``Runner``, the base of ``HorovodRunner``,
``TFDistributeRunner``, ``MirroredStrategyRunner`` and ``TorchDistributor``
(siblings, none a subclass of another). It checks the arguments, that the
function and its arguments pickle, starts the job on a backend (the
runner's own, or a launcher object given), and checks the workers' weights
at the end; the failing rank named, the timeout and nothing left running
are the backends' (see `Backend`)."""
from __future__ import annotations

import uuid
from typing import Any, Callable

import cloudpickle

from dist_dl.core.compat import pickle_tensorflow_lazy_modules_by_name
from dist_dl.core.optional import require_installed
from dist_dl.launch.core import weights
from dist_dl.launch.core.backend import Backend
from dist_dl.launch.core.protocol import VERBOSITIES, DriverSink
from dist_dl.launch.core.worker import WorkerOptions

__all__ = ["Runner", "BACKEND_NAMES"]

# The names of where workers run, as ``TrainConfig.backend`` spells them.
BACKEND_NAMES = ("auto", "local", "spark")


class Runner:
    """Runs a training function on ``np`` workers that form one job of the
    runner's engine; the arguments are ``HorovodRunner``'s (see
    `HorovodRunner`). A subclass sets
    ``engine`` and ``_sync_fix`` and says where its workers run
    (`_default_backend()`)."""

    # The engine of the workers (``WorkerOptions.engine``).
    engine: str
    # The package the workers' framework is, checked on the driver before they
    # start (None: the runner checks its own, as HorovodRunner's backend does).
    framework: str | None = None
    # Whether the workers' models are expected to be built under a
    # multi-worker strategy (tf.distribute), for the weights check's messages.
    strategy_models = False
    # What to change when the workers did not train one model (weights.check).
    _sync_fix: str

    def __init__(self, *, np: int, driver_log_verbosity: str | None = None,
                 timeout: float | None = None, threads_per_worker: int | None = None,
                 pin_cpus: bool = False, env: dict | None = None, spark=None,
                 backend: str | Backend = "auto", check_weights: bool = True):
        name = type(self).__name__
        # The workers report the Keras models they trained, for the driver to
        # compare with rank 0's (dist_dl.launch.core.weights).
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
            ImportError: what the workers need is not installed here (Horovod,
                TensorFlow or torch); raised before any worker starts.
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
        backend = self._backend or self._default_backend()
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

    def _default_backend(self) -> Backend:
        """Where the workers run when the runner was given no launcher object:
        the engine's backend for the sign of ``np``."""
        raise NotImplementedError


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


