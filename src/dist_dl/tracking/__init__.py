"""MLflow tracking: parameters, per-epoch metrics, and the trained image
classifier as a self-contained pyfunc model. Runs on the driver and on
Horovod rank 0."""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "ImagePreprocessing": "dist_dl.tracking.preprocess",
    "decode_images": "dist_dl.tracking.preprocess",
    "KerasImageClassifier": "dist_dl.tracking.pyfunc",
    "LoggedModel": "dist_dl.tracking.log",
    "log_keras_classifier": "dist_dl.tracking.log",
    "log_params": "dist_dl.tracking.log",
    "log_epoch_metrics": "dist_dl.tracking.log",
    "log_tensorboard": "dist_dl.tracking.log",
    # A Keras subclass, defined on first use in dist_dl.tracking.log (see dist_dl.core.lazy).
    "MlflowEpochLogger": "dist_dl.tracking.log",
    "default_pip_requirements": "dist_dl.tracking.log",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.tracking.log import (LoggedModel, MlflowEpochLogger, default_pip_requirements, log_epoch_metrics, log_keras_classifier, log_params, log_tensorboard)  # noqa: F401
    from dist_dl.tracking.preprocess import ImagePreprocessing, decode_images  # noqa: F401
    from dist_dl.tracking.pyfunc import KerasImageClassifier  # noqa: F401

__all__ = ["ImagePreprocessing", "decode_images", "KerasImageClassifier", "LoggedModel",
           "log_keras_classifier", "log_params", "log_epoch_metrics", "log_tensorboard", "MlflowEpochLogger",
           "default_pip_requirements"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
