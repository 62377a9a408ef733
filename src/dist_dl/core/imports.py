"""Imports that threads of one driver must not race on.

MLflow's ``Param(key, value)``, built for every logged parameter, looks at
``pyspark.ml.param.Param`` whenever ``"pyspark.ml"`` is in ``sys.modules``,
and Horovod's Spark runner imports ``pyspark.ml``. When one thread of a
driver imports ``pyspark.ml`` (a Horovod job starting) while another logs
parameters (a tf.distribute training, an ensemble), the second thread waits
for ``pyspark.ml.param`` alone and then reads ``pyspark.ml`` off the
half-imported package: "cannot access submodule 'ml' of module 'pyspark'
(most likely due to a circular import)". So every driver path of this
library that logs to MLflow or starts Horovod on Spark calls
:func:`spark_ml_imported` first: ``pyspark.ml`` is imported whole, once, by
one thread, and the others wait for it.
"""
from __future__ import annotations

import importlib
import threading

__all__ = ["spark_ml_imported"]

_LOCK = threading.Lock()
_DONE = False


def spark_ml_imported() -> None:
    """Return once ``pyspark.ml`` is imported whole (at once where PySpark is
    not installed: nothing then imports it)."""
    global _DONE
    if _DONE:
        return
    with _LOCK:
        if not _DONE:
            try:
                importlib.import_module("pyspark.ml")
            except ImportError:
                pass
            _DONE = True
