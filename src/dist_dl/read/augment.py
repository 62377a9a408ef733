"""JPEG bytes to image tensors: ImageNet train and eval transforms.

Both transforms decode only the pixels they keep (``decode_and_crop_jpeg``),
which is the main saving over decode-then-crop at ImageNet sizes, and round
the resized image to uint8 pixels. With ``ReaderConfig(normalize=False)`` the
CPU's work ends there and the model normalises as its first layer, on its
device (what ``train_distributed`` does); by default the images are
normalised here, as float32.
"""
from __future__ import annotations

from dataclasses import dataclass

from dist_dl.core.settings import checked, setting

__all__ = ["ReaderConfig", "train_transform", "eval_transform", "eval_window", "normalization",
           "READERS",
           "CROP_ATTEMPTS", "MIN_OBJECT_COVERED"]

READERS = ("auto", "petastorm", "arrow")
# The random resized crop: tries this many (aspect ratio, size, place) draws
# and falls back to the whole image; a crop keeps at least this fraction of
# the image (sample_distorted_bounding_box's min_object_covered with the whole
# image as the box), so the crops' area fraction starts at
# max(area_range[0], MIN_OBJECT_COVERED).
CROP_ATTEMPTS = 10
MIN_OBJECT_COVERED = 0.1


def _numbers(values: tuple, count: int) -> bool:
    return len(values) == count and all(isinstance(v, (int, float)) for v in values)


def _range(pair: tuple, top: float | None = None) -> bool:
    return (_numbers(pair, 2) and 0 < pair[0] <= pair[1]
            and (top is None or pair[1] <= top))


@dataclass(frozen=True)
@checked("ReaderConfig.")
class ReaderConfig:
    """Image transform and input pipeline settings, validated on construction.

    Args:
        image_size: Side of the square images produced. Default 224.
        eval_crop_fraction: Evaluation keeps the central square of this
            fraction of the short side (224/256 = 0.875, the usual ImageNet
            evaluation), then resizes it to ``image_size``.
        area_range: Training crops cover this fraction range of the image
            area (random resized crop). Default (0.08, 1.0).
        aspect_ratio_range: Range of the crops' width/height. Default (3/4, 4/3).
        flip: Random horizontal flip in training. Default True.
        mean: Per-channel mean (of pixels scaled to [0, 1]) subtracted.
        std: Per-channel standard deviation divided by.
        shuffle_buffer: Rows in the training shuffle buffer (encoded bytes,
            so a few KB to 100 KB each). Default 1024.
        reader_threads: Threads reading Parquet row groups (Petastorm's
            pool, or the arrow reader's). Default 2.
        reader: Which reader turns row groups into rows: ``"petastorm"``
            (Petastorm's batch reader), ``"arrow"`` (pyarrow's
            ``ParquetFile.read_row_group``, for runtimes without Petastorm) or
            ``"auto"`` (default: Petastorm where it imports, else arrow). Both
            give each rank the same rows and steps (see
            `make_dataset()`).
        normalize: True (default): images come out float32, normalised with
            ``mean`` and ``std``. False: uint8 pixels (0-255, the resized
            image rounded), for a model that normalises as its first layer
            (``dist_dl.train.models.pixel_normalization``): a quarter of the
            bytes through batching, prefetching and the copy to the device,
            and no float arithmetic left on the CPU. ``train_distributed``'s
            engines read so. (The torch loader always ends at uint8: its
            models normalise with ``dist_dl.read.torchdata.Normalize``.)
    """

    image_size: int = setting(224, low=8)
    eval_crop_fraction: float = setting(0.875, low=0.0, high=1.0, low_open=True)
    area_range: tuple = setting((0.08, 1.0), test=lambda r: _range(r, 1.0),
                                expected="(low, high) with 0 < low <= high <= 1")
    aspect_ratio_range: tuple = setting((3 / 4, 4 / 3), test=_range,
                                        expected="(low, high) with 0 < low <= high")
    flip: bool = setting(True)
    mean: tuple = setting((0.485, 0.456, 0.406), test=lambda m: _numbers(m, 3),
                          expected="3 numbers (RGB)")
    std: tuple = setting((0.229, 0.224, 0.225), test=lambda s: _numbers(s, 3) and min(s) > 0,
                         expected="3 numbers > 0 (RGB)")
    shuffle_buffer: int = setting(1024, low=1)
    reader_threads: int = setting(2, low=1)
    reader: str = setting("auto", choices=READERS)
    normalize: bool = setting(True)


def _resized(image, config: ReaderConfig):
    """The decoded uint8 ``image`` resized (bilinear) to ``image_size``
    square and rounded to uint8 pixels.

    The pixels go to float32 before the resize: TensorFlow's bilinear kernel
    gives the same values from float32 input as from uint8, and the cast
    plus the float32 kernel take about three quarters of the uint8 kernel's
    time (benchmarks/RESULTS.md, "The reader's resize")."""
    import tensorflow as tf

    return _pixels(tf.image.resize(tf.cast(image, tf.float32),
                                   [config.image_size, config.image_size], method="bilinear"))


def _pixels(image):
    """The resized float image (values within 0-255: bilinear interpolation
    of uint8 pixels) rounded to uint8."""
    import tensorflow as tf

    return tf.cast(image + 0.5, tf.uint8)


def _finish(image, config: ReaderConfig):
    """uint8 pixels as the model takes them: unchanged (``normalize=False``)
    or normalised float32, ``pixel * scale + offset`` per channel."""
    import tensorflow as tf

    if not config.normalize:
        return image
    scale, offset = normalization(config)
    return tf.cast(image, tf.float32) * tf.constant(scale, tf.float32) + tf.constant(offset,
                                                                                     tf.float32)


def normalization(config: ReaderConfig) -> tuple[list[float], list[float]]:
    """``(scale, offset)`` per channel such that ``pixel * scale + offset``
    is ``(pixel / 255 - mean) / std``: the reader's normalisation, or the
    model's first layer when the reader ends at uint8."""
    scale = [1.0 / (255.0 * s) for s in config.std]
    offset = [-m / s for m, s in zip(config.mean, config.std)]
    return scale, offset


def train_transform(jpeg, config: ReaderConfig):
    """Random resized crop (Inception style), resize, flip, normalise (see
    ``ReaderConfig.normalize``)."""
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(jpeg)
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, shape=[1, 1, 4])
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=whole, min_object_covered=MIN_OBJECT_COVERED,
        aspect_ratio_range=config.aspect_ratio_range, area_range=config.area_range,
        max_attempts=CROP_ATTEMPTS, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = _resized(image, config)
    if config.flip:
        image = tf.image.random_flip_left_right(image)
    return _finish(image, config)


def eval_transform(jpeg, config: ReaderConfig):
    """Central crop of ``eval_crop_fraction`` of the short side, resize, normalise.

    The same pixels as "resize the short side to image_size /
    eval_crop_fraction, then centre-crop image_size", decoded only inside the crop.
    """
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(jpeg)
    window = tf.stack(eval_window(shape[0], shape[1], config))
    image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = _resized(image, config)
    return _finish(image, config)


def eval_window(height, width, config: ReaderConfig):
    """``(top, left, side, side)``: the evaluation crop of a ``height`` x
    ``width`` image, the central square of ``eval_crop_fraction`` of the short
    side (at least one pixel). Plain ints in, plain ints out; TensorFlow
    integer tensors in, tensors out (the TensorFlow reader's graph)."""
    if isinstance(height, int) and isinstance(width, int):
        import numpy as np

        # In float32, as the graph computes it, so both give the same side.
        side = max(1, int(np.float32(min(height, width)) * np.float32(config.eval_crop_fraction)))
    else:
        import tensorflow as tf

        side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * config.eval_crop_fraction,
                       tf.int32)
        side = tf.maximum(side, 1)
    return (height - side + 1) // 2, (width - side + 1) // 2, side, side
