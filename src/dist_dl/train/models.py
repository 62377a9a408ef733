"""Model registry: names to Keras model builders. Runs inside each worker.

A builder takes ``(input_shape, classes)`` and returns an uncompiled Keras
model with logits as output (no softmax), so the loss, mixed precision and
the probability layer are applied in one place by the training loop and the
logged model. `build_classifier()` puts the pixel normalisation in front
of it: the readers hand the workers uint8 pixels.
"""
from __future__ import annotations

from typing import Callable
from dist_dl.core import compat

__all__ = ["build_model", "build_classifier", "pixel_normalization", "register_model",
           "MODEL_NAMES"]

_REGISTRY: dict[str, Callable] = {}


def register_model(name: str):
    """Decorator: make a builder available under ``name``."""
    def decorate(builder):
        _REGISTRY[name] = builder
        return builder
    return decorate


@register_model("resnet50")
def _resnet50(input_shape, classes):
    keras = compat.keras()

    # weights=None: no download (and ImageNet weights would not fit other classes).
    return keras.applications.ResNet50(weights=None, input_shape=input_shape, classes=classes,
                                          classifier_activation=None)


@register_model("small_cnn")
def _small_cnn(input_shape, classes):
    """Three conv-BN-ReLU blocks, global average pooling, a linear layer:
    ~100k parameters, for fast runs and tests at small image sizes.

    Batch normalisation makes it converge in a few epochs with SGD. Under
    data parallelism each worker normalises with its own batch's statistics
    (Horovod does not synchronise them), so n workers at batch B/n compute a
    slightly different update than one worker at batch B; a model without
    batch normalisation computes exactly the same one.
    """
    keras = compat.keras()

    layers = keras.layers
    inputs = keras.Input(input_shape)
    x = inputs
    for i, filters in enumerate((32, 64, 128)):
        if i:
            x = layers.MaxPooling2D()(x)
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        # momentum 0.9: the moving statistics settle within a short run.
        x = layers.BatchNormalization(momentum=0.9)(x)
        x = layers.Activation("relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes)(x), name="small_cnn")


MODEL_NAMES = tuple(_REGISTRY)


def call_builder(model, registry: dict, input_shape, classes: int, kind: str):
    """``model(input_shape, classes)`` for a builder, else the ``registry``'s
    builder of that name's.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if callable(model):
        return model(input_shape, classes)
    if model in registry:
        return registry[model](input_shape, classes)
    raise ValueError(f"unknown model {model!r}: use one of {', '.join(registry)} or pass a "
                     f"function (input_shape, classes) -> {kind}")


def build_model(model: str | Callable, input_shape: tuple[int, int, int], classes: int):
    """Build a model by registry name, or call a user-supplied builder.

    Raises:
        ValueError: unknown name (lists the known ones), or a builder whose
            output does not have ``classes`` units.
    """
    built = call_builder(model, _REGISTRY, input_shape, classes, "Keras model")
    units = built.output_shape[-1]
    if units != classes:
        raise ValueError(f"the model's output has {units} units but the data has {classes} classes; "
                         "the builder must end in Dense(classes) without softmax")
    return built


def pixel_normalization(reader):
    """A Keras layer taking pixels (uint8, or float holding 0-255 values) to
    the normalised image that ``reader`` (a
    `ReaderConfig`) makes with ``normalize=True``: the
    first layer of a model fed by a reader that ends at uint8. Computed in
    float32 whatever the precision policy; the network after it casts."""
    from dist_dl.read.augment import normalization

    keras = compat.keras()
    scale, offset = normalization(reader)
    return keras.layers.Rescaling(scale, offset, dtype="float32", name="normalize")


def build_classifier(model: str | Callable, reader, classes: int, *, mixed: bool = False):
    """The Keras model the TensorFlow engines train and log: pixels in,
    `pixel_normalization()`, the network (`build_model()`), logits out.

    Its input is float32 holding pixel values 0-255; the reader's uint8
    batches are cast to it inside the training step (on the device), and a
    served image's whole pixel values go in as they are
    (``dist_dl.tracking.ImagePreprocessing(integer_pixels=True)``).

    Args:
        model: A registry name or a builder ``(input_shape, classes) -> keras.Model``
            (the builder's model takes normalised float images).
        reader: The `ReaderConfig` the data is read
            with: its image size and normalisation.
        classes: Number of classes.
        mixed: Mixed precision: the logits are cast to float32 (a float16
            softmax cross-entropy loses precision).
    """
    keras = compat.keras()

    side = reader.image_size
    net = build_model(model, (side, side, 3), classes)
    pixels = keras.Input((side, side, 3), name="pixels")
    logits = net(pixel_normalization(reader)(pixels))
    if mixed:
        logits = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(logits)
    return keras.Model(pixels, logits, name=net.name)
