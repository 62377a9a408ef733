"""Turning encoded image bytes into the array a Keras image classifier takes.

Runs wherever a model is served: in Spark tasks that score, and inside the
logged MLflow model. It uses TensorFlow's own decoder and resize, with the
crop window of the training reader's evaluation transform
(``dist_dl.read.augment.eval_transform``), so that an image served is the
image the model was validated on (Pillow's resize filters differently).
"""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Iterable

__all__ = ["ImagePreprocessing", "decode_images"]


@dataclass(frozen=True)
class ImagePreprocessing:
    """How encoded images become model input: decode, convert, resize, normalise.

    Each pixel becomes ``(value * rescale - mean[c]) / std[c]`` for channel
    ``c``, after the image is converted to ``channels`` channels (RGB or
    grayscale), optionally cropped to its central square, resized to
    ``image_size`` with bilinear interpolation (``tf.image.resize``) and,
    with ``integer_pixels``, rounded to whole values.

    Attributes:
        image_size: ``(height, width)`` the model takes; an int means square.
        channels: 3 (RGB) or 1 (grayscale).
        mean: Per-channel mean subtracted after rescaling (one value per
            channel, or one for all). Default 0.
        std: Per-channel divisor after subtracting the mean. Default 1.
        rescale: Factor applied to the 0-255 pixel values first. Default 1/255.
        crop_fraction: If set, keep only the central square whose side is
            this fraction of the image's short side before resizing, as the
            reader's evaluation transform does (``ReaderConfig.eval_crop_fraction``,
            0.875 for ImageNet). Default None: resize the whole image.
        integer_pixels: Round the resized image to whole values 0-255, as the
            training reader does (its images end at uint8 pixels), for a
            model trained on them. Default False.
    """

    image_size: tuple[int, int] | int
    channels: int = 3
    mean: tuple[float, ...] | float = 0.0
    std: tuple[float, ...] | float = 1.0
    rescale: float = 1.0 / 255.0
    crop_fraction: float | None = None
    integer_pixels: bool = False

    def __post_init__(self):
        size = self.image_size
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if (not isinstance(size, (tuple, list)) or len(size) != 2
                or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
            raise ValueError(f"image_size must be a positive int or (height, width), got {self.image_size!r}")
        object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {self.channels!r}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            values = (value,) * self.channels if isinstance(value, (int, float)) else tuple(value)
            if len(values) != self.channels or not all(isinstance(v, (int, float)) for v in values):
                raise ValueError(f"{name} must be a number or {self.channels} numbers "
                                 f"(one per channel), got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if any(s == 0 for s in self.std):
            raise ValueError(f"std must not contain 0, got {self.std!r}")
        if not isinstance(self.rescale, (int, float)) or self.rescale <= 0:
            raise ValueError(f"rescale must be a positive number, got {self.rescale!r}")
        if not isinstance(self.integer_pixels, bool):
            raise ValueError(f"integer_pixels must be True or False, got {self.integer_pixels!r}")
        if self.crop_fraction is not None and (
                not isinstance(self.crop_fraction, (int, float)) or not 0 < self.crop_fraction <= 1):
            raise ValueError(f"crop_fraction must be None or in (0, 1], got {self.crop_fraction!r}")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """The model's input shape, ``(height, width, channels)``."""
        return (*self.image_size, self.channels)

    def to_dict(self) -> dict:
        """Plain values (for MLflow params and JSON)."""
        return {"image_size": list(self.image_size), "channels": self.channels,
                "mean": list(self.mean), "std": list(self.std), "rescale": self.rescale,
                "crop_fraction": self.crop_fraction, "integer_pixels": self.integer_pixels}


def decode_images(images: Iterable[bytes], spec: ImagePreprocessing):
    """Decode encoded images (JPEG, PNG, GIF, BMP) into one float32 array of
    shape ``(n, height, width, channels)``.

    Raises:
        ValueError: Naming the position of the first image that is missing or
            cannot be decoded.
    """
    import numpy as np
    import tensorflow as tf

    images = list(images)
    height, width = spec.image_size
    for position, data in enumerate(images):
        if data is None or len(data) == 0:
            raise ValueError(f"image {position} is {'null' if data is None else 'empty'}")
    if not images:
        return np.zeros((0, height, width, spec.channels), dtype="float32")
    mean = np.asarray(spec.mean, dtype="float32")
    std = np.asarray(spec.std, dtype="float32")
    try:
        # One graph call for the batch: TensorFlow's eager dispatch per image
        # cost about 0.5 ms, four fifths of scoring time for small images.
        batch = _graph_decoder(spec)(np.asarray([bytes(d) for d in images], dtype=object)).numpy()
    except (tf.errors.OpError, ValueError):  # an image cannot be decoded: which, below
        batch = _decode_one_by_one(images, spec)
    if spec.integer_pixels:
        # The reader's rounding (dist_dl.read.augment): values are >= 0, so
        # floor(x + 0.5) is its truncating cast of x + 0.5 to uint8.
        batch = np.floor(batch + np.float32(0.5))
    return ((batch * np.float32(spec.rescale) - mean) / std).astype("float32")


def _decode_one_by_one(images: list, spec: ImagePreprocessing):
    """The same transform image by image, eagerly: slow, but names the first
    image that cannot be decoded (a graph's error does not say which)."""
    import numpy as np
    import tensorflow as tf

    height, width = spec.image_size
    arrays = []
    for position, data in enumerate(images):  # none null or empty: decode_images checked
        data = bytes(data)
        try:
            if spec.crop_fraction is not None and data[:3] == _JPEG_MAGIC:
                # decode_and_crop_jpeg, as the reader does: decoding only the
                # window gives slightly different pixels at its edges than
                # decoding the whole image and cropping it.
                shape = tf.io.extract_jpeg_shape(data)
                window = _central_window(int(shape[0]), int(shape[1]), spec.crop_fraction)
                image = tf.io.decode_and_crop_jpeg(data, window, channels=spec.channels)
            else:
                image = tf.io.decode_image(data, channels=spec.channels, expand_animations=False)
                if spec.crop_fraction is not None:
                    top, left, side, _ = _central_window(int(image.shape[0]), int(image.shape[1]),
                                                         spec.crop_fraction)
                    image = image[top:top + side, left:left + side, :]
        except (tf.errors.OpError, ValueError) as exc:
            # TensorFlow prefixes the op's place ("{{function_node ...}}"): noise here.
            message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "",
                             getattr(exc, "message", str(exc)))
            raise ValueError(f"image {position} cannot be decoded: {type(exc).__name__}: "
                             f"{message}") from None
        # float32 in: the same values as resizing the uint8 pixels, faster
        # (TensorFlow's bilinear kernel is slow on uint8 input).
        image = tf.image.resize(tf.cast(image, tf.float32), [height, width], method="bilinear")
        arrays.append(image.numpy())
    return np.stack(arrays)


def _decoders() -> dict:
    """This process's decoders, by preprocessing settings.

    Kept in a module object of their own in ``sys.modules``, not in this
    module: this module is pickled by value into every logged model
    (dist_dl.tracking.log), so each model loaded has its own copy of it, and a
    cache there would become garbage with the model. A ``tf.function``
    collected as garbage in a process forked after it was made (Horovod's
    launcher forks the driver: a driver that has loaded a logged model, then
    starts local workers) crashes that process with a segmentation fault in
    ``AtomicFunction.__del__``. Here they live until exit, and
    are dropped by the process that made them before the interpreter tears
    TensorFlow's modules down (an ``AtomicFunction`` deleted after that raises
    a TypeError on the way out).
    """
    import atexit
    import os
    import sys
    import types

    holder = sys.modules.get("_dist_dl_image_decoders")
    if holder is None:
        holder = types.ModuleType("_dist_dl_image_decoders")
        holder.decoders = {}
        owner = os.getpid()

        def drop():
            if os.getpid() == owner:  # not in a forked child
                holder.decoders.clear()

        atexit.register(drop)
        sys.modules[holder.__name__] = holder
    return holder.decoders


def _graph_decoder(spec: ImagePreprocessing):
    """A ``tf.function`` taking a 1-D string tensor of encoded images to the
    resized float32 batch (0-255, before rescaling): the ops of
    `_decode_one_by_one()`, with the crop window computed in the graph
    the same way (so the pixels are the same)."""
    import json

    # By value, not by class: each loaded model has its own copy of the class.
    key = json.dumps(spec.to_dict(), sort_keys=True)
    decoder = _decoders().get(key)
    if decoder is not None:
        return decoder
    import tensorflow as tf

    height, width = spec.image_size
    channels, fraction = spec.channels, spec.crop_fraction

    def window(shape):
        h, w = shape[0], shape[1]
        side = tf.maximum(tf.cast(tf.cast(tf.minimum(h, w), tf.float32)
                                  * tf.constant(fraction or 1.0, tf.float32), tf.int32), 1)
        return (h - side + 1) // 2, (w - side + 1) // 2, side

    def whole(data):
        image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        if fraction is None:
            return image
        top, left, side = window(tf.shape(image))
        return image[top:top + side, left:left + side, :]

    def jpeg(data):
        top, left, side = window(tf.io.extract_jpeg_shape(data))
        return tf.io.decode_and_crop_jpeg(data, tf.stack([top, left, side, side]),
                                          channels=channels)

    def one(data):
        if fraction is None:
            image = whole(data)
        else:
            image = tf.cond(tf.equal(tf.strings.substr(data, 0, 3), _JPEG_MAGIC),
                            lambda: jpeg(data), lambda: whole(data))
        image.set_shape([None, None, channels])
        # float32 in: the same values as resizing the uint8 pixels, faster.
        return tf.image.resize(tf.cast(image, tf.float32), [height, width], method="bilinear")

    # Graph code already (branches on settings, tf.cond on the bytes): no
    # AutoGraph rewrite in each Python worker that scores.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def decode(batch):
        return tf.map_fn(one, batch, fn_output_signature=tf.TensorSpec(
            [height, width, channels], tf.float32))

    _decoders()[key] = decode
    return decode


_JPEG_MAGIC = b"\xff\xd8\xff"


def _central_window(height: int, width: int, fraction: float) -> list[int]:
    """``[top, left, side, side]``: the window dist_dl.read.augment.eval_transform
    decodes, computed the same way (float32 product, truncated), so that both
    see the same pixels."""
    import numpy as np

    side = max(int(np.float32(min(height, width)) * np.float32(fraction)), 1)
    return [(height - side + 1) // 2, (width - side + 1) // 2, side, side]
