"""Notebook parameters: Databricks widgets when ``dbutils`` exists, their
defaults otherwise (a notebook run locally or in the test suite)."""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["read_widgets", "config_from_widgets"]


def read_widgets(defaults: Mapping[str, Any], dbutils=None, *,
                 local: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Create a text widget per key (default shown) and read them all once.

    Args:
        defaults: Widget name -> default value. A value read back is
            converted to the default's type (int, float, bool or str). A
            default of None shows a blank widget: left blank it reads as None
            (pass it as a configuration override and the configuration file's
            value stands, since ``load_config`` ignores None), otherwise its
            text is read as a YAML scalar (``3``, ``0.1``, ``true``, ``x``).
        dbutils: The notebook's ``dbutils``; None outside Databricks, in which
            case the defaults are returned (with ``local`` applied).
        local: Values used instead of the defaults when there is no
            ``dbutils`` (small settings for a local or CI run), so that the
            widgets on Databricks can stay blank and defer to the configuration.

    Raises:
        ValueError: A widget's text does not convert to its default's type;
            the message names the widget. Or ``local`` names no widget.
    """
    unknown = sorted(set(local or {}) - set(defaults))
    if unknown:
        raise ValueError(f"local names {unknown}, which are not widgets: {sorted(defaults)}")
    if dbutils is None:
        return {**dict(defaults), **dict(local or {})}
    values = {}
    for name, default in defaults.items():
        dbutils.widgets.text(name, "" if default is None else str(default))
        values[name] = _convert(name, dbutils.widgets.get(name), default)
    return values


def _convert(name: str, text: str, default: Any) -> Any:
    try:
        if default is None:
            if not text.strip():
                return None
            import yaml

            return yaml.safe_load(text)
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
    except Exception as exc:  # yaml's errors
        raise ValueError(f"widget {name!r}: cannot read {text!r}: {exc}") from None
    return text


def config_from_widgets(values: Mapping[str, Any], settings: Mapping[str, str], *,
                        config_widget: str = "config", overrides_widget: str = "overrides"):
    """The `PipelineConfig` a notebook's widgets describe.

    Args:
        values: What `read_widgets()` returned.
        settings: Widget name -> the ``section.key`` it sets. Widgets left
            blank (None) keep the configuration file's value.
        config_widget: The widget naming the configuration (a shipped name or
            a YAML path).
        overrides_widget: A widget of further ``section.key=value`` settings,
            separated by spaces (may be absent or blank).
    """
    from dist_dl.app.config import PipelineConfig, load_config, parse_overrides

    missing = sorted((set(settings) | {config_widget}) - set(values))
    if missing:
        raise ValueError(f"no widget values for {missing}: read them with read_widgets first")
    overrides = {key: values[name] for name, key in settings.items()}
    overrides.update(parse_overrides(str(values.get(overrides_widget) or "").split()))
    return load_config(PipelineConfig, values[config_widget], overrides)
