"""Synthetic image shards for benchmarks and tests (no Spark needed)."""
from __future__ import annotations

import io
import os
import uuid

from dist_dl.core.locations import local_path
from dist_dl.prepare._output import check_destination, clear_parquet_output, commit_delta, \
    is_delta_table, write_json
from dist_dl.prepare.labels import save_label_index
from dist_dl.prepare.schema import SUMMARY_FILE, arrow_schema

__all__ = ["make_synthetic_images"]


def make_synthetic_images(output: str, rows: int, image_size: int, classes: int, *,
                          format: str = "parquet", mode: str = "error", seed: int = 0,
                          rows_per_row_group: int = 512, jpeg_quality: int = 90) -> dict:
    """Write ``rows`` random RGB JPEG images of ``image_size`` square pixels.

    Same schema, sidecar files and layout (one row group per file) as
    :func:`~dist_dl.prepare.prepare_image_dataset`. Each image is a smooth
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
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    for name, value, low in (("rows", rows, 1), ("image_size", image_size, 8),
                             ("classes", classes, 1),
                             ("rows_per_row_group", rows_per_row_group, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not isinstance(jpeg_quality, int) or not 1 <= jpeg_quality <= 95:
        raise ValueError(f"jpeg_quality must be an int in [1, 95], got {jpeg_quality!r}")
    path = local_path(output, "output")
    check_destination(path, format, mode)
    if format == "parquet" and mode == "overwrite" and os.path.isdir(path):
        clear_parquet_output(path)
    os.makedirs(path, exist_ok=True)

    rng = np.random.default_rng(seed)
    coarse = max(2, image_size // 16)
    tag = uuid.uuid4().hex[:12]
    schema = arrow_schema()
    files = []
    for start in range(0, rows, rows_per_row_group):
        count = min(rows_per_row_group, rows - start)
        images, labels = [], []
        for i in range(start, start + count):
            field = rng.integers(0, 256, (coarse, coarse, 3), dtype=np.uint8)
            smooth = np.asarray(Image.fromarray(field).resize((image_size, image_size),
                                                              Image.Resampling.BICUBIC))
            noise = rng.integers(-12, 13, smooth.shape)
            pixels = np.clip(smooth.astype(np.int16) + noise, 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=jpeg_quality)
            images.append(buf.getvalue())
            labels.append(i % classes)
        table = pa.Table.from_arrays([
            pa.array(images, pa.binary()),
            pa.array(labels, pa.int32()),
            pa.array([f"class{c}" for c in labels], pa.string()),
            pa.array([f"synthetic-{seed}-{i}" for i in range(start, start + count)], pa.string()),
            pa.array([image_size] * count, pa.int32()),
            pa.array([image_size] * count, pa.int32()),
        ], schema=schema)
        name = f"part-{start // rows_per_row_group:05d}-{tag}.parquet"
        pq.write_table(table, os.path.join(path, name), row_group_size=count,
                       compression="snappy")
        files.append(name)
    version = None
    if format == "delta":
        version = commit_delta(path, files, "overwrite" if mode == "overwrite" and
                               is_delta_table(path) else "append")
    save_label_index(path, {f"class{c}": c for c in range(classes)})
    summary = {"output": str(output), "format": format, "rows_in": rows, "rows_written": rows,
               "rows_skipped": 0, "skipped_by_reason": {}, "skipped_examples": [],
               "classes": classes, "delta_version": version,
               "encoding": {"resize_short_side": None, "max_side": None,
                            "jpeg_quality": jpeg_quality}}
    write_json(path, SUMMARY_FILE, summary)
    return summary
