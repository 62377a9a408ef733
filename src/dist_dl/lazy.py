"""Keras subclasses defined on first use.

A worker must set its thread and device environment before TensorFlow loads
(see ``dist_dl.launch.worker``), and a worker function's modules are imported
before that, when it is unpickled. So a module that offers a subclass of a
Keras class defines it in a function and exposes it through the module's
``__getattr__`` (PEP 562) made here: the class is built, and TensorFlow
imported, when the name is first looked up.

An error raised while a class is defined must reach the caller as itself.
Python turns an ``AttributeError`` escaping a module ``__getattr__`` into
"ImportError: cannot import name ..." for ``from module import Name`` (and
into ``False`` for ``hasattr``), which hides the cause, such as a Keras API
missing on another TensorFlow line. So such an error is raised as a
``LazyDefinitionError`` carrying the original message, chained to it.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["lazy_attributes", "LazyDefinitionError"]


class LazyDefinitionError(RuntimeError):
    """Defining a lazily defined attribute raised an ``AttributeError``."""


def lazy_attributes(module_globals: dict, **factories: Callable[[], type]):
    """A module ``__getattr__`` that builds each named attribute with its
    factory on first use and keeps it in the module's globals."""
    module = module_globals["__name__"]

    def __getattr__(name: str):
        factory = factories.get(name)
        if factory is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        try:
            value = factory()
        except AttributeError as exc:
            raise LazyDefinitionError(
                f"defining {module}.{name} failed: {type(exc).__name__}: {exc}") from exc
        module_globals[name] = value
        return value

    return __getattr__
