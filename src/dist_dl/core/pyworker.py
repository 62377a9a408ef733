"""What the library's functions that run in Spark's Python workers call first.

Spark reuses a Python worker for many tasks, and PySpark spends two fixed
costs on every task of a reused worker that grow with what the worker has
imported (pandas, pyarrow, scikit-learn, TensorFlow...), not with the task:

- before the task, ``importlib.invalidate_caches()`` (pyspark/worker.py
  ``main`` in 3.5, worker_util.py in 4.0; SPARK-54744 makes it conditional in
  later Spark). On Python 3.10 and 3.11 that makes every zip importer re-read
  its archive's whole directory, in Python, at once (cpython gh-103200: lazy
  only from 3.12), and a worker holds one zip importer per package it
  imported from ``pyspark.zip`` (about 800 entries), each of which re-reads it;
- after the task, a full ``gc.collect()`` (pyspark/daemon.py, the reused
  worker's loop), which walks every object the worker tracks (about 260,000
  with pyspark, pandas, pyarrow and scikit-learn imported).

Together they cost a few tenths of a second per task on Python 3.11 and
PySpark 3.5 (figures in benchmarks/RESULTS.md, scoring and ensemble rows).
`prepare_python_worker()` removes both for the later tasks of its worker.
"""
from __future__ import annotations

import gc
import os
import sys
import time

__all__ = ["prepare_python_worker", "FULL_COLLECTION_SECONDS", "SWITCH"]

# The Python workers' environment variable that turns
# prepare_python_worker off ("0"): Spark's executors pass on their own
# environment and ``spark.executorEnv.*``. For a worker that must collect
# every task's garbage at once, and for the scoring benchmark's baseline.
SWITCH = "DIST_DL_PREPARE_PYTHON_WORKER"

_MARK = "_dist_dl_rereads_changed_archives_only"
# At most this long between two full collections of a worker (see
# _skip_frozen_objects_between_tasks).
FULL_COLLECTION_SECONDS = 60.0
# When this worker's objects were last frozen after a full collection.
_frozen_since: float | None = None


def _archive_stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _reread_changed_archives_only() -> None:
    import zipimport

    original = getattr(zipimport.zipimporter, "invalidate_caches", None)
    if sys.version_info >= (3, 12) or original is None or getattr(original, _MARK, False):
        return

    def invalidate_caches(self):
        stamp = _archive_stamp(self.archive)
        if stamp is not None and getattr(self, "_dist_dl_read_stamp", None) == stamp:
            return
        original(self)
        self._dist_dl_read_stamp = stamp

    setattr(invalidate_caches, _MARK, True)
    invalidate_caches.__doc__ = original.__doc__
    zipimport.zipimporter.invalidate_caches = invalidate_caches


def _skip_frozen_objects_between_tasks() -> None:
    # Objects alive when a task starts (modules, the worker's caches) are
    # frozen (gc.freeze): the collection after the task, and the automatic
    # ones during it, skip them. Freezing never frees or keeps alive
    # anything by itself (reference counting still frees what the program
    # drops); what it defers is finding reference cycles among frozen objects
    # that became garbage later. So at least once a minute a task starts with
    # everything unfrozen, and the collection after it is a full one.
    global _frozen_since
    now = time.monotonic()
    if _frozen_since is not None and now - _frozen_since >= FULL_COLLECTION_SECONDS:
        gc.unfreeze()
        _frozen_since = None
        return
    gc.freeze()
    if _frozen_since is None:
        _frozen_since = now


def prepare_python_worker() -> None:
    """Call first in a function Spark runs in a Python worker (a task).

    Makes this process's zip importers re-read an archive on
    ``invalidate_caches`` only when it changed (modification time, size or
    inode), as Python 3.12 effectively does: an archive replaced on disk is
    still re-read. And freezes the objects alive now, so that the full
    collection PySpark runs after the task skips them, with a full
    collection at least every ``FULL_COLLECTION_SECONDS``. Does nothing
    outside a Spark task, or where the environment variable ``SWITCH`` is
    ``0``.
    """
    if os.environ.get(SWITCH) == "0":
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:  # not in a Spark task (a test calling the function)
        return
    _reread_changed_archives_only()
    _skip_frozen_objects_between_tasks()
