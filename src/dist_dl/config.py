"""Configuration: frozen dataclasses, loaded from YAML files in ``conf/`` and
overridden by command-line or notebook-widget values.

An unknown or mistyped key is an error that names the key and the valid ones;
a value of the wrong type is an error that names the key and the type.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from typing import Any, Mapping, TypeVar

__all__ = ["DemoConfig", "load_config", "from_mapping"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The demo job: a small CNN on synthetic images with HorovodRunner.

    Attributes:
        np: Workers: > 0 Spark tasks, < 0 processes on the driver.
        master: Spark master URL for the embedded session.
        epochs: Training epochs.
        steps_per_epoch: Steps per epoch on each worker.
        batch_size: Per-worker batch size.
        image_size: Side of the square synthetic images, in pixels.
        classes: Number of classes.
        learning_rate: Single-worker learning rate (scaled by the worker count).
        output: Folder for the local MLflow store.
    """

    np: int = 2
    master: str = "local[2]"
    epochs: int = 3
    steps_per_epoch: int = 30
    batch_size: int = 32
    image_size: int = 32
    classes: int = 4
    learning_rate: float = 0.01
    output: str = "runs"

    def __post_init__(self):
        if self.np == 0:
            raise ValueError("np must be non-zero: > 0 Spark tasks, < 0 local processes")
        for name in ("epochs", "steps_per_epoch", "batch_size", "image_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.classes < 2:
            raise ValueError(f"classes must be >= 2, got {self.classes}")
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8 pixels (two conv layers), got {self.image_size}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")


def from_mapping(cls: type[T], values: Mapping[str, Any], source: str = "configuration") -> T:
    """Build ``cls`` from a mapping, checking keys and types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in values if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown key {key!r} in {source}{hint}; valid keys for {cls.__name__}: "
                         f"{', '.join(fields)}")
    checked = {}
    for key, value in values.items():
        expected = hints[key]
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(expected, type) and (not isinstance(value, expected)
                                           or (expected is int and isinstance(value, bool))):
            raise ValueError(f"{key!r} in {source} must be {expected.__name__}, "
                             f"got {type(value).__name__} {value!r}")
        checked[key] = value
    return cls(**checked)


def load_config(cls: type[T], path: str | os.PathLike | None = None,
                overrides: Mapping[str, Any] | None = None) -> T:
    """Load ``cls`` from a YAML file (optional), then apply ``overrides``
    (values that are None are ignored, so unset command-line flags keep the
    file's values)."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a mapping of keys to values, got {type(loaded).__name__}")
        values.update(loaded)
        from_mapping(cls, values, source=str(path))  # report the file's own errors as such
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return from_mapping(cls, values, source=str(path) if path else "overrides")
