"""The label index: label name to integer, stored as ``_labels.json``."""
from __future__ import annotations

import json
import os

from dist_dl.prepare.schema import LABELS_FILE

__all__ = ["build_label_index", "load_label_index", "save_label_index"]


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
    path = str(location)
    if path.startswith("file://"):
        path = path[len("file://"):]
    if os.path.isdir(path):
        path = os.path.join(path, LABELS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no label index at {path}: pass the folder a dist_dl writer "
                                f"wrote, or a {LABELS_FILE} file, or a dict")
    with open(path) as f:
        names = json.load(f)["labels"]
    return _check({name: i for i, name in enumerate(names)})
