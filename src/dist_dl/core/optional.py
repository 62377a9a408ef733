"""Optional dependencies: import one where it is needed, or say what to install.

Some steps need a package that not every install has: scikit-learn for the
bundled sample datasets (the ``samples`` extra), deltalake for Delta tables
(the ``delta`` extra). A Databricks runtime ships its own set, and a wheel
installed with ``--no-deps`` has none of its requirements. So such packages
are imported when a step needs them, through `require()`, whose error
names the pip extra (or requirement) that provides the package.
"""
from __future__ import annotations

import importlib
import re
from types import ModuleType

__all__ = ["require", "install_hint", "PACKAGES"]

# Top-level import name -> (pip requirement, extra of dist_dl that installs
# it, or None for a requirement of dist_dl itself). Kept in step with setup.py.
PACKAGES = {
    "sklearn": ("scikit-learn>=1.3", "samples"),
    "deltalake": ("deltalake>=1.0", "delta"),
    "optuna": ("optuna>=3.4", None),
    # Imported by the reader itself (read.rows.choose_reader), which falls
    # back to pyarrow under reader="auto"; listed so setup.py is checked.
    "petastorm": ("petastorm>=0.12.1", "petastorm"),
    "torch": ("torch>=2.0", "torch"),
}


def require(module: str, needed_for: str) -> ModuleType:
    """Import ``module`` (dotted names allowed) and return it.

    Args:
        module: What to import, e.g. ``"sklearn.datasets"``; its top-level
            package must be listed in ``PACKAGES``.
        needed_for: What the caller does with it, for the error
            (``"the sklearn_digits source"``).

    Raises:
        ImportError: the package is missing or broken; the message says what
            needs it and the pip command that installs it.
    """
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        name = re.split(r"[<>=!~\[; ]", PACKAGES[top][0])[0]
        raise ImportError(f"{needed_for} needs {name}, which cannot be imported here ({exc}): "
                          f"{install_hint(top)}") from exc


def install_hint(top: str) -> str:
    """The pip command that installs the package imported as ``top`` (a key
    of ``PACKAGES``): its extra of dist_dl, or its own requirement."""
    requirement, extra = PACKAGES[top]
    if extra:
        return f"pip install 'dist_dl[{extra}]' (or pip install '{requirement}')"
    return (f"pip install '{requirement}' (a requirement of dist_dl: install dist_dl with its "
            "dependencies)")
