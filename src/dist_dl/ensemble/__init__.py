"""Spark-partitioned ensembles: one model per random partition, combined.

Driver code is in ``driver.py``; what runs inside Spark tasks is in
``task.py``; ``members.py`` (members, combining) is used on both sides and by
the MLflow model (``pyfunc.py``); ``memory.py`` checks on the driver that a
partition fits a task's memory.
"""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "train_ensemble": "dist_dl.ensemble.driver",
    "Ensemble": "dist_dl.ensemble.driver",
    "PartitionMemoryError": "dist_dl.ensemble.memory",
    "estimate_partition_memory": "dist_dl.ensemble.memory",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.ensemble.driver import Ensemble, train_ensemble  # noqa: F401
    from dist_dl.ensemble.memory import PartitionMemoryError, estimate_partition_memory  # noqa: F401

__all__ = ["train_ensemble", "Ensemble", "PartitionMemoryError", "estimate_partition_memory"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
