"""Keep the commands' output to the library's own lines.

TensorFlow's C++ runtime prints start-up lines on stderr in every process
that loads it (CPU instruction sets, oneDNN, ...), and MLflow draws a
progress bar each time it downloads a model's artifacts. On the command line
and in ``make demo`` they bury the progress and result lines, so the
commands turn them off, each only if the user has not set it: the variables
are read when TensorFlow loads and when MLflow downloads, so they are set
before either happens, in the environment that workers and Spark's Python
workers inherit (and that ``train_distributed`` passes on to its workers).
Python warnings are left alone.
"""
from __future__ import annotations

import os
from typing import MutableMapping

__all__ = ["QUIET_ENV", "quiet_defaults", "quiet_env"]

QUIET_ENV = {
    # 2: TensorFlow's C++ errors only (no INFO or WARNING lines).
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def quiet_defaults(environ: MutableMapping[str, str] | None = None) -> None:
    """Set each of ``QUIET_ENV`` in ``environ`` (default ``os.environ``)
    unless it is set already."""
    environ = os.environ if environ is None else environ
    for name, value in QUIET_ENV.items():
        environ.setdefault(name, value)


def quiet_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The ``QUIET_ENV`` variables set in ``environ`` (default ``os.environ``),
    to pass on to workers that do not inherit this process's environment
    (Spark tasks on a cluster)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in QUIET_ENV if name in environ}
