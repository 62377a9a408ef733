"""MLflow tracking: parameters, per-epoch metrics, and the trained image
classifier as a self-contained pyfunc model. Runs on the driver and on
Horovod rank 0."""
from dist_dl.lazy import lazy_attributes
from dist_dl.tracking.log import (LoggedModel, default_pip_requirements, log_epoch_metrics,
                                  log_keras_classifier, log_params, log_tensorboard)
from dist_dl.tracking.preprocess import ImagePreprocessing, decode_images
from dist_dl.tracking.pyfunc import KerasImageClassifier

__all__ = ["ImagePreprocessing", "decode_images", "KerasImageClassifier", "LoggedModel",
           "log_keras_classifier", "log_params", "log_epoch_metrics", "log_tensorboard", "MlflowEpochLogger",
           "default_pip_requirements"]


def _epoch_logger():
    from dist_dl.tracking import log

    return log.MlflowEpochLogger


# MlflowEpochLogger subclasses a Keras class: defined on first use (see dist_dl.lazy).
__getattr__ = lazy_attributes(globals(), MlflowEpochLogger=_epoch_logger)
