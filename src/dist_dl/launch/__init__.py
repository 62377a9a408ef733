"""Launching workers: driver-side runner and backends, plus ``worker``, the
code every worker runs around the user's function."""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "HorovodRunner": "dist_dl.launch.horovod.runner",
    "TFDistributeRunner": "dist_dl.launch.runners.tf_distribute",
    "MirroredStrategyRunner": "dist_dl.launch.runners.mirrored",
    "TorchDistributor": "dist_dl.launch.runners.torch_distributor",
    "multi_worker_strategy": "dist_dl.launch.engines.tensorflow",
    "auto_engine": "dist_dl.launch.horovod.backend",
    "log_to_driver": "dist_dl.launch.core.worker",
    "WorkerError": "dist_dl.launch.core.errors",
    "JobTimeout": "dist_dl.launch.core.errors",
    "JobCancelled": "dist_dl.launch.core.errors",
    "NotEnoughSlots": "dist_dl.launch.core.errors",
    "WorkersDiverged": "dist_dl.launch.core.weights",
    "UnsynchronizedTraining": "dist_dl.launch.core.weights",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.launch.horovod.backend import auto_engine  # noqa: F401
    from dist_dl.launch.core.errors import JobCancelled, JobTimeout, NotEnoughSlots, WorkerError  # noqa: F401
    from dist_dl.launch.horovod.runner import HorovodRunner  # noqa: F401
    from dist_dl.launch.runners.tf_distribute import TFDistributeRunner  # noqa: F401
    from dist_dl.launch.engines.tensorflow import multi_worker_strategy  # noqa: F401
    from dist_dl.launch.runners.mirrored import MirroredStrategyRunner  # noqa: F401
    from dist_dl.launch.runners.torch_distributor import TorchDistributor  # noqa: F401
    from dist_dl.launch.core.weights import UnsynchronizedTraining, WorkersDiverged  # noqa: F401
    from dist_dl.launch.core.worker import log_to_driver  # noqa: F401

__all__ = ["HorovodRunner", "TFDistributeRunner", "MirroredStrategyRunner", "TorchDistributor",
           "multi_worker_strategy", "auto_engine", "log_to_driver", "WorkerError", "JobTimeout",
           "JobCancelled", "NotEnoughSlots", "WorkersDiverged", "UnsynchronizedTraining"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
