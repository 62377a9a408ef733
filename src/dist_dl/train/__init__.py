"""Training: ``train_distributed`` on the driver (``driver.py``), and the code
that runs inside each Horovod worker (``worker.py``) or tf.distribute worker
(``worker_tf.py``), with checkpoints, the learning-rate schedule and the
model registry."""
from dist_dl.train.config import TrainConfig
from dist_dl.train.driver import TrainedModel, TrainingFailed, train_distributed

__all__ = ["train_distributed", "TrainedModel", "TrainingFailed", "TrainConfig"]
