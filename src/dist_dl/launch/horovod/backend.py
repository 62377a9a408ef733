"""Which Horovod backend runs a job, and whether Horovod is here at all."""
from __future__ import annotations

import importlib.util

from dist_dl.core.optional import installed, torch_only
from dist_dl.launch.core.backend import Backend

__all__ = ["select_backend", "auto_engine", "databricks_runner_available"]


def databricks_runner_available() -> bool:
    """True on a Databricks ML runtime that still ships ``sparkdl.HorovodRunner``."""
    try:
        return importlib.util.find_spec("sparkdl") is not None and \
            hasattr(importlib.import_module("sparkdl"), "HorovodRunner")
    except ImportError:
        return False


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
    'horovod'" (launch/horovod/spark.py's ``import horovod.spark``)."""
    if not installed("horovod"):
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


def select_backend(np: int, spark=None) -> Backend:
    """A Horovod job's backend. ``np < 0``: processes on this machine. ``np >
    0``: Spark tasks, through Databricks' own HorovodRunner where it exists,
    else Horovod's Spark runner.

    Raises:
        ImportError: Horovod is not installed (naming what to use instead).
    """
    if np < 0 or not databricks_runner_available():  # sparkdl brings its own Horovod
        _require_horovod()
    if np < 0:
        from dist_dl.launch.horovod.local import LocalBackend

        return LocalBackend()
    if databricks_runner_available():
        from dist_dl.launch.horovod.sparkdl import DatabricksBackend

        return DatabricksBackend()
    from dist_dl.launch.horovod.spark import SparkBackend

    return SparkBackend(spark)
