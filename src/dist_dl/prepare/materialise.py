"""A Spark DataFrame of images as shards, written once per distinct input.

``train_distributed(df)`` needs shards on storage every worker reads. They go
to ``<output_dir>/shards/<fingerprint>/{train,validation}``, where the
fingerprint names the DataFrame's data and the shard settings, so a later
call with the same data reuses them instead of writing them again. Driver
side (the writing itself runs in Spark tasks, see ``writer.py``).

Each call writes into a folder of its own and publishes it under the
fingerprint with one rename, so calls that materialise the same DataFrame at
the same time (notebooks of one cluster, threads of one program) never write
into one folder: the first rename wins, the others use its shards and delete
their own copy. Were they to write into the fingerprint's folder, their
part files would add up and every training would read each row once per
concurrent call (the reliability suite's load scenario, F9, checks this). The
rename is atomic on a POSIX file system (as a checkpoint's publication in
``train/checkpoint.py``); on a FUSE mount of object storage (``/dbfs``,
``/Volumes``) a folder's rename may be a copy, which this does not guard
against.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid

from dist_dl.core.locations import file_path

__all__ = ["materialise_dataframe", "fingerprint_dataframes"]

# Marks a complete set of shards (written last, atomically).
_DONE = "_dist_dl_materialised.json"
# Leaves of a plan that hold data in memory: nothing identifies their rows
# across calls, so such DataFrames are written afresh each time. The first
# three name them in a classic session's plan, the last in a Connect one's
# (``local_relation``, ``cached_local_relation``).
_IN_MEMORY = ("LogicalRDD", "LocalRelation", "ExternalRDD", "local_relation {")
# Above this many input files, names identify them (a new table version has
# new file names); statting each one on the driver would take minutes.
_STAT_LIMIT = 10_000


def fingerprint_dataframes(df, validation, settings: tuple) -> str | None:
    """A name for the shards of this data, or None if it has no stable identity.

    Two DataFrames get the same fingerprint when their canonical plans match
    (Spark's ``semanticHash`` is not stable across re-reads of the same files)
    and so do their input files (names; sizes and modification times too, up
    to ``_STAT_LIMIT`` files), and the shard ``settings``.
    """
    parts = []
    for frame in (df, validation):
        if frame is None:
            parts.append(None)
            continue
        plan = _canonical_plan(frame)
        files = sorted(frame.inputFiles())
        if not files or any(leaf in plan for leaf in _IN_MEMORY):
            return None
        if len(files) <= _STAT_LIMIT:
            files = [_file_identity(path) for path in files]
        parts.append((plan, frame.schema.json(), files))
    return hashlib.sha1(repr((parts, settings)).encode()).hexdigest()[:16]


def _canonical_plan(frame) -> str:
    """The frame's plan as text that the same query over the same data gives
    again: on a classic session, Spark's canonicalized analyzed plan; on a
    Spark Connect session (no JVM in the client), the client's unresolved
    plan with each node's ``common`` part cleared (its id within the session
    and the Python line that made it)."""
    from dist_dl.core.sessionkind import is_connect

    if not is_connect(frame.sparkSession):
        return frame._jdf.queryExecution().analyzed().canonicalized().toString()
    from google.protobuf.message import Message

    def clear(message):
        for field, value in message.ListFields():
            if field.name == "common":
                message.ClearField(field.name)
            elif field.message_type is not None:
                for item in value if field.label == field.LABEL_REPEATED else (value,):
                    if isinstance(item, Message):
                        clear(item)
        return message

    return str(clear(frame._plan.to_proto(frame.sparkSession.client)))


def _file_identity(path: str) -> tuple:
    local = file_path(path)
    if local is not None:
        try:
            st = os.stat(local)
            return (path, st.st_size, st.st_mtime_ns)
        except OSError:
            pass
    return (path,)  # remote storage: the name (new data comes in new files)


def _rows_per_row_group(rows: int, workers: int) -> int:
    # Petastorm hands whole row groups to workers: at least four per worker
    # keeps shards even; 512 is the ImageNet-scale size.
    return max(1, min(512, math.ceil(rows / (4 * workers))))


def materialise_dataframe(df, validation, output_dir: str, *, image_col: str, label_col: str,
                          classes: int | None, seed: int, num_workers: int,
                          validation_fraction: float, max_side: int | None = None):
    """Write a DataFrame (and its validation split) as shards, or reuse the
    shards an earlier call wrote for the same data; see
    `fingerprint_dataframes()`.

    Args:
        df, validation: DataFrames of images and labels; with no
            ``validation``, ``validation_fraction`` of ``df`` is held out.
        output_dir: Local folder (every worker's) the shards go under.
        image_col, label_col, classes, seed: As for
            `prepare_image_dataset()`.
        num_workers: The readers the shards are cut for (row groups).
        max_side: Cap on the stored images' longer side
            (`ShardConfig`); None keeps their size.

    Returns:
        (train shards folder, validation shards folder or None, rows in,
        written and skipped per split, a folder to delete after use or None:
        shards of in-memory data that no later call can reuse).
    """
    settings = (image_col, label_col, classes, seed, num_workers,
                validation_fraction if validation is None else None)
    if max_side is not None:
        # Only when set: shards written before the setting existed keep
        # their fingerprint.
        settings += (("max_side", max_side),)
    fingerprint = fingerprint_dataframes(df, validation, settings)
    name = fingerprint or f"unnamed-{uuid.uuid4().hex[:16]}"
    root = os.path.join(output_dir, "shards", name)
    done = os.path.join(root, _DONE)
    if os.path.exists(done):
        return _reused(root)
    if fingerprint is None:
        print(f"dist_dl: the DataFrame holds in-memory data (no input files identify it), so "
              f"its shards at {root} cannot be reused by a later call", flush=True)
    staging = os.path.join(output_dir, "shards", f".{name}.writing-{uuid.uuid4().hex[:12]}")
    try:
        rows, has_validation = _write_shards(staging, df, validation, image_col=image_col,
                                             label_col=label_col, classes=classes, seed=seed,
                                             num_workers=num_workers,
                                             validation_fraction=validation_fraction,
                                             max_side=max_side)
        if os.path.exists(root) and not os.path.exists(done):
            # Left by a call that did not finish, or written in place (not
            # by this library); a complete one has its marker.
            shutil.rmtree(root, ignore_errors=True)
        try:
            os.rename(staging, root)
        except OSError:
            if not os.path.exists(done):
                raise
            # Another call published the same data's shards first.
            return _reused(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return (os.path.join(root, "train"),
            os.path.join(root, "validation") if has_validation else None, rows,
            None if fingerprint else root)


def _reused(root: str):
    with open(os.path.join(root, _DONE)) as f:
        record = json.load(f)
    print(f"dist_dl: reusing the shards of this DataFrame at {root}")
    return (os.path.join(root, "train"),
            os.path.join(root, "validation") if record.get("validation") else None,
            record["rows"], None)


def _write_shards(folder: str, df, validation, *, image_col, label_col, classes, seed,
                  num_workers, validation_fraction, max_side) -> tuple[dict, bool]:
    """Write the splits under ``folder`` and its completion marker last;
    rows in, written and skipped per split, and whether there is a
    validation split."""
    from dist_dl.prepare._output import write_json
    from dist_dl.prepare.config import ShardConfig
    from dist_dl.prepare.writer import prepare_image_dataset

    train_url, val_url = os.path.join(folder, "train"), os.path.join(folder, "validation")
    if validation is None and validation_fraction > 0:
        df, validation = df.randomSplit([1 - validation_fraction, validation_fraction],
                                        seed=seed)
    rows = {}
    for split, frame, url in (("train", df, train_url), ("validation", validation, val_url)):
        if frame is None:
            continue
        count = frame.count()
        if count == 0:
            raise ValueError(f"the {split} split has no rows: give more data"
                             + (" or a larger validation_fraction" if split == "validation" else ""))
        summary = prepare_image_dataset(
            url, dataframe=frame, image_col=image_col, label_col=label_col,
            classes=classes, label_index=train_url if split == "validation" else None,
            config=ShardConfig(rows_per_row_group=_rows_per_row_group(count, num_workers),
                               seed=seed, max_side=max_side))
        rows[split] = {"in": summary.rows_in, "written": summary.rows_written,
                       "skipped": summary.rows_skipped}
    write_json(folder, _DONE, {"rows": rows, "validation": validation is not None})
    return rows, validation is not None
