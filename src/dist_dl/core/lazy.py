"""Names imported on first use: a package's public API, and Keras subclasses.

A package's ``__init__`` lists its public names and the module each comes
from, and `lazy_exports()` makes its ``__getattr__`` and ``__dir__``
(PEP 562): ``import dist_dl.read.arrow`` in a worker then loads the modules
``arrow`` imports and no others, while ``from dist_dl import HorovodRunner``
imports the launcher when it is asked for.

Keras subclasses are defined on first use too.

A worker must set its thread and device environment before TensorFlow loads
(see ``dist_dl.launch.core.worker``), and a worker function's modules are imported
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

import importlib
from typing import Callable, Mapping

__all__ = ["lazy_exports", "lazy_attributes", "LazyDefinitionError"]


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


def lazy_exports(module_globals: dict, exports: Mapping[str, str]):
    """``(__getattr__, __dir__)`` for a package whose public names are
    imported on first use.

    Args:
        module_globals: The package's ``globals()``; each name is kept there
            once imported.
        exports: Public name -> the module that defines it. Every name of the
            package's ``__all__`` must be in it.
    """
    package = module_globals["__name__"]
    missing = [name for name in module_globals.get("__all__", ()) if name not in exports]
    if missing:
        raise AssertionError(f"{package}.__all__ names {missing} without a module in its exports")

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        module_globals[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(module_globals) | set(exports))

    return __getattr__, __dir__
