"""Is a folder the driver writes one the executors see? Checked before jobs start.

Driver side. On a cluster only shared storage (DBFS, a Unity Catalog volume,
cloud storage, a network mount) is the same folder on every host; a local
path such as ``runs`` or ``/tmp/x`` names a different folder on each host, so
shards, checkpoints or ensemble members written there are missing where the
workers look. `check_shared()` finds that out with one small Spark task
before any job of the library starts, and names the setting to change.
"""
from __future__ import annotations

import os
import socket
import uuid

from dist_dl.core.locations import is_remote, local_path
from dist_dl.core.sessionkind import call_in_task, session_jobs, session_master

__all__ = ["check_shared", "NotShared"]

_MARKER = ".dist_dl-shared-check-"


class NotShared(ValueError):
    """A path that executors must read or write is not visible from them."""


def _look(markers: list[str]) -> tuple[str, list[bool]]:
    """Runs in a Spark task: which markers this host sees."""
    return socket.gethostname(), [os.path.exists(m) for m in markers]


def check_shared(spark, outputs: dict[str, str | None], inputs: dict[str, str | None] | None = None,
                 purpose: str = "the job") -> None:
    """Check that every folder named is the same folder on the driver and on
    an executor.

    The driver writes a marker file into each folder (creating an output
    folder that does not exist yet); one Spark task looks for the markers;
    the markers are removed. An input that does not exist is left to the
    caller's own checks; one the driver cannot write to is checked by its
    existence alone. Remote storage URLs (``s3://``, ``abfss://``, ...) are
    shared by nature and not checked; neither is anything on a ``local[...]``
    master (one machine).

    Args:
        spark: The SparkSession whose executors will use the folders.
        outputs: Setting name -> folder that executors or workers write (a
            local path, ``file:`` URL or ``dbfs:/`` path); None values are skipped.
        inputs: Setting name -> file or folder that they read.
        purpose: What needs the folders, for the message.

    Raises:
        NotShared: a folder the executor does not see; the message names the
            setting, the folder and what to use instead.
    """
    if session_master(spark).startswith("local"):
        return
    given = {**(inputs or {}), **outputs}
    tag = uuid.uuid4().hex
    probes: dict[str, str] = {}   # setting -> the path the executor must see
    markers: list[str] = []
    try:
        for name, path in given.items():
            if path is None or is_remote(str(path)):
                continue
            folder = local_path(path, name)
            if name in outputs:
                os.makedirs(folder, exist_ok=True)
            elif not os.path.exists(folder):
                continue
            if not os.path.isdir(folder):
                probes[name] = folder
                continue
            marker = os.path.join(folder, f"{_MARKER}{tag}")
            try:
                with open(marker, "w") as f:
                    f.write("written by the driver; removed after the check\n")
            except OSError:
                if name in outputs:
                    raise
                probes[name] = folder  # read-only input: its existence must do
                continue
            markers.append(marker)
            probes[name] = marker
        if not probes:
            return

        names = list(probes)
        with session_jobs(spark, f"dist_dl-shared-check-{tag[:8]}",
                          f"dist_dl: are {len(names)} folder(s) shared with the executors?"):
            host, seen = call_in_task(spark, _look, [probes[n] for n in names])
    finally:
        for marker in markers:
            try:
                os.remove(marker)
            except OSError:
                pass
    missing = [n for n, ok in zip(names, seen) if not ok]
    if missing:
        lines = "\n".join(f"  {n} = {given[n]!r} (on the driver: {local_path(given[n], n)})"
                          for n in missing)
        raise NotShared(
            f"{purpose} needs these folders on the executors too, but an executor (host "
            f"{host!r}) does not see what the driver has there:\n{lines}\n"
            "A local path names a different folder on every host of a cluster. Use storage "
            "every host shares: on Databricks a /dbfs/... or /Volumes/<catalog>/<schema>/"
            "<volume>/... path (or dbfs:/...), elsewhere a network file system mounted at the "
            "same path on every host.")
