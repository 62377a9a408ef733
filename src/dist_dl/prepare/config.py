"""How shards are encoded and laid out."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardConfig", "DataConfig", "SOURCES"]


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


SOURCES = ("folder", "table", "synthetic", "sklearn_digits")


@dataclass(frozen=True)
class DataConfig:
    """The ``data`` section of a configuration: what ``dist-dl prepare-data``
    writes, and where the later steps find it.

    Shards go to ``<output>/train`` and ``<output>/validation``.

    Args:
        source: ``"folder"``: an ImageNet-layout tree ``train_dir/<label>/...``
            (validation from ``val_dir``, a tree, or flat files labelled by
            ``val_labels_file``); ``"table"``: a Spark table ``table`` with
            ``image_col`` (bytes or paths) and ``label_col``; ``"synthetic"``:
            random JPEGs (benchmarks); ``"sklearn_digits"``: scikit-learn's
            bundled 8x8 digits, scaled up (real images, no download: demos).
        train_dir, val_dir, val_labels_file: Folder source (see above).
        table, image_col, label_col: Table source.
        validation_fraction: Rows held out for validation when the source has
            no validation set of its own (table, synthetic, digits).
        synthetic_rows, image_size, classes: Synthetic source (image_size
            also scales the digits).
        output: Folder (or ``dbfs:/`` path) of the shards.
        format: ``"parquet"`` or ``"delta"``.
        mode: ``"error"``, ``"overwrite"`` or ``"append"`` for an existing output.
        on_bad_image: ``"fail"`` or ``"skip"`` (counted in the summary).
        resize_short_side, jpeg_quality, rows_per_row_group: see :class:`ShardConfig`.
        seed: Seed of the split and of synthetic pixels.
    """

    source: str = "synthetic"
    train_dir: str | None = None
    val_dir: str | None = None
    val_labels_file: str | None = None
    table: str | None = None
    image_col: str = "image"
    label_col: str = "label"
    validation_fraction: float = 0.1
    synthetic_rows: int = 1024
    image_size: int = 64
    classes: int = 10
    output: str = "runs/shards"
    format: str = "parquet"
    mode: str = "overwrite"
    on_bad_image: str = "fail"
    resize_short_side: int | None = None
    jpeg_quality: int = 90
    rows_per_row_group: int = 512
    seed: int = 0

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"data.source must be one of {SOURCES}, got {self.source!r}")
        if self.source == "folder" and not self.train_dir:
            raise ValueError("data.source is 'folder' but data.train_dir is not set: give the "
                             "folder of <label>/<image> files")
        if self.source == "table" and not self.table:
            raise ValueError("data.source is 'table' but data.table is not set: give the Spark "
                             "table (or view) name")
        if self.val_labels_file and not self.val_dir:
            raise ValueError("data.val_labels_file labels the files of data.val_dir: set val_dir")
        if not isinstance(self.validation_fraction, (int, float)) or \
                not 0 <= self.validation_fraction < 0.5:
            raise ValueError(f"data.validation_fraction must be in [0, 0.5), "
                             f"got {self.validation_fraction!r}")
        for name, low in (("synthetic_rows", 1), ("image_size", 8), ("classes", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"data.{name} must be an int >= {low}, got {value!r}")
        if self.format not in ("parquet", "delta"):
            raise ValueError(f"data.format must be 'parquet' or 'delta', got {self.format!r}")
        if self.mode not in ("error", "overwrite", "append"):
            raise ValueError(f"data.mode must be 'error', 'overwrite' or 'append', got {self.mode!r}")
        if self.on_bad_image not in ("fail", "skip"):
            raise ValueError(f"data.on_bad_image must be 'fail' or 'skip', got {self.on_bad_image!r}")
        self.shard_config()  # validates the shard settings, naming them

    def shard_config(self) -> ShardConfig:
        """The encoding settings as a :class:`ShardConfig`."""
        return ShardConfig(resize_short_side=self.resize_short_side,
                           jpeg_quality=self.jpeg_quality,
                           rows_per_row_group=self.rows_per_row_group, seed=self.seed)

    @property
    def train_output(self) -> str:
        return _join(self.output, "train")

    @property
    def validation_output(self) -> str:
        return _join(self.output, "validation")


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name
