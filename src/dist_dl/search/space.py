"""Search spaces: what each hyperparameter may take (driver side).

Each distribution is a frozen dataclass checked on construction and maps onto
an Optuna distribution, so the random, grid and adaptive samplers share one
definition. A plain list or tuple in a space means ``Choice`` of its items.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Uniform", "LogUniform", "IntRange", "Choice", "normalize_space", "grid_points",
           "to_optuna"]


@dataclass(frozen=True)
class Uniform:
    """A float drawn uniformly from [low, high]."""

    low: float
    high: float

    def __post_init__(self):
        if not self.low < self.high:
            raise ValueError(f"Uniform(low={self.low}, high={self.high}): low must be < high")


@dataclass(frozen=True)
class LogUniform:
    """A positive float drawn uniformly on a log scale from [low, high]."""

    low: float
    high: float

    def __post_init__(self):
        if not 0 < self.low < self.high:
            raise ValueError(f"LogUniform(low={self.low}, high={self.high}): need 0 < low < high")


@dataclass(frozen=True)
class IntRange:
    """An int from low to high inclusive, every ``step``."""

    low: int
    high: int
    step: int = 1

    def __post_init__(self):
        if not (self.low <= self.high and self.step >= 1):
            raise ValueError(f"IntRange(low={self.low}, high={self.high}, step={self.step}): "
                             "need low <= high and step >= 1")

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))


@dataclass(frozen=True)
class Choice:
    """One of a fixed list of values (numbers, strings, booleans or None)."""

    options: tuple

    def __post_init__(self):
        if len(self.options) == 0:
            raise ValueError("Choice(options=()): give at least one option")
        for o in self.options:
            if o is not None and not isinstance(o, (bool, int, float, str)):
                raise ValueError(f"Choice option {o!r}: options must be numbers, strings, "
                                 "booleans or None (they go to MLflow as params)")


_KINDS = {"uniform": Uniform, "loguniform": LogUniform, "int": IntRange}


def _from_mapping(name: str, spec: Mapping[str, Any]):
    """``{"loguniform": [low, high]}`` (the form YAML configurations use)."""
    if len(spec) != 1 or next(iter(spec)) not in _KINDS:
        raise ValueError(f"space[{name!r}] = {dict(spec)!r}: write one of "
                         f"{{{', '.join(f'{k}: [low, high]' for k in _KINDS)}}} or a list of options")
    kind, bounds = next(iter(spec.items()))
    if not isinstance(bounds, (list, tuple)) or not 2 <= len(bounds) <= (3 if kind == "int" else 2):
        raise ValueError(f"space[{name!r}]: {kind} takes [low, high]"
                         f"{' or [low, high, step]' if kind == 'int' else ''}, got {bounds!r}")
    return _KINDS[kind](*bounds)


def normalize_space(space: Mapping[str, Any]) -> dict:
    """The space with lists turned into ``Choice``, ``{"loguniform": [low,
    high]}``-style mappings into distributions, and every entry checked."""
    if not space:
        raise ValueError("space is empty: give at least one hyperparameter")
    out = {}
    for name, dist in space.items():
        if isinstance(dist, (list, tuple)):
            dist = Choice(tuple(dist))
        elif isinstance(dist, Mapping):
            dist = _from_mapping(str(name), dist)
        if not isinstance(dist, (Uniform, LogUniform, IntRange, Choice)):
            raise ValueError(f"space[{name!r}] = {dist!r}: use Uniform, LogUniform, IntRange, "
                             "Choice or a list of options")
        out[str(name)] = dist
    return out


def grid_points(space: Mapping[str, Any]) -> list[dict]:
    """Every combination, in the order the space lists its values."""
    axes = []
    for name, dist in space.items():
        if isinstance(dist, Choice):
            axes.append(list(dist.options))
        elif isinstance(dist, IntRange):
            axes.append(dist.values())
        else:
            raise ValueError(f"space[{name!r}] is {type(dist).__name__}: grid search needs "
                             "Choice or IntRange values; list the floats to try as a Choice")
    names = list(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*axes)]


def to_optuna(space: Mapping[str, Any]) -> dict:
    import optuna.distributions as od

    out = {}
    for name, d in space.items():
        if isinstance(d, Uniform):
            out[name] = od.FloatDistribution(d.low, d.high)
        elif isinstance(d, LogUniform):
            out[name] = od.FloatDistribution(d.low, d.high, log=True)
        elif isinstance(d, IntRange):
            out[name] = od.IntDistribution(d.low, d.high, step=d.step)
        else:
            out[name] = od.CategoricalDistribution(list(d.options))
    return out


def grid_size(space: Mapping[str, Any]) -> int:
    return math.prod(len(d.options) if isinstance(d, Choice) else len(d.values())
                     for d in space.values())
