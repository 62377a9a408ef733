"""How shards are encoded and laid out."""
from __future__ import annotations

from dataclasses import dataclass

from dist_dl.core.settings import checked, setting
from dist_dl.prepare.images import MIN_SIDE

__all__ = ["ShardConfig", "DataConfig", "SOURCES"]


@dataclass(frozen=True)
@checked("ShardConfig.")
class ShardConfig:
    """Encoding and layout of image shards, validated on construction.

    Args:
        resize_short_side: If set, images whose shorter side is longer than
            this are scaled down (aspect ratio kept) before storing; smaller
            images are not enlarged. ImageNet at 256 is what fast pipelines
            store for 224-pixel training. Default None (keep the size).
        max_side: If set, images whose longer side is longer than this are
            scaled down to it (aspect ratio kept) before storing: pre-resized
            shards, which decode faster in every epoch (FFCV stores ImageNet
            at 500 px for training at 160 to 192 px; figures in
            ``benchmarks/RESULTS.md``). Smaller images are kept byte for byte
            (RGB JPEGs). With ``resize_short_side`` too, the shorter side is
            brought to ``resize_short_side`` first and the longer side then
            capped, so the cap wins for elongated images
            (`dist_dl.prepare.images.encode_image()`). Default None (no
            cap).
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

    resize_short_side: int | None = setting(None, low=MIN_SIDE)
    max_side: int | None = setting(None, low=MIN_SIDE)
    jpeg_quality: int = setting(90, low=1, high=95, why="Pillow's useful range")
    rows_per_row_group: int = setting(512, low=1)
    seed: int = setting(0)

    def encoding(self) -> dict:
        """The settings that decide the stored bytes, as recorded in the
        shards' summary (``PrepareSummary.encoding``)."""
        return {"resize_short_side": self.resize_short_side, "max_side": self.max_side,
                "jpeg_quality": self.jpeg_quality}


SOURCES = ("folder", "table", "synthetic", "sklearn_digits")


@dataclass(frozen=True)
@checked("data.")
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
        resize_short_side, max_side, jpeg_quality, rows_per_row_group: see
            `ShardConfig` (the synthetic source writes ``image_size``
            squares and uses only ``jpeg_quality`` and ``rows_per_row_group``).
        seed: Seed of the split and of synthetic pixels.
    """

    source: str = setting("synthetic", choices=SOURCES)
    train_dir: str | None = setting(None)
    val_dir: str | None = setting(None)
    val_labels_file: str | None = setting(None)
    table: str | None = setting(None)
    image_col: str = setting("image", nonempty=True)
    label_col: str = setting("label", nonempty=True)
    validation_fraction: float = setting(0.1, low=0.0, high=0.5, high_open=True)
    synthetic_rows: int = setting(1024, low=1)
    image_size: int = setting(64, low=8)
    classes: int = setting(10, low=2)
    output: str = setting("runs/shards", nonempty=True)
    format: str = setting("parquet", choices=("parquet", "delta"))
    mode: str = setting("overwrite", choices=("error", "overwrite", "append"))
    on_bad_image: str = setting("fail", choices=("fail", "skip"))
    resize_short_side: int | None = setting(None, low=MIN_SIDE)
    max_side: int | None = setting(None, low=MIN_SIDE)
    jpeg_quality: int = setting(90, low=1, high=95, why="Pillow's useful range")
    rows_per_row_group: int = setting(512, low=1)
    seed: int = setting(0)

    def __post_init__(self):
        if self.source == "folder" and not self.train_dir:
            raise ValueError("data.source is 'folder' but data.train_dir is not set: give the "
                             "folder of <label>/<image> files")
        if self.source == "table" and not self.table:
            raise ValueError("data.source is 'table' but data.table is not set: give the Spark "
                             "table (or view) name")
        if self.val_labels_file and not self.val_dir:
            raise ValueError("data.val_labels_file labels the files of data.val_dir: set val_dir")

    def shard_config(self) -> ShardConfig:
        """The encoding settings as a `ShardConfig`."""
        return ShardConfig(resize_short_side=self.resize_short_side, max_side=self.max_side,
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
