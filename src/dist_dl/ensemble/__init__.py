"""Spark-partitioned ensembles: one model per random partition, combined.

Driver code is in ``driver.py``; what runs inside Spark tasks is in
``task.py``; ``members.py`` (members, combining) is used on both sides and by
the MLflow model (``pyfunc.py``); ``memory.py`` checks on the driver that a
partition fits a task's memory.
"""
from dist_dl.ensemble.driver import Ensemble, train_ensemble
from dist_dl.ensemble.memory import PartitionMemoryError, estimate_partition_memory

__all__ = ["train_ensemble", "Ensemble", "PartitionMemoryError", "estimate_partition_memory"]
