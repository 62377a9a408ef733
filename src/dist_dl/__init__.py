"""dist_dl: train deep-learning models across a Spark cluster.

Public API (everything else is internal):

- ``HorovodRunner``: run a training function on N workers (Spark tasks or
  local processes) that form one Horovod job; ``log_to_driver`` from inside it.
- ``TFDistributeRunner``: the same for tf.distribute's
  MultiWorkerMirroredStrategy, where Horovod is not installed.
- ``MirroredStrategyRunner``: spark-tensorflow-distributor's runner of that
  name, on the same launcher (a drop-in: only the import changes).
- ``TorchDistributor``: pyspark's TorchDistributor (torch.distributed over
  Gloo or NCCL), on the same launcher (a drop-in too).
- ``WorkerError``, ``JobTimeout``, ``NotEnoughSlots``, ``WorkersDiverged``:
  what a failed launch raises.
- ``train_distributed``: train an image classifier from a DataFrame or shards
  on all workers; it returns a ``TrainedModel`` (``transform(df)`` scores)
  and raises ``TrainingFailed`` when its retries run out. ``TrainConfig``
  holds its settings.
- ``train_torch_rank``: what ``train_distributed(engine="torch")`` runs on
  each rank, called in every process of a job that another launcher started
  with torchrun's variables (``torchrun``, pyspark's TorchDistributor,
  Databricks serverless GPU).

Each name is imported when it is first used (PEP 562), so that a worker which
imports one module of the library (``dist_dl.read.arrow``) loads that module's
imports only.

The package's layout follows the data: ``core`` (helpers every stage uses),
the stages ``prepare``, ``read``, ``launch``, ``tracking``, ``score``, ``train``,
``ensemble``, ``search``, and ``app`` (configuration, pipeline, command line,
benchmark driver, Databricks integration).
"""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "HorovodRunner": "dist_dl.launch.horovod.runner",
    "TFDistributeRunner": "dist_dl.launch.runners.tf_distribute",
    "MirroredStrategyRunner": "dist_dl.launch.runners.mirrored",
    "TorchDistributor": "dist_dl.launch.runners.torch_distributor",
    "log_to_driver": "dist_dl.launch.core.worker",
    "WorkerError": "dist_dl.launch.core.errors",
    "JobTimeout": "dist_dl.launch.core.errors",
    "NotEnoughSlots": "dist_dl.launch.core.errors",
    "WorkersDiverged": "dist_dl.launch.core.weights",
    "train_distributed": "dist_dl.train.driver",
    "TrainedModel": "dist_dl.train.driver",
    "TrainingFailed": "dist_dl.train.attempts",
    "TrainConfig": "dist_dl.train.config",
    "train_torch_rank": "dist_dl.train.torchrun",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.launch.core.errors import JobTimeout, NotEnoughSlots, WorkerError  # noqa: F401
    from dist_dl.launch.runners.mirrored import MirroredStrategyRunner  # noqa: F401
    from dist_dl.launch.runners.torch_distributor import TorchDistributor  # noqa: F401
    from dist_dl.launch.horovod.runner import HorovodRunner  # noqa: F401
    from dist_dl.launch.runners.tf_distribute import TFDistributeRunner  # noqa: F401
    from dist_dl.launch.core.weights import WorkersDiverged  # noqa: F401
    from dist_dl.launch.core.worker import log_to_driver  # noqa: F401
    from dist_dl.train.attempts import TrainingFailed  # noqa: F401
    from dist_dl.train.config import TrainConfig  # noqa: F401
    from dist_dl.train.driver import TrainedModel, train_distributed  # noqa: F401
    from dist_dl.train.torchrun import train_torch_rank  # noqa: F401

__all__ = ["HorovodRunner", "TFDistributeRunner", "MirroredStrategyRunner", "TorchDistributor",
           "log_to_driver", "WorkerError", "JobTimeout", "NotEnoughSlots", "WorkersDiverged",
           "train_distributed", "TrainedModel", "TrainingFailed", "TrainConfig",
           "train_torch_rank"]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
