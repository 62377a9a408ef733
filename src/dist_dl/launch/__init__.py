"""Launching workers: driver-side runner and backends, plus ``worker``, the
code every worker runs around the user's function."""
from dist_dl.launch.errors import JobTimeout, NotEnoughSlots, WorkerError
from dist_dl.launch.runner import HorovodRunner
from dist_dl.launch.worker import log_to_driver

__all__ = ["HorovodRunner", "log_to_driver", "WorkerError", "JobTimeout", "NotEnoughSlots"]
