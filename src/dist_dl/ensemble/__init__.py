"""Spark-partitioned ensembles: one model per random partition, combined.

Driver code is in ``driver.py``; what runs inside Spark tasks is in
``task.py``; ``members.py`` (members, combining) is used on both sides and by
the MLflow model (``pyfunc.py``).
"""
from dist_dl.ensemble.driver import (Ensemble, PartitionMemoryError, estimate_partition_memory,
                                     train_ensemble)

__all__ = ["train_ensemble", "Ensemble", "PartitionMemoryError", "estimate_partition_memory"]
