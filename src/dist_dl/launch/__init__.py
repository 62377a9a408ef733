"""Launching workers: driver-side runner and backends, plus ``worker``, the
code every worker runs around the user's function."""
from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "HorovodRunner": "dist_dl.launch.runner",
    "TFDistributeRunner": "dist_dl.launch.runner",
    "multi_worker_strategy": "dist_dl.launch.tfdist",
    "auto_engine": "dist_dl.launch.backend",
    "log_to_driver": "dist_dl.launch.worker",
    "WorkerError": "dist_dl.launch.errors",
    "JobTimeout": "dist_dl.launch.errors",
    "JobCancelled": "dist_dl.launch.errors",
    "NotEnoughSlots": "dist_dl.launch.errors",
}

__all__ = ["HorovodRunner", "TFDistributeRunner", "multi_worker_strategy", "auto_engine",
           "log_to_driver", "WorkerError", "JobTimeout", "JobCancelled", "NotEnoughSlots"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
