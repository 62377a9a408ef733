"""Where shards go: Parquet folders and Delta tables, sidecar files, modes.

Delta without Spark's Delta jars: the data files are plain Parquet written by
Spark or pyarrow, then committed to the Delta log with delta-rs
(``deltalake``) add actions. delta-rs' own ``write_deltalake`` is not used:
it takes Arrow data through the PyCapsule interface, which pyarrow before 14
does not have (setup.py admits 10), and its pyarrow extra needs pyarrow>=21
(the runtimes have 14 to 19).
Committing files we wrote ourselves also keeps our row-group layout.
"""
from __future__ import annotations

import json
import os
import shutil

from dist_dl.core.optional import require
from dist_dl.prepare.schema import COLUMNS, LABELS_FILE, SUMMARY_FILE

MODES = ("error", "overwrite", "append")
FORMATS = ("parquet", "delta")


def is_delta_table(path: str) -> bool:
    return os.path.isdir(os.path.join(path, "_delta_log"))


def check_destination(path: str, fmt: str, mode: str) -> None:
    """Refuse a write that would mix formats or silently replace data."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    exists = os.path.isdir(path) and any(not n.startswith(".") for n in os.listdir(path))
    if not exists:
        return
    if mode == "error":
        raise FileExistsError(f"output {path} already exists and is not empty: pass "
                              "mode='overwrite' to replace it or mode='append' to add to it")
    if fmt == "parquet" and is_delta_table(path):
        raise ValueError(f"output {path} is a Delta table; write it with format='delta'")
    if fmt == "delta" and not is_delta_table(path):
        raise ValueError(f"output {path} exists but is not a Delta table (no _delta_log); "
                         "choose an empty location for format='delta'")
    if fmt == "parquet" and mode == "overwrite" and not os.path.exists(
            os.path.join(path, LABELS_FILE)):
        # Overwrite deletes the folder: only do that to a folder we wrote.
        raise ValueError(f"output {path} exists but has no {LABELS_FILE}, so it was not "
                         "written by dist_dl; refusing to overwrite it: delete it yourself "
                         "or choose another output")


def clear_parquet_output(path: str) -> None:
    """Remove a dist_dl Parquet dataset's files (checked by check_destination)."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name.endswith(".parquet") or name in (LABELS_FILE, SUMMARY_FILE, "_SUCCESS") \
                or name.startswith(("_staging-", ".part-", "._SUCCESS")):
            shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)


def _delta_schema():
    deltalake = require("deltalake", "writing a Delta table")
    Field, Schema = deltalake.Field, deltalake.Schema
    kinds = {"binary": "binary", "int32": "integer", "string": "string"}
    return Schema([Field(name, kinds[kind], nullable=(name != "image"))
                   for name, kind in COLUMNS.items()])


def commit_delta(path: str, rel_files: list[str], mode: str) -> int:
    """Commit Parquet files already inside the table folder as one Delta
    version; return that version.

    ``mode`` is ``append`` (add to the current version) or ``overwrite``
    (the new version holds only these files; older versions keep theirs, so
    reading at an older version still works until a VACUUM).
    """
    import pyarrow.parquet as pq

    DeltaTable = require("deltalake", "writing a Delta table").DeltaTable
    transaction = require("deltalake.transaction", "writing a Delta table")
    AddAction = transaction.AddAction
    create_table_with_add_actions = transaction.create_table_with_add_actions

    actions = []
    for rel in rel_files:
        full = os.path.join(path, rel)
        st = os.stat(full)
        rows = pq.ParquetFile(full).metadata.num_rows
        actions.append(AddAction(rel, st.st_size, {}, int(st.st_mtime * 1000), True,
                                 json.dumps({"numRecords": rows})))
    if not is_delta_table(path):
        create_table_with_add_actions(path, _delta_schema(), actions, mode="error")
    else:
        table = DeltaTable(path)
        table.create_write_transaction(actions, mode=mode, schema=table.schema())
    return DeltaTable(path).version()


def spark_has_delta(spark) -> bool:
    """Whether Spark itself can write Delta (true on Databricks)."""
    from dist_dl.core.sessionkind import is_connect, session_conf

    if is_connect(spark):
        # No JVM in the client: the server's configuration says (Delta's
        # session extension, or a Databricks runtime, which has Delta built in).
        try:
            extensions = session_conf(spark, "spark.sql.extensions", "") or ""
            databricks = session_conf(spark, "spark.databricks.clusterUsageTags.sparkVersion")
        except Exception:  # a setting the server will not show
            return False
        return "DeltaSparkSessionExtension" in extensions or bool(databricks)
    try:
        spark._jvm.java.lang.Class.forName("org.apache.spark.sql.delta.DeltaLog")
        return True
    except Exception:  # py4j wraps ClassNotFoundException in its own error types
        return False


def write_json(directory: str, name: str, payload: dict) -> str:
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path
