"""Launching workers: driver-side runner and backends, plus ``worker``, the
code every worker runs around the user's function."""
from dist_dl.launch.errors import JobCancelled, JobTimeout, NotEnoughSlots, WorkerError
from dist_dl.launch.backend import auto_engine
from dist_dl.launch.runner import HorovodRunner, TFDistributeRunner
from dist_dl.launch.mirrored import MirroredStrategyRunner
from dist_dl.launch.weights import UnsynchronizedTraining, WorkersDiverged
from dist_dl.launch.tfdist import multi_worker_strategy
from dist_dl.launch.worker import log_to_driver

__all__ = ["HorovodRunner", "TFDistributeRunner", "MirroredStrategyRunner",
           "multi_worker_strategy", "auto_engine", "log_to_driver", "WorkerError", "JobTimeout",
           "JobCancelled", "NotEnoughSlots", "WorkersDiverged", "UnsynchronizedTraining"]
