"""A Keras image classifier as a self-contained MLflow pyfunc model.

Built on the driver (or rank 0) by `dist_dl.tracking.log_keras_classifier()`;
loaded anywhere with ``mlflow.pyfunc.load_model`` (a notebook, a Spark task, a
serving endpoint). The logged model carries its preprocessing, so a caller
passes encoded image bytes, never arrays.

Input: a pandas DataFrame with a binary column (``image_col``, default
``"image"``) of encoded images (JPEG, PNG, anything Pillow reads).

Output: a pandas DataFrame, one row per input row, same index:

- ``prediction`` (int64): the index of the most probable class;
- ``probability`` (float64): its probability (softmax of the model's output);
- ``probabilities`` (list of float64): the probability of every class.
"""
from __future__ import annotations

from typing import Sequence

import mlflow.pyfunc
import pandas as pd

# saved_keras_major travels by value with the logged model, as this module
# does (tracking.log._pickled_by_value), so it loads without dist_dl.
from dist_dl.core.compat import saved_keras_major
from dist_dl.tracking.preprocess import ImagePreprocessing, decode_images

__all__ = ["ImageClassifier", "KerasImageClassifier", "OUTPUT_COLUMNS", "KERAS_ARTIFACT"]

OUTPUT_COLUMNS = ("prediction", "probability", "probabilities")
KERAS_ARTIFACT = "keras_model"


class ImageClassifier(mlflow.pyfunc.PythonModel):
    """What every logged image classifier shares: the input's checks, the
    batching and the output frame (see the module docstring). A subclass
    gives `_probabilities()` and `_class_count()`, and sets
    ``image_col`` and ``batch_size``."""

    image_col = "image"
    batch_size = 64

    # The pd.DataFrame hint tells MLflow to validate against the logged
    # signature (a binary column) rather than infer a schema from the hint.
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        """Score a DataFrame of encoded images; see the module docstring."""
        import numpy as np

        self._check_loaded()
        if not isinstance(model_input, pd.DataFrame):
            raise ValueError(f"model_input must be a pandas DataFrame with a column "
                             f"{self.image_col!r}, got {type(model_input).__name__}")
        if self.image_col not in model_input.columns:
            raise ValueError(f"model_input has no column {self.image_col!r} of encoded images; "
                             f"its columns are {list(model_input.columns)}")
        images = model_input[self.image_col].tolist()
        probabilities = [self._probabilities(images[start:start + self.batch_size],
                                             model_input.index[start:start + self.batch_size])
                         for start in range(0, len(images), self.batch_size)]
        probs = (np.concatenate(probabilities) if probabilities
                 else np.zeros((0, self._class_count()), dtype="float64"))
        predictions = probs.argmax(axis=1).astype("int64")
        return pd.DataFrame({
            "prediction": predictions,
            "probability": probs[np.arange(len(probs)), predictions].astype("float64"),
            "probabilities": list(probs.astype("float64")),
        }, index=model_input.index)

    def _settings(self, image_col: str, class_names, batch_size: int) -> None:
        """Check and keep the settings every classifier has."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not image_col or not isinstance(image_col, str):
            raise ValueError(f"image_col must be a column name, got {image_col!r}")
        self.image_col = image_col
        self.class_names = None if class_names is None else [str(c) for c in class_names]
        self.batch_size = batch_size

    def _check_loaded(self) -> None:
        """Raise RuntimeError where the model itself is not loaded."""
        raise NotImplementedError

    def _probabilities(self, images: list, index):
        """float64 ``[len(images), classes]`` for one batch; ``index``: the
        rows' labels in the caller's frame (for errors)."""
        raise NotImplementedError

    def _class_count(self) -> int:
        raise NotImplementedError


class KerasImageClassifier(ImageClassifier):
    """Decodes, resizes and normalises images, runs the Keras model, returns
    the class index and its probability (see the module docstring for the
    schema).

    The Keras model itself is an MLflow artifact named ``"keras_model"`` (a
    ``.keras`` file), loaded in `load_context()`; this object pickles only
    the settings.

    Args:
        preprocessing: How images become model input.
        from_logits: Whether the model outputs logits (softmax is applied
            here) rather than probabilities.
        image_col: Name of the input column of encoded images.
        class_names: Optional names of the classes, by index (kept with the
            model for the caller; predictions stay indices).
        batch_size: Images per forward pass (bounds memory on large inputs).
    """

    def __init__(self, preprocessing: ImagePreprocessing, *, from_logits: bool,
                 image_col: str = "image", class_names: Sequence[str] | None = None,
                 batch_size: int = 64):
        if not isinstance(preprocessing, ImagePreprocessing):
            raise ValueError("preprocessing must be an ImagePreprocessing, "
                             f"got {type(preprocessing).__name__}")
        if not isinstance(from_logits, bool):
            raise ValueError(f"from_logits must be True or False, got {from_logits!r}")
        self._settings(image_col, class_names, batch_size)
        self.preprocessing = preprocessing
        self.from_logits = from_logits
        self._model = None
        self._forward = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_model"] = None  # the Keras model travels as an artifact, not in the pickle
        state["_forward"] = None
        return state

    def load_context(self, context) -> None:
        # dist_dl.core.compat.load_keras_file, in short: this class is pickled by
        # value into the logged model, which loads where dist_dl is not
        # installed (so is saved_keras_major). The file says which Keras wrote it: Keras 3 (keras=3
        # training), or Keras 2, which is tf-keras where Keras 3 is
        # TensorFlow's default.
        path = context.artifacts[KERAS_ARTIFACT]
        if saved_keras_major(path) >= 3:
            import keras
        else:
            try:
                import tf_keras as keras
            except ImportError:
                import tensorflow as tf

                keras = tf.keras
        self._model = keras.models.load_model(path, compile=False)
        self._forward = None

    def set_keras_model(self, model) -> None:
        """Use ``model`` directly (in-process use without MLflow loading)."""
        self._model = model
        self._forward = None

    def _class_count(self) -> int:
        return int(self._model.output_shape[-1])

    def _check_loaded(self) -> None:
        if self._model is None:
            raise RuntimeError("no Keras model loaded: load this model with mlflow.pyfunc.load_model")

    def _probabilities(self, images: list, index):
        import tensorflow as tf

        try:
            batch = decode_images(images, self.preprocessing)
        except ValueError as exc:
            # Name the row of the caller's frame, not the position in the batch.
            raise ValueError(f"in column {self.image_col!r}, batch starting at row "
                             f"{index[0]!r}: {exc}") from None
        if getattr(self, "_forward", None) is None:  # absent from objects pickled without it
            # One traced function for every batch: an eager call of a Keras
            # model runs its layers' Python each time (about 1.2 ms per batch
            # of 64 here, where a small CNN's arithmetic takes about 0.5).
            model = self._model
            self._forward = tf.function(
                lambda images: model(images, training=False), autograph=False,
                input_signature=[tf.TensorSpec([None, *self.preprocessing.input_shape],
                                               tf.float32)])
        outputs = self._forward(batch)
        if self.from_logits:
            outputs = tf.nn.softmax(outputs, axis=-1)
        return outputs.numpy().astype("float64")
