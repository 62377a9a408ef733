"""Training: ``train_distributed`` on the driver (``driver.py``), and the code
that runs inside each Horovod worker (``worker.py``) or tf.distribute worker
(``worker_tf.py``), with checkpoints, the learning-rate schedule and the
model registry."""
from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "train_distributed": "dist_dl.train.driver",
    "TrainedModel": "dist_dl.train.driver",
    "TrainingFailed": "dist_dl.train.attempts",
    "TrainConfig": "dist_dl.train.config",
}

__all__ = ["train_distributed", "TrainedModel", "TrainingFailed", "TrainConfig"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
