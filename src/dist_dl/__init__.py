"""dist_dl: train deep-learning models across a Spark cluster.

Public API (everything else is internal):

- ``HorovodRunner``: run a training function on N workers (Spark tasks or
  local processes) that form one Horovod job; ``log_to_driver`` from inside it.
- ``WorkerError``, ``JobTimeout``, ``NotEnoughSlots``: what a failed launch raises.
"""
from dist_dl.launch import HorovodRunner, JobTimeout, NotEnoughSlots, WorkerError, log_to_driver

__version__ = "0.1.0"

__all__ = ["HorovodRunner", "log_to_driver", "WorkerError", "JobTimeout", "NotEnoughSlots"]
