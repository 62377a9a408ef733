"""dist_dl: train deep-learning models across a Spark cluster.

Public API (everything else is internal):

- ``HorovodRunner``: run a training function on N workers (Spark tasks or
  local processes) that form one Horovod job; ``log_to_driver`` from inside it.
- ``TFDistributeRunner``: the same for tf.distribute's
  MultiWorkerMirroredStrategy, where Horovod is not installed.
- ``MirroredStrategyRunner``: spark-tensorflow-distributor's runner of that
  name, on the same launcher (a drop-in: only the import changes).
- ``WorkerError``, ``JobTimeout``, ``NotEnoughSlots``, ``WorkersDiverged``:
  what a failed launch raises.
- ``train_distributed``: train an image classifier from a DataFrame or shards
  on all workers; it returns a ``TrainedModel`` (``transform(df)`` scores)
  and raises ``TrainingFailed`` when its retries run out. ``TrainConfig``
  holds its settings.
"""
from dist_dl.launch import (HorovodRunner, JobTimeout, MirroredStrategyRunner, NotEnoughSlots,
                            TFDistributeRunner, WorkerError, WorkersDiverged, log_to_driver)
from dist_dl.train import TrainConfig, TrainedModel, TrainingFailed, train_distributed

__version__ = "0.1.0"

__all__ = ["HorovodRunner", "TFDistributeRunner", "MirroredStrategyRunner", "log_to_driver",
           "WorkerError", "JobTimeout", "NotEnoughSlots", "WorkersDiverged",
           "train_distributed", "TrainedModel", "TrainingFailed", "TrainConfig"]
