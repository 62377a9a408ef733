"""Dataset locations to the exact Parquet file URLs Petastorm should read."""
from __future__ import annotations

import os

from dist_dl.locations import file_path, file_url, is_remote, local_path
from dist_dl.optional import require

__all__ = ["resolve_files", "to_url"]


def to_url(location: str) -> str:
    """A URL Petastorm accepts for ``location``.

    Petastorm resolves a bare path against no filesystem and fails later with
    an unhelpful error, so local paths become ``file://`` URLs here (the path
    must exist), ``file:/x`` becomes ``file:///x`` and ``dbfs:/x`` becomes
    ``file:///dbfs/x`` (the FUSE mount every Databricks node has). Other URLs
    (``hdfs://``, ``s3://``, ``gs://``, ...) pass through.
    """
    location = str(location)
    if is_remote(location):
        return location
    path = local_path(location)
    if not location.startswith(("file:", "dbfs:")) and not os.path.exists(path):
        raise FileNotFoundError(f"dataset {location!r} does not exist (a local path; for other "
                                "storage pass a URL such as hdfs://... or s3://...)")
    return file_url(path)


def resolve_files(url: str, version: int | None = None) -> list[str]:
    """The Parquet files of a dataset, as a sorted list of URLs.

    Args:
        url: A folder of Parquet files (as written by
            :func:`~dist_dl.prepare.prepare_image_dataset`), a Delta table, or
            a path/URL as accepted by :func:`to_url`.
        version: For a Delta table, the table version to read (default: the
            latest). The files are those of that version exactly, taken from
            the Delta log (files of other versions in the folder are not read).

    Raises:
        ValueError: ``version`` given for a dataset that is not a Delta table,
            or no Parquet files found.
    """
    url = to_url(url)
    local = file_path(url)
    if local is None:
        if version is not None:
            raise ValueError("version= is supported for local (and /dbfs) Delta tables only")
        return [url]  # remote folder: Petastorm lists it
    if os.path.isdir(os.path.join(local, "_delta_log")):
        table = require("deltalake", "reading a Delta table").DeltaTable(local)
        if version is not None:
            if not isinstance(version, int) or version < 0:
                raise ValueError(f"version must be a Delta version number >= 0, got {version!r}")
            table.load_as_version(version)
        # file_uris() gives plain absolute paths for local tables (no scheme).
        files = sorted(to_url(f) if "://" not in f else f for f in table.file_uris())
        if not files:
            raise ValueError(f"Delta table {local} at version {table.version()} has no files: "
                             "it is empty")
        return files
    if version is not None:
        raise ValueError(f"version={version} was given but {local} is not a Delta table "
                         "(no _delta_log folder): drop version=, or write the data with "
                         "format='delta'")
    if os.path.isfile(local):
        return [url]
    files = []
    for dirpath, dirnames, filenames in os.walk(local):
        # Spark, pyarrow and Petastorm all ignore names starting with _ or .
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        files += [os.path.join(dirpath, n) for n in filenames
                  if n.endswith(".parquet") and not n.startswith(("_", "."))]
    if not files:
        raise ValueError(f"no Parquet files in {local}: is it the dataset's folder?")
    return [file_url(f) for f in sorted(files)]
