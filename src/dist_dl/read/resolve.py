"""Dataset locations to the exact Parquet file URLs the readers read, and
opening one of them with pyarrow (no Petastorm needed)."""
from __future__ import annotations

import functools
import os

from dist_dl.core.locations import file_path, file_url, is_remote, local_path
from dist_dl.core.optional import require

__all__ = ["resolve_files", "to_url", "parquet_file"]


def to_url(location: str) -> str:
    """A URL both readers accept for ``location``.

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

    Both readers and `plan_shards()` get this list, so they
    agree on the order of files (and so of row groups): a folder's files are
    listed here, also on remote storage, and never by a reader.

    Args:
        url: A folder of Parquet files (as written by
            `prepare_image_dataset()`), a Delta table, or
            a path/URL as accepted by `to_url()`. The folder of an MDS
            dataset (one with ``index.json``) gives its shards instead,
            with columns ``image`` and ``label``
            (`mds_shards()`; call that for others).
        version: For a Delta table, the table version to read (default: the
            latest). The files are those of that version exactly, taken from
            the Delta log (files of other versions in the folder are not read).

    Raises:
        ValueError: ``version`` given for a dataset that is not a Delta table,
            or no Parquet files found.
    """
    url = to_url(url)
    local = file_path(url)
    if local is not None and version is None and not os.path.isdir(
            os.path.join(local, "_delta_log")):
        from dist_dl.read.mds import is_mds, mds_shards

        if is_mds(local):
            return mds_shards(local)
    if local is None:
        if version is not None:
            raise ValueError("version= is supported for local (and /dbfs) Delta tables only")
        return _list_remote(url)
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
        files += [os.path.join(dirpath, n) for n in filenames if _parquet_name(n)]
    if not files:
        raise ValueError(f"no Parquet files in {local}: is it the dataset's folder?")
    return [file_url(f) for f in sorted(files)]


def _parquet_name(relative: str) -> bool:
    # Spark, pyarrow and Petastorm all ignore names starting with _ or .
    parts = relative.split("/")
    return parts[-1].endswith(".parquet") and not any(p.startswith(("_", ".")) for p in parts)


def _list_remote(url: str) -> list[str]:
    """The Parquet files under a remote folder URL (or the URL itself if it
    is a file), sorted, with pyarrow's file systems (``s3://``, ``gs://``,
    ``hdfs://``, ... as far as this pyarrow build supports them)."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(url)
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [url]
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"dataset {url!r} does not exist")
    # The URL up to where the file system's path starts: "s3://" for
    # s3://bucket/dir (path "bucket/dir"), "hdfs://nn:8020" for hdfs://nn:8020/dir.
    root = path.rstrip("/")
    prefix = url[:url.rstrip("/").rfind(root)] if root else url.rstrip("/")
    found = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted(prefix + f.path for f in found if f.type == pafs.FileType.File
                   and _parquet_name(f.path[len(root):].lstrip("/")))
    if not files:
        raise ValueError(f"no Parquet files in {url}: is it the dataset's folder?")
    return files


@functools.lru_cache(maxsize=None)
def _remote(url: str):
    from pyarrow import fs as pafs

    return pafs.FileSystem.from_uri(url)


def parquet_file(url: str, metadata=None):
    """``pyarrow.parquet.ParquetFile`` of one file URL from `resolve_files()`.

    Args:
        url: A ``file://`` URL or a remote URL pyarrow's file systems open.
        metadata: The file's footer if already read (skips reading it again).
    """
    import pyarrow.parquet as pq

    local = file_path(url)
    if local is not None:
        return pq.ParquetFile(local, metadata=metadata)
    filesystem, path = _remote(url)
    return pq.ParquetFile(filesystem.open_input_file(path), metadata=metadata)
