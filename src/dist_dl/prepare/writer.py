"""``prepare_image_dataset``: raw images to validated image shards (driver side).

The work (reading files, decoding, converting, resizing, encoding) runs in
Spark tasks; the driver lists inputs, checks columns and labels before any
task starts, decides what to do with bad images, and commits the output.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field

from dist_dl.core.locations import file_path, file_url, local_path, spark_path
from dist_dl.core.progress import SparkProgress
from dist_dl.core.sessionkind import default_parallelism, is_connect, session_jobs
from dist_dl.core.pyworker import prepare_python_worker
from dist_dl.core.storage import check_shared
from dist_dl.prepare._output import (check_destination, clear_parquet_output, commit_delta,
                                     is_delta_table, spark_has_delta, write_json)
from dist_dl.prepare.config import ShardConfig
from dist_dl.prepare.labels import build_label_index, load_label_index, save_label_index
from dist_dl.prepare.schema import LABELS_FILE, SPARK_PARQUET_OPTIONS, SUMMARY_FILE

__all__ = ["PrepareSummary", "prepare_image_dataset", "read_summary"]

_BAD_POLICIES = ("fail", "skip")
_EXAMPLES = 5
# Output rows per pandas frame a task yields: a few MB of images, not a
# whole Arrow batch (10,000 rows by default) of them.
_OUT_CHUNK = 64


@dataclass(frozen=True)
class PrepareSummary:
    """What a write did; also stored as ``_summary.json`` beside the data.

    ``rows_in == rows_written + rows_skipped`` always holds.
    ``skipped_by_reason`` counts skipped rows by reason (``empty``,
    ``undecodable``, ``unreadable``, ``null``); ``skipped_examples`` holds the
    first few ``(source_id, error)`` pairs. ``encoding`` holds the settings
    the images were stored with (`ShardConfig.encoding()`:
    ``resize_short_side``, ``max_side``, ``jpeg_quality``).
    """

    output: str
    format: str
    rows_in: int
    rows_written: int
    rows_skipped: int
    skipped_by_reason: dict = field(default_factory=dict)
    skipped_examples: tuple = ()
    classes: int = 0
    delta_version: int | None = None
    encoding: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["skipped_examples"] = [list(e) for e in self.skipped_examples]
        return out


def prepare_image_dataset(
    output: str,
    *,
    image_dir: str | None = None,
    labels_file: str | None = None,
    dataframe=None,
    image_col: str = "image",
    label_col: str = "label",
    source_id_col: str | None = None,
    label_index=None,
    classes: int | None = None,
    format: str = "parquet",
    mode: str = "error",
    on_bad_image: str = "fail",
    config: ShardConfig = ShardConfig(),
    spark=None,
    progress_every: float | None = 30.0,
) -> PrepareSummary:
    """Write images as shards of the schema in `dist_dl.prepare.schema`.

    Give exactly one source:

    - ``image_dir`` alone: an ImageNet-layout tree, ``<image_dir>/<label>/...``
      (every file below a class folder is one row, labelled by that folder);
    - ``image_dir`` and ``labels_file``: the files directly in ``image_dir``,
      labelled by ``labels_file``: lines ``<file name> <label>`` (space, tab or
      comma separated; the name may omit the extension), or ImageNet's
      ``LOC_val_solution.csv`` (``ImageId,PredictionString``; the first word
      of the prediction string is the label);
    - ``dataframe``: a Spark DataFrame whose ``image_col`` holds encoded image
      bytes (binary) or paths/URIs (string, e.g. the ``path`` of Spark's
      ``binaryFile`` source) and whose ``label_col`` holds names (string) or
      indexes (integer, in ``[0, classes)``).

    Files whose names start with ``.`` are not listed. Every other input row
    is either written or counted in the summary as skipped, with its reason.

    Args:
        output: Folder (path, ``file://`` URL or ``dbfs:/`` path) of the
            Parquet dataset or Delta table.
        image_dir: Source folder (see above).
        labels_file: Label list for a flat ``image_dir`` (see above).
        dataframe: Source Spark DataFrame (see above).
        image_col: Image column of ``dataframe``. Default ``"image"``.
        label_col: Label column of ``dataframe``. Default ``"label"``.
        source_id_col: Optional column of ``dataframe`` stored as
            ``source_id``; default: the path for path inputs, else
            ``sha1:<hex of the bytes>``.
        label_index: Name-to-index mapping to use (a dict, or a dataset folder
            or ``_labels.json`` to take it from): give the training set's
            index when writing its validation set. Default: the sorted
            distinct names; when appending, the existing index.
        classes: Number of classes; required for integer labels without a
            ``label_index``, optional check otherwise.
        format: ``"parquet"`` or ``"delta"``. Default ``"parquet"``.
        mode: ``"error"`` (output must not exist), ``"overwrite"`` (Delta: a
            new version with only these rows) or ``"append"``. Default
            ``"error"``.
        on_bad_image: ``"fail"`` (default): if any image cannot be read or
            decoded, nothing is written and the error names the first bad
            records; ``"skip"``: bad images are left out and counted.
        config: Encoding and layout (`ShardConfig`): e.g.
            ``ShardConfig(max_side=500)`` stores pre-resized images, their
            longer side at most 500 px.
        spark: SparkSession; default the DataFrame's, else the active one
            (or a local one).
        progress_every: Seconds between progress lines on stdout (tasks,
            images decoded and images/s, time left; ``dist_dl.core.progress``),
            and a last line when done (on a Spark Connect session, whose
            client cannot follow the tasks, only the last line). ``None`` or
            0: none.

    Returns:
        The `PrepareSummary`, also written to ``<output>/_summary.json``.
        The label index is written to ``<output>/_labels.json``.

    Raises:
        ValueError: a missing or mistyped column, labels outside
            ``[0, classes)`` or unknown to ``label_index``, empty input, bad
            images under ``on_bad_image="fail"``, or bad arguments.
        FileExistsError: ``output`` exists and ``mode="error"``.
    """
    from dist_dl.core.session import get_spark

    if (image_dir is None) == (dataframe is None):
        raise ValueError("give exactly one source: image_dir=... (a folder) or dataframe=... "
                         "(a Spark DataFrame)")
    if labels_file is not None and image_dir is None:
        raise ValueError("labels_file labels the files of image_dir; pass image_dir too")
    if on_bad_image not in _BAD_POLICIES:
        raise ValueError(f"on_bad_image must be one of {_BAD_POLICIES}, got {on_bad_image!r}")
    if not isinstance(config, ShardConfig):
        raise ValueError(f"config must be a ShardConfig, got {type(config).__name__}")
    if classes is not None and (not isinstance(classes, int) or classes < 1):
        raise ValueError(f"classes must be a positive int, got {classes!r}")
    out_path = local_path(output, "output")
    check_destination(out_path, format, mode)
    spark = spark or (dataframe.sparkSession if dataframe is not None else get_spark())
    connect = is_connect(spark)
    # Executors read the image files and write the shards.
    check_shared(spark, {"output": output}, {"image_dir": image_dir, "labels_file": labels_file},
                 "prepare_image_dataset")

    if image_dir is not None:
        rows = _list_images(image_dir, labels_file)
        src = _listing_frame(spark, rows)
        string_labels = True
        # The listing is on the driver already: no Spark job to count it.
        known = (len(rows), {label for _, _, label in rows})
    else:
        src, string_labels = _frame_source(dataframe, image_col, label_col, source_id_col)
        known = None

    group = f"dist_dl-prepare-{uuid.uuid4().hex[:8]}"
    processed = None
    # Progress counts decoded images in an accumulator; a Connect session has
    # none (no SparkContext), so there only the last line is printed.
    decoded = None if connect else spark.sparkContext.accumulator(0)
    try:
        with session_jobs(spark, group, f"dist_dl: prepare image shards into {output}"):
            rows_in = known[0] if known else src.count()
            if rows_in == 0:
                raise ValueError("the input has no rows (empty DataFrame or no image files found): "
                                 "check the source path or filter")
            if label_index is None and mode == "append" and os.path.exists(
                    os.path.join(out_path, LABELS_FILE)):
                label_index = out_path
            index = _resolve_labels(src, string_labels, label_index, classes, label_col,
                                    names=known[1] if known else None)

            processed = src.mapInPandas(_processor(index, string_labels, config, decoded),
                                        schema=_processed_ddl()).persist()
            # Decoding every image (the long part) happens in the first job on
            # `processed`; writing reads the cached result.
            with _progress(spark, group, output, decoded, rows_in, progress_every):
                by_reason, examples = _bad_rows(processed)
            skipped = sum(by_reason.values())
            if skipped and on_bad_image == "fail":
                listed = "; ".join(f"{sid}: {err}" for sid, err in examples)
                raise ValueError(f"{skipped} of {rows_in} images cannot be used ({by_reason}); "
                                 f"first: {listed}. Fix or remove these files, or pass "
                                 "on_bad_image='skip' to leave them out (they are counted in the "
                                 "summary)")
            written = rows_in - skipped
            if written == 0:
                raise ValueError(f"all {rows_in} input images were bad ({by_reason}); "
                                 f"first: {examples}")
            good = _layout(processed, written, config)
            version = _write(spark, good, output, out_path, format, mode, config)
    finally:
        if processed is not None:
            processed.unpersist()

    summary = PrepareSummary(output=str(output), format=format, rows_in=rows_in,
                             rows_written=written, rows_skipped=skipped,
                             skipped_by_reason=by_reason, skipped_examples=tuple(examples),
                             classes=len(index), delta_version=version,
                             encoding=config.encoding())
    save_label_index(out_path, index)
    write_json(out_path, SUMMARY_FILE, summary.to_dict())
    return summary


def read_summary(location) -> dict | None:
    """The summary stored beside a dataset (``_summary.json`` of a folder or
    Delta table: a path, ``file:`` URL or ``dbfs:/`` path), or None where
    there is none readable here (remote storage, shards not written by
    dist_dl, an unreadable file)."""
    path = file_path(location)
    if path is None:
        return None
    try:
        with open(os.path.join(path, SUMMARY_FILE)) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


# -- sources -----------------------------------------------------------------

def _list_images(image_dir: str, labels_file: str | None) -> list[tuple]:
    """(source_id, path, label_name) for every file of the source folder."""
    root = local_path(image_dir)
    if not os.path.isdir(root):
        raise ValueError(f"image_dir {image_dir!r} is not a folder")
    rows = []
    if labels_file is None:
        stray = [n for n in os.listdir(root)
                 if not n.startswith(".") and os.path.isfile(os.path.join(root, n))]
        if stray:
            raise ValueError(f"image_dir {root} has files outside class folders ({stray[:3]}): "
                             "a tree needs <image_dir>/<label>/<image>; for a flat folder pass "
                             "labels_file=...")
        for label in sorted(os.listdir(root)):
            class_dir = os.path.join(root, label)
            if label.startswith(".") or not os.path.isdir(class_dir):
                continue
            for dirpath, dirnames, filenames in os.walk(class_dir):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    if not name.startswith("."):
                        full = os.path.join(dirpath, name)
                        rows.append((os.path.relpath(full, root), full, label))
        return rows
    labels = _read_labels_file(labels_file)
    names = sorted(n for n in os.listdir(root)
                   if not n.startswith(".") and os.path.isfile(os.path.join(root, n)))
    unlabelled, used = [], set()
    for name in names:
        key = name if name in labels else os.path.splitext(name)[0]
        if key not in labels:
            unlabelled.append(name)
            continue
        used.add(key)
        rows.append((name, os.path.join(root, name), labels[key]))
    if unlabelled:
        raise ValueError(f"{len(unlabelled)} files in {root} have no label in {labels_file} "
                         f"(first: {unlabelled[:3]}): add them to the label list or move them")
    missing = sorted(set(labels) - used)
    if missing:
        raise ValueError(f"{len(missing)} entries of {labels_file} have no file in {root} "
                         f"(first: {missing[:3]}): is image_dir the right folder?")
    return rows


def _read_labels_file(path: str) -> dict[str, str]:
    labels = {}
    with open(local_path(path)) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#") or (number == 1 and "ImageId" in line):
                continue
            parts = line.split(",", 1) if "," in line else line.split(None, 1)
            if len(parts) != 2 or not parts[1].split():
                raise ValueError(f"{path}, line {number}: expected '<file name> <label>', "
                                 f"got {line!r}")
            labels[parts[0].strip()] = parts[1].split()[0]
    if not labels:
        raise ValueError(f"labels_file {path} has no labels")
    return labels


def _progress(spark, group, output, decoded, rows_in, every):
    """Progress lines while the images are decoded: `SparkProgress` on a
    classic session; on a Connect session, whose client cannot follow the
    jobs' tasks, one line when done (the Spark UI shows the stage)."""
    import contextlib
    import time

    if decoded is not None:
        return SparkProgress(spark.sparkContext, group, label=f"prepare-data {output}",
                             counter=decoded, total=rows_in, every=every)

    @contextlib.contextmanager
    def done_line():
        start = time.perf_counter()
        yield
        if every:
            took = time.perf_counter() - start
            print(f"prepare-data {output}: {rows_in} images decoded in {took:.0f} s "
                  f"({rows_in / max(took, 1e-9):.0f} images/s; a Spark Connect session: no "
                  f"progress lines while it runs)", flush=True)

    return done_line()


def _listing_frame(spark, rows):
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    schema = StructType([StructField("_source_id", StringType()),
                         StructField("_path", StringType()),
                         StructField("_bytes", BinaryType()),
                         StructField("_label_name", StringType()),
                         StructField("_label", LongType())])
    # Small partitions: each task reads and re-encodes its files.
    slices = max(default_parallelism(spark), math.ceil(len(rows) / 500))
    data = [(sid, path, None, label, None) for sid, path, label in rows]
    if is_connect(spark):  # no RDDs: the client sends the listing as a local relation
        return spark.createDataFrame(data, schema).repartition(slices)
    return spark.createDataFrame(spark.sparkContext.parallelize(data, slices), schema)


def _frame_source(df, image_col, label_col, source_id_col):
    """Check the caller's columns; return (normalised frame, labels are names)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, IntegralType, StringType

    fields = {f.name: f.dataType for f in df.schema.fields}
    for role, col in (("image_col", image_col), ("label_col", label_col),
                      ("source_id_col", source_id_col)):
        if col is not None and col not in fields:
            raise ValueError(f"column {col!r} ({role}) is not in the DataFrame; its columns are "
                             f"{sorted(fields)}: pass {role}=<the right column>")
    image_type, label_type = fields[image_col], fields[label_col]
    if not isinstance(image_type, (BinaryType, StringType)):
        raise ValueError(f"column {image_col!r} has type {image_type.simpleString()}; expected "
                         "binary (encoded image bytes) or string (a path or URI): cast it, or "
                         "read files with spark.read.format('binaryFile') and use 'content'")
    if not isinstance(label_type, (StringType, IntegralType)):
        raise ValueError(f"column {label_col!r} has type {label_type.simpleString()}; expected "
                         "string (label names) or an integer type (label indexes): cast it")
    is_path = isinstance(image_type, StringType)
    string_labels = isinstance(label_type, StringType)
    if source_id_col is not None:
        sid = F.col(source_id_col).cast("string")
    elif is_path:
        sid = F.col(image_col)
    else:
        sid = F.lit(None).cast("string")  # filled with the sha1 of the bytes in the task
    return df.select(
        sid.alias("_source_id"),
        (F.col(image_col) if is_path else F.lit(None).cast("string")).alias("_path"),
        (F.lit(None).cast("binary") if is_path else F.col(image_col)).alias("_bytes"),
        (F.col(label_col) if string_labels else F.lit(None).cast("string")).alias("_label_name"),
        (F.lit(None).cast("long") if string_labels else F.col(label_col).cast("long"))
        .alias("_label"),
    ), string_labels


def _resolve_labels(src, string_labels, label_index, classes, label_col,
                    names=None) -> dict[str, int]:
    from pyspark.sql import functions as F

    given = load_label_index(label_index) if label_index is not None else None
    if string_labels:
        if names is None:
            names = [r[0] for r in src.select("_label_name").distinct().collect()]
        if None in names:
            raise ValueError(f"column {label_col!r} has null labels: drop or fill those rows")
        if given is not None:
            unknown = sorted(set(names) - set(given))
            if unknown:
                raise ValueError(f"{len(unknown)} label names in {label_col!r} are not in "
                                 f"label_index (first: {unknown[:5]}): pass the index that "
                                 "covers them, or drop those rows")
            index = given
        else:
            index = build_label_index(names)
        if classes is not None and len(index) > classes:
            raise ValueError(f"{len(index)} distinct labels but classes={classes}: raise "
                             "classes or drop the extra labels")
        return index
    if given is None and classes is None:
        raise ValueError(f"column {label_col!r} holds integer labels: pass classes=<number of "
                         "classes> (or label_index=...) so they can be checked")
    n = len(given) if given is not None else classes
    if classes is not None and given is not None and classes != n:
        raise ValueError(f"classes={classes} but label_index has {n} labels: make them agree")
    stats = src.agg(F.min("_label"), F.max("_label"),
                    F.sum(F.col("_label").isNull().cast("long")),
                    F.sum(((F.col("_label") < 0) | (F.col("_label") >= n)).cast("long"))).first()
    low, high, nulls, outside = stats
    if nulls:
        raise ValueError(f"column {label_col!r} has {nulls} null labels: drop or fill them")
    if outside:
        raise ValueError(f"column {label_col!r} has {outside} labels outside [0, {n}) "
                         f"(min {low}, max {high}): fix the labels or raise classes")
    return given if given is not None else {str(i): i for i in range(n)}


# -- the work inside tasks ---------------------------------------------------

def _processed_ddl() -> str:
    return ("image binary, label int, label_name string, source_id string, height int, "
            "width int, _error string")


def _processor(index: dict[str, int], string_labels: bool, config: ShardConfig, counter=None):
    """The task function that decodes and re-encodes images; adds the rows
    it has handled to ``counter`` (an accumulator, for progress)."""
    names = {i: name for name, i in index.items()}
    resize, quality, max_side = config.resize_short_side, config.jpeg_quality, config.max_side

    def process(frames):
        import hashlib

        import pandas as pd

        from dist_dl.prepare.images import encode_image, read_source

        prepare_python_worker()
        out = []
        for frame in frames:
            for sid, path, raw, name, label in zip(frame["_source_id"], frame["_path"],
                                                   frame["_bytes"], frame["_label_name"],
                                                   frame["_label"]):
                if path is not None and isinstance(path, str):
                    try:
                        raw = read_source(path)
                    except OSError as exc:
                        raw, error = None, f"unreadable: {type(exc).__name__}: {exc}"
                    else:
                        error = None
                else:
                    error = None
                    raw = None if raw is None else bytes(raw)
                if sid is None or not isinstance(sid, str):
                    sid = "sha1:" + hashlib.sha1(raw).hexdigest() if raw else "sha1:none"
                if string_labels:
                    label = index[name]
                else:
                    label = int(label)
                    name = names[label]
                if error is None:
                    enc = encode_image(raw, resize, quality, max_side=max_side)
                    error = enc.error
                    data, height, width = enc.data, enc.height, enc.width
                else:
                    data, height, width = None, 0, 0
                out.append((data, label, name, sid, height, width, error))
                if len(out) >= _OUT_CHUNK:
                    yield pd.DataFrame(out, columns=_COLUMNS)
                    out = []
            if counter is not None:
                counter.add(len(frame))
        if out:
            yield pd.DataFrame(out, columns=_COLUMNS)

    return process


_COLUMNS = ["image", "label", "label_name", "source_id", "height", "width", "_error"]


def _bad_rows(processed):
    from pyspark.sql import functions as F

    bad = processed.filter(F.col("_error").isNotNull())
    reason = F.substring_index(F.col("_error"), ":", 1)
    by_reason = {r[0]: int(r[1]) for r in bad.groupBy(reason).count().collect()}
    examples = [(r[0], r[1]) for r in
                bad.select("source_id", "_error").orderBy("source_id").limit(_EXAMPLES).collect()]
    return dict(sorted(by_reason.items())), examples


def _layout(processed, rows: int, config: ShardConfig):
    """Good rows in random order, cut into partitions of about one row group.

    A tree is listed class by class; without this shuffle each row group
    would hold one or two classes and a reader's shuffle buffer could not mix
    them back.
    """
    from pyspark.sql import functions as F

    parts = max(1, math.ceil(rows / config.rows_per_row_group))
    good = processed.filter(F.col("_error").isNull()).drop("_error")
    return (good.withColumn("_key", F.rand(config.seed))
            .repartitionByRange(parts, "_key").sortWithinPartitions("_key").drop("_key"))


def _write(spark, good, output, out_path, fmt, mode, config) -> int | None:
    """Write the rows; return the Delta version written (None for Parquet)."""
    rows = config.rows_per_row_group

    def writer(frame):
        # One row group per file: files are cut at rows_per_row_group rows,
        # and the block size is set above any such file, so Petastorm's unit
        # of sharding (the row group) has a known row count.
        return (frame.write.option("maxRecordsPerFile", rows)
                .option("parquet.block.size", str(1 << 30)).options(**SPARK_PARQUET_OPTIONS))

    output = spark_path(output)
    if fmt == "parquet":
        if mode == "overwrite" and os.path.isdir(out_path):
            clear_parquet_output(out_path)
        writer(good).mode("append").parquet(output)
        return None
    if spark_has_delta(spark):
        # Databricks: Spark's own Delta writer (any storage Spark can reach).
        writer(good).format("delta").mode("overwrite" if mode == "overwrite" else "append") \
            .save(output)
        history = spark.sql(f"DESCRIBE HISTORY delta.`{output}` LIMIT 1").first()
        return int(history["version"])
    staging_name = f"_staging-{uuid.uuid4().hex}"
    staging = os.path.join(out_path, staging_name)
    os.makedirs(out_path, exist_ok=True)
    try:
        writer(good).mode("overwrite").parquet(file_url(staging))
        files = sorted(n for n in os.listdir(staging) if n.endswith(".parquet"))
        for name in files:
            os.replace(os.path.join(staging, name), os.path.join(out_path, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return commit_delta(out_path, files, "overwrite" if mode == "overwrite" and is_delta_table(
        out_path) else "append")
