"""Walking a job's settings (a dict of the Jobs API's JSON): where each value
is, named the way problems name it (``tasks[train].python_wheel_task``), and
what databricks-sdk loses when it reads the job."""
from __future__ import annotations

from typing import Any, Iterator

__all__ = ["label", "format_path", "task_and_field", "strings", "round_trip_losses"]


def label(item: Any, index: int) -> str:
    """A list item's name in a path: ``[<its key or name>]``, else ``[<index>]``."""
    if isinstance(item, dict):
        for key in ("task_key", "job_cluster_key", "name"):
            if isinstance(item.get(key), str):
                return f"[{item[key]}]"
    return f"[{index}]"


def format_path(path: tuple) -> str:
    """``("tasks", "[train]", "libraries")`` -> ``tasks[train].libraries``."""
    return "".join(p if p.startswith("[") else "." + p for p in path).lstrip(".") or "(job)"


def task_and_field(path: tuple) -> tuple[str | None, str]:
    """(task key, field) of a path: fields under ``tasks[<key>]`` belong to that task."""
    if len(path) > 1 and path[0] == "tasks":
        return path[1][1:-1], format_path(path[2:]) if len(path) > 2 else "(task)"
    return None, format_path(path)


def strings(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, str, bool]]:
    """(path, text, is_key) for every string in ``node``, keys included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (str(key),), str(key), True
            yield from strings(value, path + (str(key),))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from strings(item, path + (label(item, index),))
    elif isinstance(node, str):
        yield path, node, False


def round_trip_losses(before: Any, after: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """(path, what happened) for each value of ``before`` (a job) that ``after``
    (the job read by databricks-sdk and written back) lost or changed."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in before.items():
            if key not in after:
                yield path + (key,), (
                    "is lost when databricks-sdk reads the job (JobSettings.from_dict): a "
                    "misspelt or misplaced field, a value outside the field's allowed values, or "
                    "an empty value")
            else:
                yield from round_trip_losses(value, after[key], path + (key,))
        for key in after:
            if key not in before:
                yield path + (key,), "appears only after databricks-sdk reads the job"
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (one, two) in enumerate(zip(before, after)):
            yield from round_trip_losses(one, two, path + (label(one, index),))
    elif before != after:
        yield path, f"{before!r} becomes {after!r} when databricks-sdk reads the job"
