"""Synthetic image shards for benchmarks and tests (no Spark needed)."""
from __future__ import annotations

import io
import itertools
import os
import uuid

from dist_dl.core.locations import local_path
from dist_dl.prepare._output import check_destination, clear_parquet_output, commit_delta, \
    is_delta_table, write_json
from dist_dl.prepare.labels import save_label_index
from dist_dl.prepare.schema import PARQUET_OPTIONS, SUMMARY_FILE, arrow_schema

__all__ = ["make_synthetic_images", "write_image_shards"]


def make_synthetic_images(output: str, rows: int, image_size: int, classes: int, *,
                          format: str = "parquet", mode: str = "error", seed: int = 0,
                          rows_per_row_group: int = 512, jpeg_quality: int = 90) -> dict:
    """Write ``rows`` random RGB JPEG images of ``image_size`` square pixels.

    Same schema, sidecar files and layout (one row group per file) as
    `prepare_image_dataset()`. Each image is a smooth
    random colour field plus fine noise, so that its JPEG is about as large
    and as slow to decode as a photograph of that size (pure noise would be
    several times larger, a flat colour several times smaller). Label ``i``
    is named ``class<i>``; labels cycle through the classes.

    Args:
        output: Folder (path or ``file://`` URL) of the dataset or table.
        rows: Number of images (> 0).
        image_size: Side of each square image in pixels (>= 8).
        classes: Number of classes (> 0).
        format: ``"parquet"`` or ``"delta"``.
        mode: ``"error"``, ``"overwrite"`` or ``"append"`` (as for
            ``prepare_image_dataset``).
        seed: Seed of the pixel generator.
        rows_per_row_group: Rows per row group (and per file).
        jpeg_quality: JPEG quality, 1 to 95.

    Returns:
        The summary dict, also written as ``_summary.json``.
    """
    import numpy as np
    from PIL import Image

    for name, value, low in (("rows", rows, 1), ("image_size", image_size, 8),
                             ("classes", classes, 1),
                             ("rows_per_row_group", rows_per_row_group, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not isinstance(jpeg_quality, int) or not 1 <= jpeg_quality <= 95:
        raise ValueError(f"jpeg_quality must be an int in [1, 95], got {jpeg_quality!r}")
    rng = np.random.default_rng(seed)
    coarse = max(2, image_size // 16)

    def images():
        for _ in range(rows):
            field = rng.integers(0, 256, (coarse, coarse, 3), dtype=np.uint8)
            smooth = np.asarray(Image.fromarray(field).resize((image_size, image_size),
                                                              Image.Resampling.BICUBIC))
            noise = rng.integers(-12, 13, smooth.shape)
            pixels = np.clip(smooth.astype(np.int16) + noise, 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=jpeg_quality)
            yield buf.getvalue()

    return write_image_shards(output, images(), [i % classes for i in range(rows)], classes,
                              format=format, mode=mode, source=f"synthetic-{seed}",
                              rows_per_row_group=rows_per_row_group,
                              encoding={"resize_short_side": None, "max_side": None,
                                        "jpeg_quality": jpeg_quality})


def write_image_shards(output: str, images, labels: list[int], classes: int, *,
                       format: str = "parquet", mode: str = "error", source: str = "images",
                       rows_per_row_group: int = 512, encoding: dict | None = None) -> dict:
    """Write encoded ``images`` (an iterable of bytes, one per label) with
    their ``labels`` (ints in ``[0, classes)``, named ``class<i>``) as image
    shards: the schema, sidecar files and layout of
    `prepare_image_dataset()`, without Spark. Row ``i``'s
    ``source_id`` is ``<source>-<i>``.

    Returns:
        The summary dict, also written as ``_summary.json``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    if not isinstance(classes, int) or classes < 1:
        raise ValueError(f"classes must be an int >= 1, got {classes!r}")
    bad = [label for label in labels if not (isinstance(label, int) and 0 <= label < classes)]
    if bad:
        raise ValueError(f"labels must be ints in [0, {classes}), got {bad[0]!r}")
    path = local_path(output, "output")
    check_destination(path, format, mode)
    if format == "parquet" and mode == "overwrite" and os.path.isdir(path):
        clear_parquet_output(path)
    os.makedirs(path, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    schema = arrow_schema()
    files, written = [], 0
    images = iter(images)
    while written < len(labels):
        data = list(itertools.islice(images, min(rows_per_row_group, len(labels) - written)))
        if not data:
            raise ValueError(f"{written} images for {len(labels)} labels: give one image per "
                             "label")
        rows = range(written, written + len(data))
        sizes = []
        for image in data:
            with Image.open(io.BytesIO(image)) as opened:
                sizes.append(opened.size)
        table = pa.Table.from_arrays([
            pa.array(data, pa.binary()),
            pa.array([labels[i] for i in rows], pa.int32()),
            pa.array([f"class{labels[i]}" for i in rows], pa.string()),
            pa.array([f"{source}-{i}" for i in rows], pa.string()),
            pa.array([h for _, h in sizes], pa.int32()),
            pa.array([w for w, _ in sizes], pa.int32()),
        ], schema=schema)
        name = f"part-{len(files):05d}-{tag}.parquet"
        pq.write_table(table, os.path.join(path, name), row_group_size=len(data),
                       **PARQUET_OPTIONS)
        files.append(name)
        written += len(data)
    version = None
    if format == "delta":
        version = commit_delta(path, files, "overwrite" if mode == "overwrite" and
                               is_delta_table(path) else "append")
    save_label_index(path, {f"class{c}": c for c in range(classes)})
    summary = {"output": str(output), "format": format, "rows_in": written,
               "rows_written": written, "rows_skipped": 0, "skipped_by_reason": {},
               "skipped_examples": [], "classes": classes, "delta_version": version,
               "encoding": dict(encoding or {"resize_short_side": None, "max_side": None,
                                             "jpeg_quality": None})}
    write_json(path, SUMMARY_FILE, summary)
    return summary
