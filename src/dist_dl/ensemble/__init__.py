"""Spark-partitioned ensembles: one model per random partition, combined.

Driver code is in ``driver.py``; what runs inside Spark tasks is in
``task.py``; ``members.py`` (members, combining) is used on both sides and by
the MLflow model (``pyfunc.py``); ``memory.py`` checks on the driver that a
partition fits a task's memory.
"""
from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "train_ensemble": "dist_dl.ensemble.driver",
    "Ensemble": "dist_dl.ensemble.driver",
    "PartitionMemoryError": "dist_dl.ensemble.memory",
    "estimate_partition_memory": "dist_dl.ensemble.memory",
}

__all__ = ["train_ensemble", "Ensemble", "PartitionMemoryError", "estimate_partition_memory"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
