"""Where data lives, said three ways: a path this process can open, a URL
Spark or Petastorm can read, and the form the user gave.

Runs anywhere (driver, Spark tasks, workers). Databricks mounts DBFS and Unity
Catalog volumes on every node (``/dbfs/...``, ``/Volumes/...``), so ``dbfs:/x``
is the file ``/dbfs/x`` to Python code; Spark reads ``dbfs:/x`` itself.
"""
from __future__ import annotations

import os

__all__ = ["local_path", "spark_path", "is_remote", "file_path", "file_url"]


def is_remote(location: str) -> bool:
    """A URL of storage Python cannot open as a file (``s3://``, ``abfss://``, ...)."""
    location = str(location)
    return "://" in location and not location.startswith(("file:", "dbfs:"))


def local_path(location: str | os.PathLike, what: str = "location") -> str:
    """The absolute file-system path of ``location`` (a path, ``file:`` URL or
    ``dbfs:/`` path).

    Raises:
        ValueError: ``location`` is a remote URL; ``what`` names the setting.
    """
    location = os.fspath(location)
    if location.startswith("dbfs:/"):
        return "/dbfs/" + location[len("dbfs:/"):].lstrip("/")
    if location.startswith("file:"):
        return "/" + location[len("file:"):].lstrip("/")
    if is_remote(location):
        raise ValueError(f"{what} {location!r} must be a file-system path every worker can "
                         "reach: a local path, a file:// URL, or on Databricks a dbfs:/ path, "
                         "/dbfs/... or /Volumes/...")
    return os.path.abspath(location)


def file_path(location: str | os.PathLike) -> str | None:
    """The absolute file-system path of ``location`` (a path, ``file:`` URL or
    ``dbfs:/`` path), or None for remote storage Python cannot open."""
    location = os.fspath(location)
    return None if is_remote(location) else local_path(location)


def file_url(path: str | os.PathLike) -> str:
    """The absolute ``file://`` URL of a local path (relative paths resolve
    against this process's working directory)."""
    return "file://" + os.path.abspath(os.fspath(path))


def spark_path(location: str | os.PathLike) -> str:
    """``location`` for Spark's readers and writers: a relative local path
    would resolve against the JVM's working directory, which need not be
    this process's, so local paths become absolute ``file://`` URLs."""
    location = os.fspath(location)
    if location.startswith("dbfs:") or "://" in location:
        return location
    return file_url(local_path(location))
