"""How shards are encoded and laid out."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardConfig"]


@dataclass(frozen=True)
class ShardConfig:
    """Encoding and layout of image shards, validated on construction.

    Args:
        resize_short_side: If set, images whose shorter side is longer than
            this are scaled down (aspect ratio kept) before storing; smaller
            images are not enlarged. ImageNet at 256 is what fast pipelines
            store for 224-pixel training. Default None (keep the size).
        jpeg_quality: Quality (1-95) used whenever an image is re-encoded:
            after a resize, or when the source is not an RGB JPEG (PNG,
            grayscale, CMYK, ...). RGB JPEGs kept at their size are stored
            byte for byte. Default 90.
        rows_per_row_group: Rows per Parquet row group (and per file: each
            file holds one row group). Petastorm hands whole row groups to
            ranks, so this is the unit of sharding and of streaming reads; at
            ImageNet sizes (about 110 KB per image at 256 px) 512 rows make
            row groups of about 56 MB. Default 512.
        seed: Seed of the shuffle that spreads classes over row groups (a
            folder tree lists images class by class). Default 0.
    """

    resize_short_side: int | None = None
    jpeg_quality: int = 90
    rows_per_row_group: int = 512
    seed: int = 0

    def __post_init__(self):
        if self.resize_short_side is not None and (
                not isinstance(self.resize_short_side, int) or self.resize_short_side < 8):
            raise ValueError(f"ShardConfig.resize_short_side must be None or an int >= 8, "
                             f"got {self.resize_short_side!r}")
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 95:
            raise ValueError(f"ShardConfig.jpeg_quality must be an int in [1, 95] (Pillow's "
                             f"useful range), got {self.jpeg_quality!r}")
        if not isinstance(self.rows_per_row_group, int) or self.rows_per_row_group < 1:
            raise ValueError(f"ShardConfig.rows_per_row_group must be a positive int, "
                             f"got {self.rows_per_row_group!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"ShardConfig.seed must be an int, got {self.seed!r}")
