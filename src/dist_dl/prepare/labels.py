"""The label index: label name to integer, stored as ``_labels.json``."""
from __future__ import annotations

import json
import os

from dist_dl.core.locations import file_path
from dist_dl.prepare.schema import LABELS_FILE

__all__ = ["build_label_index", "load_label_index", "save_label_index", "classes_of"]


def build_label_index(names) -> dict[str, int]:
    """Index of the sorted distinct names (ImageNet's convention: sorted wnids)."""
    return {name: i for i, name in enumerate(sorted(set(names)))}


def _check(index: dict) -> dict[str, int]:
    if not isinstance(index, dict) or not index:
        raise ValueError("label_index must be a non-empty dict of label name -> int")
    values = sorted(index.values())
    if values != list(range(len(values))) or not all(isinstance(k, str) for k in index):
        raise ValueError("label_index must map string names to the integers 0..n-1, each once; "
                         f"got {len(index)} names with values {values[:5]}...")
    return dict(index)


def save_label_index(directory: str, index: dict[str, int]) -> str:
    """Write ``index`` as ``<directory>/_labels.json`` (atomically); return its path."""
    index = _check(index)
    path = os.path.join(directory, LABELS_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"labels": sorted(index, key=index.get)}, f, indent=0)
    os.replace(tmp, path)
    return path


def load_label_index(location) -> dict[str, int]:
    """The label index stored beside a dataset.

    Args:
        location: A dataset folder or Delta table (path or ``file://`` URL),
            the path of a ``_labels.json`` file, or a dict (returned checked).
    """
    if isinstance(location, dict):
        return _check(location)
    path = file_path(location) or str(location)
    if os.path.isdir(path):
        path = os.path.join(path, LABELS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no label index at {path}: pass the folder a dist_dl writer "
                                f"wrote, or a {LABELS_FILE} file, or a dict")
    with open(path) as f:
        names = json.load(f)["labels"]
    return _check({name: i for i, name in enumerate(names)})


def classes_of(location, classes: int | None = None, *, fix: str) -> tuple[int, list[str]]:
    """The number of classes of the dataset at ``location`` and their names by
    index: from the label index beside it (checked against ``classes`` when
    both are known), else from ``classes`` (names ``"0"``, ``"1"``, ...).

    Args:
        location: A dataset folder or Delta table (path, ``file:`` URL,
            ``dbfs:/`` path, or remote URL, which has no index readable here).
        classes: The number the caller was given, if any.
        fix: What the user can do when neither is known (ends the error).

    Raises:
        FileNotFoundError: ``location`` is a local path that does not exist.
        ValueError: no index and no ``classes``, or the two disagree.
    """
    path = file_path(location)
    index = None
    if path is not None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"dataset {location!r} does not exist")
        if os.path.isdir(path) and os.path.exists(os.path.join(path, LABELS_FILE)):
            index = load_label_index(path)
    if index is None:
        if classes is None:
            raise ValueError(f"{location} has no label index ({LABELS_FILE}) beside it: {fix}")
        return classes, [str(i) for i in range(classes)]
    if classes is not None and classes != len(index):
        raise ValueError(f"classes={classes} but the label index of {location} has "
                         f"{len(index)} labels: drop classes= or make them agree")
    return len(index), sorted(index, key=index.get)
