"""A Python without TensorFlow, for tests of what must work where TensorFlow
is not installed (the torch path): a ``sitecustomize`` in which sys.path's
finder leaves TensorFlow and Keras out, as if not installed (the
sitecustomize it shadows still runs), and the environment that puts it first.
"""
from __future__ import annotations

import os

SITECUSTOMIZE = """
import importlib.machinery
import importlib.util
import os
import sys


def _hidden(name):
    name = name.lower().replace("_", "-")
    return name.startswith("tensorflow") or name in ("keras", "tf-keras")


class _NoTensorFlow:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if _hidden(name.split(".")[0]):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in importlib.machinery.PathFinder.find_distributions(*args, **kwargs)
                if not _hidden(d.metadata["Name"] or ""))

    @classmethod
    def invalidate_caches(cls):
        importlib.machinery.PathFinder.invalidate_caches()


sys.meta_path[:] = [_NoTensorFlow if f is importlib.machinery.PathFinder else f
                    for f in sys.meta_path]
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
"""


def env_without_tensorflow(folder) -> dict:
    """``os.environ`` with ``folder`` (made to hold the sitecustomize) first on
    PYTHONPATH: Python processes started with it, and theirs, find no
    TensorFlow."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as out:
        out.write(SITECUSTOMIZE)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
