"""MLflow tracking: parameters, per-epoch metrics, and the trained image
classifier as a self-contained pyfunc model. Runs on the driver and on
Horovod rank 0."""
from dist_dl.tracking.log import (LoggedModel, default_pip_requirements, log_epoch_metrics,
                                  log_keras_classifier, log_params, log_tensorboard)
from dist_dl.tracking.preprocess import ImagePreprocessing, decode_images
from dist_dl.tracking.pyfunc import KerasImageClassifier

__all__ = ["ImagePreprocessing", "decode_images", "KerasImageClassifier", "LoggedModel",
           "log_keras_classifier", "log_params", "log_epoch_metrics", "log_tensorboard", "MlflowEpochLogger",
           "default_pip_requirements"]


def __getattr__(name: str):
    # MlflowEpochLogger subclasses a Keras class: created on first use so that
    # importing this package does not import TensorFlow.
    if name == "MlflowEpochLogger":
        from dist_dl.tracking import log

        return log.MlflowEpochLogger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
