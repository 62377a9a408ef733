"""Settings checked by declaration.

Each field of a configuration dataclass says once, with `setting()`, what
values it takes (its type comes from the annotation; bounds, choices and
other tests from the declaration), and the class is decorated with
`checked()` (below ``@dataclass``), which checks every field on
construction, before the class's own ``__post_init__`` (left for rules that
tie fields together).
A field declared without `setting()` is an error when the class is
defined, so a new setting cannot go unchecked. Plain Python: runs on the
driver, in Spark tasks and in workers.

Errors name the setting and what it accepts: ``TrainConfig.epochs must be
a positive int, got 0`` (with a prefix), or ``num_models=1 must be an int >=
2`` for the arguments of a function.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable

__all__ = ["setting", "checked", "checked_classes", "SETTING"]

# The key of a field's declaration in its metadata.
SETTING = "dist_dl.setting"

_CHECKED: list[type] = []


@dataclasses.dataclass(frozen=True)
class _Rule:
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    nonempty: bool = False
    test: Callable[[Any], bool] | None = None
    expected: str | None = None
    why: str | None = None


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            low: float | None = None, high: float | None = None, low_open: bool = False,
            high_open: bool = False, choices=None, nonempty: bool = False,
            test: Callable[[Any], bool] | None = None, expected: str | None = None,
            why: str | None = None):
    """A dataclass field with its check declared.

    Args:
        default, default_factory: As for `dataclasses.field()`.
        low, high: Bounds of a number; inclusive unless ``low_open`` /
            ``high_open``.
        choices: The only values allowed.
        nonempty: A string (or collection) may not be empty.
        test: Any further test of a (type-checked, not None) value.
        expected: Words for what ``test`` accepts, used in the error.
        why: Appended to the error in parentheses (the reason for a bound).
    """
    rule = _Rule(low, high, low_open, high_open, tuple(choices) if choices is not None else None,
                 nonempty, test, expected, why)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={SETTING: rule})


def checked(prefix: str | None = None):
    """Class decorator, placed below ``@dataclass`` (so that the dataclass's
    ``__init__`` calls the checks): check every declared field on
    construction, then run the class's own ``__post_init__``. ``prefix``
    starts each error's name (``"TrainConfig."``, ``"data."``); None names a
    field as a function argument (``name=value``).

    Raises:
        TypeError: a field has no `setting()` declaration, or the
            decorator sits above ``@dataclass``.
    """
    def decorate(cls):
        if dataclasses.is_dataclass(cls):
            raise TypeError(f"put @checked below @dataclass on {cls.__qualname__}: the "
                            "dataclass's __init__ must see the checks")
        missing = [name for name in cls.__dict__.get("__annotations__", {})
                   if not isinstance(cls.__dict__.get(name), dataclasses.Field)
                   or SETTING not in cls.__dict__[name].metadata]
        if missing:
            raise TypeError(f"{cls.__qualname__} declares {missing} without dist_dl.core.settings."
                            "setting(...): say what values each field takes")
        own = cls.__dict__.get("__post_init__")

        def __post_init__(self):
            _check_fields(self, prefix)
            if own is not None:
                own(self)

        cls.__post_init__ = __post_init__
        _CHECKED.append(cls)
        return cls

    return decorate


def checked_classes() -> tuple[type, ...]:
    """Every class decorated with `checked()` so far (for tests)."""
    return tuple(_CHECKED)


def _kinds(hint) -> tuple[tuple[type, ...], bool]:
    """(accepted types, None allowed) of a type annotation."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        kinds = tuple(typing.get_origin(a) or a for a in args if a is not type(None))
        return kinds, type(None) in args
    return (origin or hint,), False


_HINTS: dict[type, dict] = {}


def _check_fields(obj, prefix: str | None) -> None:
    cls = type(obj)
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        kinds, nullable = _kinds(hints[f.name])
        rule = f.metadata[SETTING]
        if value is None and nullable:
            continue
        if not _ok(value, kinds, rule):
            name = f"{prefix}{f.name}" if prefix is not None else f"{f.name}={value!r}"
            text = f"{name} must be {_expected(kinds, nullable, rule)}"
            if prefix is not None:
                text += f", got {value!r}"
            if rule.why:
                text += f" ({rule.why})"
            raise ValueError(text)


def _is(value, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _ok(value, kinds, rule: _Rule) -> bool:
    if value is None or not any(_is(value, k) for k in kinds):
        return False
    if rule.choices is not None and value not in rule.choices:
        return False
    if rule.nonempty and not value:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if rule.low is not None and (value <= rule.low if rule.low_open else value < rule.low):
            return False
        if rule.high is not None and (value >= rule.high if rule.high_open else value > rule.high):
            return False
    return rule.test is None or bool(rule.test(value))


_ARTICLES = {int: "an int", float: "a number", bool: "true or false", str: "a string",
             tuple: "a tuple", dict: "a mapping"}


def _expected(kinds, nullable: bool, rule: _Rule) -> str:
    if rule.choices is not None:
        text = f"one of {rule.choices}"
    elif rule.expected is not None:
        text = rule.expected
    else:
        text = " or ".join(_ARTICLES.get(k, f"a {k.__name__}") for k in kinds)
        if rule.nonempty:
            text = text.replace("a string", "a non-empty string").replace(
                "a tuple", "a non-empty tuple").replace("a mapping", "a non-empty mapping")
        text += _bounds(rule, int in kinds and float not in kinds)
        if text == "an int >= 1":
            text = "a positive int"
    return text + (" or None" if nullable else "")


def _bounds(rule: _Rule, integer: bool) -> str:
    low, high = rule.low, rule.high
    if integer and low is not None and rule.low_open:
        low = int(low) + 1  # "an int > 0" reads better as "an int >= 1"
    if low is not None and high is not None:
        left = "(" if rule.low_open and not integer else "["
        right = ")" if rule.high_open else "]"
        return f" in {left}{low:g}, {high:g}{right}"
    if low is not None:
        return f" {'>' if rule.low_open and not integer else '>='} {low:g}"
    if high is not None:
        return f" {'<' if rule.high_open else '<='} {high:g}"
    return ""
