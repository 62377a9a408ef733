"""The launcher interface: one ``run`` that starts N workers and returns rank
0's result, with one implementation per place workers can run.

Driver side. ``HorovodRunner`` picks a backend; tests call each one directly.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Callable, Protocol

from dist_dl.core.optional import require_installed
from dist_dl.launch.protocol import DriverSink
from dist_dl.launch.worker import WorkerOptions

__all__ = ["Backend", "select_backend", "auto_engine", "torch_only", "databricks_runner_available",
           "ENGINES"]


class Backend(Protocol):
    """Starts ``num_proc`` workers that form one job (Horovod, or tf.distribute)."""

    name: str

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        """Run ``fn(**kwargs)`` on every worker; return rank 0's result.

        Raises:
            WorkerError: a worker raised or died.
            JobTimeout: the job outlived ``options.timeout``.
            NotEnoughSlots: the cluster cannot run ``num_proc`` tasks at once.
        """


def databricks_runner_available() -> bool:
    """True on a Databricks ML runtime that still ships ``sparkdl.HorovodRunner``."""
    try:
        return importlib.util.find_spec("sparkdl") is not None and \
            hasattr(importlib.import_module("sparkdl"), "HorovodRunner")
    except ImportError:
        return False


# The engines of the runners over this interface (HorovodRunner, TFDistributeRunner);
# TorchDistributor brings its own backends (dist_dl.launch.torchdist).
ENGINES = ("horovod", "tensorflow")


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # hidden in sys.modules, or broken
        return False


def torch_only() -> bool:
    """TensorFlow is not installed here, and torch is (Databricks Runtime 19
    ML and later)."""
    return not _installed("tensorflow") and _installed("torch")


def auto_engine() -> str:
    """The engine this environment trains with: ``"horovod"`` where
    ``horovod.tensorflow`` imports; ``"torch"`` (PyTorch
    DistributedDataParallel) where TensorFlow is not installed and torch is
    (Databricks Runtime 19 ML and later); else ``"tensorflow"``
    (tf.distribute's MultiWorkerMirroredStrategy): Horovod is missing from
    Databricks Runtime 16.0 ML and later. Only the first imports anything
    (Horovod, and TensorFlow with it)."""
    if torch_only():
        return "torch"
    try:
        import horovod.tensorflow  # noqa: F401
    except Exception:  # ImportError, or a Horovod built against another TensorFlow
        return "tensorflow"
    return "horovod"


def _require_horovod() -> None:
    """Raise ImportError saying what to do where Horovod is missing. Databricks
    Runtime 16.0 ML and later (profile dbr-16.4-ml) ship no Horovod: there a
    Horovod job otherwise failed deep in a backend with a bare "No module named
    'horovod'" (launch/spark.py's ``import horovod.spark``). From Runtime 19 ML
    there is no TensorFlow either: the way out is then TorchDistributor."""
    if not _installed("horovod"):
        instead = ("run a PyTorch function with TorchDistributor (TensorFlow is not installed "
                   "here either: Databricks Runtime 19 ML and later ship none)"
                   if torch_only() else
                   "run the function with TFDistributeRunner (tf.distribute's "
                   "MultiWorkerMirroredStrategy; engine='tensorflow', which engine='auto' picks "
                   "here)")
        raise ImportError(
            "HorovodRunner needs Horovod, which is not installed here (Databricks Runtime 16.0 ML "
            f"and later ship none): {instead}, or install Horovod built with Gloo (see the "
            "Makefile)")


def select_backend(np: int, spark=None, engine: str = "horovod") -> Backend:
    """``np < 0``: processes on this machine. ``np > 0``: Spark tasks; for
    Horovod through Databricks' own HorovodRunner where it exists, else
    Horovod's Spark runner; for ``engine="tensorflow"`` a barrier stage.

    Args:
        engine: ``"horovod"``, ``"tensorflow"`` or ``"auto"`` (:func:`auto_engine`;
            where that is ``"torch"``, use TorchDistributor).
    """
    if engine == "auto":
        engine = auto_engine()
        if engine == "torch":
            require_installed("tensorflow", "engine='auto' of HorovodRunner and "
                                            "TFDistributeRunner (their engines are TensorFlow's)")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} or 'auto', got {engine!r}")
    if engine == "tensorflow":
        from dist_dl.launch.tfdist import TFLocalBackend, TFSparkBackend

        return TFLocalBackend() if np < 0 else TFSparkBackend(spark)
    if np < 0 or not databricks_runner_available():  # sparkdl brings its own Horovod
        _require_horovod()
    if np < 0:
        from dist_dl.launch.local import LocalBackend

        return LocalBackend()
    if databricks_runner_available():
        from dist_dl.launch.databricks import DatabricksBackend

        return DatabricksBackend()
    from dist_dl.launch.spark import SparkBackend

    return SparkBackend(spark)
