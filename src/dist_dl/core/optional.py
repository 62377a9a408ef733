"""Optional dependencies: import one where it is needed, or say what to install.

Some steps need a package that not every install has: scikit-learn for the
bundled sample datasets (the ``samples`` extra), deltalake for Delta tables
(the ``delta`` extra). A Databricks runtime ships its own set, and a wheel
installed with ``--no-deps`` has none of its requirements. So such packages
are imported when a step needs them, through `require()`, whose error
names the pip extra (or requirement) that provides the package.

TensorFlow is one of them: Databricks Runtime 19 ML ships none, and the
library trains there with PyTorch. A driver that only launches TensorFlow
workers does not import TensorFlow (seconds of CPU): `require_installed()`
checks that it is installed, with the same error, before any worker starts.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from types import ModuleType

__all__ = ["require", "require_installed", "installed", "torch_only", "install_hint", "PACKAGES"]

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
    # The TensorFlow engines (Horovod, tf.distribute), their runners and Keras
    # models; checked by require_installed before their workers start.
    "tensorflow": ("tensorflow>=2.15", "tensorflow"),
}

# What to do instead where a package is missing, after the pip command.
_INSTEAD = {
    "tensorflow": ("; Databricks Runtime 19 ML and later ship no TensorFlow: train with PyTorch "
                   "there (train_distributed(engine='torch'), TorchDistributor)"),
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
        raise ImportError(f"{needed_for} needs {_name(top)}, which cannot be imported here "
                          f"({exc}): {install_hint(top)}{_INSTEAD.get(top, '')}") from exc


def require_installed(module: str, needed_for: str) -> None:
    """Check that ``module``'s top-level package is installed, without
    importing it: for a driver that only starts the processes that import it.

    Args:
        module: As for `require()`.
        needed_for: What needs it, for the error (``"TFDistributeRunner"``).

    Raises:
        ImportError: the package is not installed; the message says what
            needs it, the pip command that installs it and what to do instead.
    """
    top = module.partition(".")[0]
    if not installed(top):
        raise ImportError(f"{needed_for} needs {_name(top)}, which is not installed here: "
                          f"{install_hint(top)}{_INSTEAD.get(top, '')}")


def installed(top: str) -> bool:
    """Whether the top-level package ``top`` is installed (found, not imported)."""
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # a broken package, or one hidden in sys.modules
        return False


def torch_only() -> bool:
    """TensorFlow is not installed here, and torch is (Databricks Runtime 19
    ML and later)."""
    return not installed("tensorflow") and installed("torch")


def _name(top: str) -> str:
    """The distribution name of the package imported as ``top``."""
    return re.split(r"[<>=!~\[; ]", PACKAGES[top][0])[0]


def install_hint(top: str) -> str:
    """The pip command that installs the package imported as ``top`` (a key
    of ``PACKAGES``): its extra of dist_dl, or its own requirement."""
    requirement, extra = PACKAGES[top]
    if extra:
        return f"pip install 'dist_dl[{extra}]' (or pip install '{requirement}')"
    return (f"pip install '{requirement}' (a requirement of dist_dl: install dist_dl with its "
            "dependencies)")
