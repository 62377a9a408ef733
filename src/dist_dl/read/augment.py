"""JPEG bytes to normalised image tensors: ImageNet train and eval transforms.

Both transforms decode only the pixels they keep (``decode_and_crop_jpeg``),
which is the main saving over decode-then-crop at ImageNet sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReaderConfig", "train_transform", "eval_transform"]


@dataclass(frozen=True)
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
        reader_threads: Petastorm reader threads (Parquet reads). Default 2.
    """

    image_size: int = 224
    eval_crop_fraction: float = 0.875
    area_range: tuple = (0.08, 1.0)
    aspect_ratio_range: tuple = (3 / 4, 4 / 3)
    flip: bool = True
    mean: tuple = (0.485, 0.456, 0.406)
    std: tuple = (0.229, 0.224, 0.225)
    shuffle_buffer: int = 1024
    reader_threads: int = 2

    def __post_init__(self):
        if not isinstance(self.image_size, int) or self.image_size < 8:
            raise ValueError(f"ReaderConfig.image_size must be an int >= 8, "
                             f"got {self.image_size!r}")
        if not 0 < self.eval_crop_fraction <= 1:
            raise ValueError("ReaderConfig.eval_crop_fraction must be in (0, 1], got "
                             f"{self.eval_crop_fraction!r}")
        for name in ("area_range", "aspect_ratio_range"):
            low, high = getattr(self, name)
            if not 0 < low <= high or (name == "area_range" and high > 1):
                raise ValueError(f"ReaderConfig.{name} must be (low, high) with 0 < low <= high"
                                 f"{' <= 1' if name == 'area_range' else ''}, got "
                                 f"{getattr(self, name)!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError("ReaderConfig.mean and .std must have 3 values (RGB), std > 0")
        if not isinstance(self.shuffle_buffer, int) or self.shuffle_buffer < 1:
            raise ValueError(f"ReaderConfig.shuffle_buffer must be an int >= 1, got "
                             f"{self.shuffle_buffer!r}")
        if not isinstance(self.reader_threads, int) or self.reader_threads < 1:
            raise ValueError(f"ReaderConfig.reader_threads must be an int >= 1, got "
                             f"{self.reader_threads!r}")


def _normalise(image, config: ReaderConfig):
    import tensorflow as tf

    image = tf.cast(image, tf.float32)
    mean = tf.constant([m * 255.0 for m in config.mean], tf.float32)
    std = tf.constant([s * 255.0 for s in config.std], tf.float32)
    return (image - mean) / std


def train_transform(jpeg, config: ReaderConfig):
    """Random resized crop (Inception style), flip, resize, normalise."""
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(jpeg)
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, shape=[1, 1, 4])
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=whole, min_object_covered=0.1,
        aspect_ratio_range=config.aspect_ratio_range, area_range=config.area_range,
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = tf.image.resize(image, [config.image_size, config.image_size], method="bilinear")
    if config.flip:
        image = tf.image.random_flip_left_right(image)
    return _normalise(image, config)


def eval_transform(jpeg, config: ReaderConfig):
    """Central crop of ``eval_crop_fraction`` of the short side, resize, normalise.

    The same pixels as "resize the short side to image_size /
    eval_crop_fraction, then centre-crop image_size", decoded only inside the crop.
    """
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(jpeg)
    height, width = shape[0], shape[1]
    side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * config.eval_crop_fraction,
                   tf.int32)
    side = tf.maximum(side, 1)
    window = tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])
    image = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = tf.image.resize(image, [config.image_size, config.image_size], method="bilinear")
    return _normalise(image, config)
