"""Training: ``train_distributed`` on the driver (``driver.py``), its
attempts and retries (``attempts.py``), and the code that runs inside each
worker, one module per engine (``engines/``), with checkpoints, the
learning-rate schedule and the model registry."""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "train_distributed": "dist_dl.train.driver",
    "TrainedModel": "dist_dl.train.driver",
    "TrainingFailed": "dist_dl.train.attempts",
    "TrainConfig": "dist_dl.train.config",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.train.attempts import TrainingFailed  # noqa: F401
    from dist_dl.train.config import TrainConfig  # noqa: F401
    from dist_dl.train.driver import TrainedModel, train_distributed  # noqa: F401

__all__ = ["train_distributed", "TrainedModel", "TrainingFailed", "TrainConfig"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
