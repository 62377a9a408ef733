"""Process entry of a local worker: ``python -m dist_dl.launch.core._worker_main PAYLOAD RESULT``.

A module of its own so that ``dist_dl.launch.core.worker`` is imported once, as
itself: ``log_to_driver`` in user code must see the capture ``run_worker`` set.
"""
import atexit
import os
import sys

from dist_dl.launch.core.worker import main


def _exit(code: int) -> None:
    """Leave as a normal exit would, minus the interpreter's final teardown.

    Exit handlers run (Horovod's shutdown, MLflow's flushes), streams are
    flushed, then the process ends without Python's last garbage collection.
    That collection can deadlock in TensorFlow: it destroys a tf.data
    iterator still holding the GIL, and the iterator waits for a map thread
    that is inside a Python generator (Petastorm's reader) and needs the GIL:
    the worker writes its result and then hangs for good, in
    Py_FinalizeEx -> PyGC_Collect -> the MapAndBatchDatasetOp iterator's
    destructor (tensorflow/tensorflow#22632).
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit(main(sys.argv[1:]))
