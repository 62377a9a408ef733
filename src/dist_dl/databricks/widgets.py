"""Notebook parameters: Databricks widgets when ``dbutils`` exists, their
defaults otherwise (a notebook run locally or in the test suite)."""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["read_widgets"]


def read_widgets(defaults: Mapping[str, Any], dbutils=None) -> dict[str, Any]:
    """Create a text widget per key (default shown) and read them all once.

    Args:
        defaults: Widget name -> default value. The value read back is
            converted to the default's type (int, float, bool or str).
        dbutils: The notebook's ``dbutils``; None outside Databricks, in which
            case the defaults are returned as they are.

    Raises:
        ValueError: A widget's text does not convert to its default's type;
            the message names the widget.
    """
    if dbutils is None:
        return dict(defaults)
    values = {}
    for name, default in defaults.items():
        dbutils.widgets.text(name, str(default))
        values[name] = _convert(name, dbutils.widgets.get(name), default)
    return values


def _convert(name: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError(text)
            return lowered == "true"
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise ValueError(f"widget {name!r} must be {type(default).__name__}, got {text!r}") from None
    return text
