"""``np > 0`` on a Databricks ML runtime that still ships HorovodRunner
(15.4 LTS ML is the last): delegate to ``sparkdl.HorovodRunner``, which knows
that platform's GPU clusters and log delivery."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import cloudpickle

from dist_dl.core import compat
from dist_dl.launch.core import worker
from dist_dl.launch.core.protocol import DriverSink
from dist_dl.launch.core.worker import WorkerOptions

__all__ = ["DatabricksBackend"]


def _run_delegated(options: WorkerOptions, payload: bytes, **kwargs) -> Any:
    """Runs in each worker started by sparkdl: its own log channel, our
    environment, device plan and deadline. The function is unpickled only
    here, after the Keras setting is in the environment: unpickling may
    import TensorFlow (a captured ``from tensorflow import keras``)."""
    from sparkdl.horovod import log_to_driver as sparkdl_log

    for name, value in compat.worker_env().items():
        os.environ.setdefault(name, value)
    worker._delegate_log = sparkdl_log
    return worker.run_worker(options, cloudpickle.loads(payload), kwargs)


class DatabricksBackend:
    """Delegates to ``sparkdl.HorovodRunner``; logs travel through sparkdl."""

    name = "databricks"

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        from sparkdl import HorovodRunner as DatabricksHorovodRunner

        options = dataclasses.replace(options, capture_output=False)
        runner = DatabricksHorovodRunner(np=num_proc, driver_log_verbosity=sink.verbosity)
        return runner.run(_DelegatedMain(options, fn), **kwargs)


class _DelegatedMain:
    """A picklable ``main(**kwargs)`` for sparkdl (a plain partial would hide
    the keyword arguments sparkdl passes through)."""

    def __init__(self, options: WorkerOptions, fn: Callable[..., Any]):
        self.options = options
        self.payload = cloudpickle.dumps(fn)

    def __call__(self, **kwargs) -> Any:
        return _run_delegated(self.options, self.payload, **kwargs)
