"""Logging to MLflow: parameters, per-epoch metrics, and the trained classifier.

Runs on the driver, or on Horovod rank 0 inside a worker (the only rank that
logs). Each function logs to the active MLflow run unless given a run id.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import mlflow

from dist_dl.core import compat
from dist_dl.core.lazy import lazy_attributes
from dist_dl.core.placement import process_rank
from dist_dl.tracking.metrics import numeric_logs
from dist_dl.tracking.preprocess import ImagePreprocessing

__all__ = ["LoggedModel", "log_keras_classifier", "log_params", "log_epoch_metrics",
           "log_tensorboard", "MlflowEpochLogger", "default_pip_requirements"]


@dataclass(frozen=True)
class LoggedModel:
    """Where a logged classifier is.

    Attributes:
        model_uri: ``runs:/<run_id>/<artifact_path>`` (on MLflow 3 too, where it
            resolves to the logged model of that name in the run); what
            ``mlflow.pyfunc.load_model`` and `dist_dl.score.score_dataframe()` take.
        run_id: The MLflow run it was logged to.
        registered_model_name: The registry name, if it was registered.
        registered_version: The version created in the registry, if registered.
    """

    model_uri: str
    run_id: str
    registered_model_name: str | None = None
    registered_version: int | None = None

    @property
    def registered_uri(self) -> str | None:
        """``models:/<name>/<version>``, if registered."""
        if self.registered_model_name is None or self.registered_version is None:
            return None
        return f"models:/{self.registered_model_name}/{self.registered_version}"


def default_pip_requirements(keras3: bool = False) -> list[str]:
    """What the logged classifier needs to load, pinned to what runs here.

    Given explicitly so that MLflow does not infer them (inference loads the
    model in a subprocess: slow, and it imports TensorFlow again).
    """
    from importlib import metadata

    requirements = []
    # tensorflow-cpu locally, tensorflow (GPU) on a Databricks ML runtime.
    for names in (("tensorflow", "tensorflow-cpu"), ("pillow",), ("numpy",), ("pandas",),
                  ("cloudpickle",)):
        for name in names:
            try:
                requirements.append(f"{name}=={metadata.version(name)}")
                break
            except metadata.PackageNotFoundError:
                continue
    if keras3:
        # A Keras 3 model (keras=3) loads with the keras package.
        requirements.append(f"keras=={metadata.version('keras')}")
    elif compat.keras3_default():
        # The model is saved with tf-keras there (see dist_dl.core.compat).
        requirements.append(f"tf-keras=={metadata.version('tf-keras')}")
    return requirements


@contextlib.contextmanager
def _pickled_by_value():
    """Pickle the pyfunc class and its preprocessing by value, so that the
    logged model loads where ``dist_dl`` is not installed (a serving endpoint,
    another workspace): it needs only MLflow, TensorFlow, Pillow and NumPy."""
    from dist_dl.tracking import preprocess, pyfunc

    # compat: for saved_keras_major, which the pyfunc calls when it loads.
    with pickled_by_value(pyfunc, preprocess, compat):
        yield


@contextlib.contextmanager
def pickled_by_value(*modules):
    """Within the block, cloudpickle pickles what ``modules`` define by
    value (their code travels in the pickle) rather than by reference."""
    import cloudpickle

    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def _keras_of(model):
    """The Keras module of ``model``: the ``keras`` package for a Keras 3
    model, else the library's (`dist_dl.core.compat.keras()`)."""
    if compat.is_keras3_model(model):
        import keras

        return keras
    return compat.keras()


def _detect_from_logits(model) -> bool:
    keras = _keras_of(model)

    activation = getattr(model.layers[-1], "activation", None) if model.layers else None
    return activation is not keras.activations.softmax


def log_keras_classifier(model, preprocessing: ImagePreprocessing, *, image_col: str = "image",
                         artifact_path: str = "model", registered_model_name: str | None = None,
                         class_names: Sequence[str] | None = None, from_logits: bool | None = None,
                         batch_size: int = 64, pip_requirements: Sequence[str] | None = None,
                         extra_pip_requirements: Sequence[str] | None = None,
                         run_id: str | None = None) -> LoggedModel:
    """Log a Keras image classifier as a self-contained MLflow pyfunc model.

    The model is saved as a ``.keras`` file artifact (architecture and weights,
    without the optimizer), wrapped in `KerasImageClassifier`
    with its preprocessing, and given a signature (input: one binary column
    ``image_col``; output: ``prediction``, ``probability``, ``probabilities``).

    Args:
        model: The trained Keras model (its input must match ``preprocessing.input_shape``).
        preprocessing: How encoded images become model input.
        image_col: Input column of encoded images the pyfunc reads.
        artifact_path: Where in the run's artifacts (default ``"model"``); the
            model's ``name`` on MLflow 3, which keeps its files apart from the run's.
        registered_model_name: Also register it in the model registry under
            this name (a new version each time). The tracking URI must point to
            a store with a registry (``sqlite:///...``, a server, Databricks).
        class_names: Class names by index, stored with the model.
        from_logits: Whether the model outputs logits; default: True unless
            its last layer has a softmax activation.
        batch_size: Images per forward pass when predicting.
        pip_requirements: Requirements of the logged model; default
            `default_pip_requirements()`.
        extra_pip_requirements: Added to the default requirements instead.
        run_id: Log to this run; default the active run, or a new run that
            is ended afterwards.

    Returns:
        Where the model was logged (and registered).
    """
    if compat.is_keras3_model(model) and compat.keras3_training_problem() is not None:
        raise ValueError(compat.not_a_library_keras_model(model))
    keras = _keras_of(model)
    from dist_dl.tracking.pyfunc import KERAS_ARTIFACT, KerasImageClassifier

    if not isinstance(model, keras.Model):
        raise ValueError(compat.not_a_library_keras_model(model))
    expected = tuple(preprocessing.input_shape)
    actual = tuple(model.input_shape[1:]) if isinstance(model.input_shape, tuple) else None
    if actual is not None and all(a is not None for a in actual) and actual != expected:
        raise ValueError(f"the model takes inputs of shape {actual}, but preprocessing produces "
                         f"{expected}: set ImagePreprocessing(image_size=..., channels=...) to match")
    if from_logits is None:
        from_logits = _detect_from_logits(model)
    if pip_requirements is not None and extra_pip_requirements is not None:
        raise ValueError("give pip_requirements or extra_pip_requirements, not both")
    requirements = list(pip_requirements) if pip_requirements is not None else (
        default_pip_requirements(keras3=compat.is_keras3_model(model))
        + list(extra_pip_requirements or []))
    python_model = KerasImageClassifier(preprocessing, from_logits=from_logits, image_col=image_col,
                                        class_names=class_names, batch_size=batch_size)
    signature = classifier_signature(image_col)

    with tempfile.TemporaryDirectory(prefix="dist_dl-model-") as tmp, _run(run_id) as run:
        keras_path = os.path.join(tmp, "model.keras")
        model.save(keras_path)
        with _pickled_by_value(), warnings.catch_warnings():
            # No input example on purpose: the signature says it all, and an
            # example makes MLflow load and run the model again while logging.
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            info = mlflow.pyfunc.log_model(
                **compat.model_name_argument(artifact_path), python_model=python_model,
                artifacts={KERAS_ARTIFACT: keras_path}, signature=signature,
                pip_requirements=requirements, registered_model_name=registered_model_name,
                metadata={"preprocessing": preprocessing.to_dict(), "image_col": image_col,
                          "from_logits": from_logits, "class_names": python_model.class_names})
        run_id = run.info.run_id
    return logged_model(info, run_id, artifact_path, registered_model_name)


def classifier_signature(image_col: str):
    """The signature of every logged image classifier: one binary column of
    encoded images in; ``prediction``, ``probability`` and ``probabilities``
    out (`dist_dl.tracking.pyfunc`)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("binary", image_col)]),
        outputs=Schema([ColSpec("long", "prediction"), ColSpec("double", "probability"),
                        ColSpec(Array("double"), "probabilities")]))


def logged_model(info, run_id: str, artifact_path: str,
                 registered_model_name: str | None) -> LoggedModel:
    """The `LoggedModel` of what ``log_model`` returned (``info``)."""
    version = getattr(info, "registered_model_version", None)
    if registered_model_name is not None and version is None:
        version = _registered_version(registered_model_name, run_id)
    return LoggedModel(model_uri=f"runs:/{run_id}/{artifact_path}", run_id=run_id,
                       registered_model_name=registered_model_name,
                       registered_version=None if version is None else int(version))


def _registered_version(name: str, run_id: str) -> int | None:
    """The newest version of ``name`` registered from ``run_id``: MLflow before
    2.14 (Databricks Runtime 15.4 has 2.13) does not return it from log_model."""
    versions = mlflow.tracking.MlflowClient().search_model_versions(f"name='{name}'")
    mine = [int(v.version) for v in versions if v.run_id == run_id]
    return max(mine) if mine else None


@contextlib.contextmanager
def _run(run_id: str | None):
    active = mlflow.active_run()
    if run_id is None and active is not None:
        yield active
    elif run_id is not None and active is not None and active.info.run_id == run_id:
        yield active
    else:
        with mlflow.start_run(run_id=run_id, nested=active is not None) as run:
            yield run


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def log_params(params: Mapping[str, Any]) -> None:
    """Log parameters to the active run; nested mappings become dotted keys
    (``{"model": {"name": "resnet50"}}`` -> ``model.name``)."""
    mlflow.log_params({key: str(value) for key, value in _flatten(params).items()})


def log_epoch_metrics(metrics: Mapping[str, Any], epoch: int, *, prefix: str = "") -> None:
    """Log one epoch's metrics to the active run, with ``step=epoch``.

    Raises:
        ValueError: Naming a metric whose value is not a number (nothing is
            dropped silently).
    """
    values = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {key!r} is not a number: {value!r}") from None
        values[f"{prefix}{key}"] = number
    mlflow.log_metrics(values, step=int(epoch))


def log_tensorboard(log_dir: str | os.PathLike, *, artifact_path: str = "tensorboard") -> int:
    """Copy a TensorBoard log directory (what ``keras.callbacks.TensorBoard``
    wrote) into the active run's artifacts, under ``artifact_path``.

    Returns:
        How many files were logged.

    Raises:
        ValueError: ``log_dir`` does not exist or holds no files (a wrong path
            must not pass unnoticed).
    """
    log_dir = os.fspath(log_dir)
    if not os.path.isdir(log_dir):
        raise ValueError(f"log_dir {log_dir!r} is not a directory; pass the log_dir given "
                         "to keras.callbacks.TensorBoard")
    count = sum(len(files) for _, _, files in os.walk(log_dir))
    if count == 0:
        raise ValueError(f"log_dir {log_dir!r} holds no files: did the TensorBoard callback run?")
    mlflow.log_artifacts(log_dir, artifact_path=artifact_path)
    return count


def _define_epoch_logger():
    keras = compat.keras()

    class MlflowEpochLogger(keras.callbacks.Callback):
        """Keras callback for the rank that logs: each epoch's metrics (Keras'
        logs, averaged over ranks if Horovod's ``MetricAverageCallback`` comes
        first), its duration, and the throughput, with ``step`` = epoch number
        (counting from 1, as checkpoints do).

        Args:
            images_per_epoch: Images all workers together process per epoch; when
                given, ``images_per_second`` is logged too.
            writer: Whether this process logs; default Horovod rank 0 (or the only process).
        """

        def __init__(self, images_per_epoch: int | None = None, writer: bool | None = None):
            super().__init__()
            if writer is None:
                writer = process_rank() == 0
            self.images_per_epoch = images_per_epoch
            self.writer = writer
            self._start = None

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if not self.writer:
                return
            seconds = time.perf_counter() - self._start
            metrics = numeric_logs(logs)
            metrics["epoch_seconds"] = seconds
            if self.images_per_epoch:
                metrics["images_per_second"] = self.images_per_epoch / seconds
            log_epoch_metrics(metrics, epoch + 1)

    MlflowEpochLogger.__module__ = __name__
    MlflowEpochLogger.__qualname__ = "MlflowEpochLogger"
    return MlflowEpochLogger


# MlflowEpochLogger subclasses a Keras class: defined on first use (see dist_dl.core.lazy).
__getattr__ = lazy_attributes(globals(), MlflowEpochLogger=_define_epoch_logger)
