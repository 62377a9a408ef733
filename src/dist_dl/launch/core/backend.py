"""The launcher interface: one ``run`` that starts N workers and returns rank
0's result, with one implementation per engine and place workers can run
(``dist_dl.launch.backends`` for the engines of ``dist_dl.launch.engines``;
``dist_dl.launch.horovod`` for Horovod's).

Driver side. Each runner picks its backend; tests call each one directly.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from dist_dl.launch.core.protocol import DriverSink
from dist_dl.launch.core.worker import WorkerOptions

__all__ = ["Backend"]


class Backend(Protocol):
    """Starts ``num_proc`` workers that form one job of an engine."""

    name: str

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        """Run ``fn(**kwargs)`` on every worker; return rank 0's result.

        Raises:
            WorkerError: a worker raised or died.
            JobTimeout: the job outlived ``options.timeout``.
            NotEnoughSlots: the cluster cannot run ``num_proc`` tasks at once.
        """
