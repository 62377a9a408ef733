"""Imports that threads of one driver must not race on.

MLflow's ``Param(key, value)``, built for every logged parameter, looks at
``pyspark.ml.param.Param`` whenever ``"pyspark.ml"`` is in ``sys.modules``,
and Horovod's Spark runner imports ``pyspark.ml``. When one thread of a
driver imports ``pyspark.ml`` (a Horovod job starting) while another logs
parameters (a tf.distribute training, an ensemble), the second thread waits
for ``pyspark.ml.param`` alone and then reads ``pyspark.ml`` off the
half-imported package: "cannot access submodule 'ml' of module 'pyspark'
(most likely due to a circular import)". So every driver path of this
library that logs to MLflow calls `spark_ml_imported()` first: importing
the package itself waits for whichever thread is importing it, until it is
whole.
"""
from __future__ import annotations

import functools
import importlib

__all__ = ["spark_ml_imported"]


@functools.lru_cache(maxsize=None)
def spark_ml_imported() -> None:
    """Return once ``pyspark.ml`` is imported whole (at once where PySpark is
    not installed: nothing then imports it)."""
    try:
        importlib.import_module("pyspark.ml")
    except ImportError:
        pass
