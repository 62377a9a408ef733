"""Old names of renamed parameters and configuration keys, accepted for one
release with a warning.

One helper for every rename, so each reads the same way:

- `renamed_parameters()` decorates a function, or a class (its
  ``__init__``; a configuration dataclass too): a call with an old keyword
  warns (``FutureWarning``, shown by default, naming the new name) and
  passes the value under the new name; a call with both is a ``TypeError``
  naming both.
- `renamed_attribute` keeps a renamed attribute of a result (a
  dataclass field) readable under its old name: reading it warns.
- `rename_keys()` does the same for a mapping of configuration keys (a
  YAML section, ``--set`` overrides), with the old names the dataclass was
  decorated with (`renames_of()`); there both names together are a
  ``ValueError``, as every other bad key of a configuration.

Plain Python, no imports from the library: every stage may use it.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, Mapping, TypeVar

__all__ = ["renamed_parameters", "rename_keys", "renames_of", "renamed_attribute",
           "RENAMES_ATTRIBUTE"]

F = TypeVar("F", bound=Callable)

RENAMES_ATTRIBUTE = "__renamed_parameters__"


def renamed_parameters(renames: Mapping[str, str]) -> Callable[[F], F]:
    """Accept each old keyword of ``renames`` (old name -> new name) for one
    release: warn, naming the new name, and pass the value under it.

    Works on a function or a class (its ``__init__`` is wrapped; the old
    names are kept on the class for `rename_keys()`). The signature shown
    by ``inspect.signature`` and ``help`` is the new one.
    """
    renames = dict(renames)
    for old, new in renames.items():
        if old == new or not old.isidentifier() or not new.isidentifier():
            raise ValueError(f"renamed_parameters needs old -> new identifiers that differ, "
                             f"got {old!r} -> {new!r}")

    def decorate(target):
        if inspect.isclass(target):
            target.__init__ = _wrap(target.__init__, renames, target.__qualname__)
            setattr(target, RENAMES_ATTRIBUTE, {**renames_of(target), **renames})
            return target
        wrapped = _wrap(target, renames, target.__qualname__)
        setattr(wrapped, RENAMES_ATTRIBUTE, renames)
        return wrapped

    return decorate


def _wrap(function: Callable, renames: dict[str, str], owner: str) -> Callable:
    @functools.wraps(function)
    def call(*args, **kwargs):
        if renames.keys() & kwargs.keys():
            kwargs = rename_keys(kwargs, renames, where=f"{owner}()", kind="argument",
                                 stacklevel=3)
        return function(*args, **kwargs)

    return call


def renames_of(target) -> dict[str, str]:
    """The old -> new names ``target`` was decorated with (empty if none)."""
    return dict(getattr(target, RENAMES_ATTRIBUTE, {}))


def rename_keys(values: Mapping[str, Any], renames: Mapping[str, str], *, where: str,
                kind: str = "key", stacklevel: int = 2,
                error: type[Exception] = TypeError) -> dict[str, Any]:
    """``values`` with every old key of ``renames`` under its new name.

    Each old key found warns (``FutureWarning``) naming the new one; an old
    and a new key together are an ``error`` (``TypeError``, as Python's own
    for an argument given twice) naming both, whatever their values.

    Args:
        where: What holds the keys, for the messages (``"TrainConfig()"``,
            ``"tracking in conf/demo.yaml"``).
        kind: ``"argument"`` or ``"key"``, for the messages.
        stacklevel: Passed to ``warnings.warn`` (2, the default: the warning
            points at the caller of this function).
        error: The exception for an old and a new key together (the
            configuration loader's is ``ValueError``, as for its other bad keys).
    """
    out = dict(values)
    for old, new in renames.items():
        if old not in out:
            continue
        if new in out:
            raise error(f"{where} got both {kind} {old!r} and its new name {new!r}: "
                            f"give only {new!r}")
        warnings.warn(f"{kind} {old!r} of {where} is deprecated and will be removed in the "
                      f"next release: use {new!r}", FutureWarning, stacklevel=stacklevel)
        out[new] = out.pop(old)
    return out


class renamed_attribute:
    """A class attribute that reads the renamed attribute ``new``, warning
    (``FutureWarning``) that its own name is the old one::

        @dataclass(frozen=True)
        class Result:
            class_names: tuple
            classes = renamed_attribute("class_names")

    Not a dataclass field (no annotation): the old name is neither a
    constructor argument nor compared or printed.
    """

    def __init__(self, new: str):
        self.new = new
        self.old = new
        self.owner = "?"

    def __set_name__(self, owner, name: str) -> None:
        self.old, self.owner = name, owner.__qualname__

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        warnings.warn(f"attribute {self.old!r} of {self.owner} is deprecated and will be removed "
                      f"in the next release: use {self.new!r}", FutureWarning, stacklevel=2)
        return getattr(obj, self.new)
