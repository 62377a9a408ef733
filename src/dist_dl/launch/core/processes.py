"""Worker processes of one job, started and ended together: shared by every
engine's local backend (Horovod, tf.distribute) and by the Spark task that
hosts a tf.distribute worker.

Each worker runs ``python -m dist_dl.launch.core._worker_main PAYLOAD RESULT`` in
its own process group, so that nothing it starts outlives the job; its stdout
and stderr are read line by line and handed to ``feed``. Where it can, the
worker is forked from a server that has imported the job's framework
(``dist_dl.launch.fork.client``) instead of starting as a new interpreter.
It gets the starting process's ``sys.path`` (``launcher_path_env``): what a
Spark task or the driver imports (``sc.addPyFile``, ``spark.submit.pyFiles``)
imports in it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from dist_dl.launch.fork import client as forkserver
from dist_dl.launch.core.worker import launcher_path_env

__all__ = ["WorkerProcesses", "end_process_groups"]

_ENTRY = "dist_dl.launch.core._worker_main"


class WorkerProcesses:
    """The worker processes of one job on this machine.

    Args:
        feed: Receives each complete line (text, with its newline) a worker
            writes to stdout or stderr; called from one reader thread per stream.
        engine: The job's engine (``WorkerOptions.engine``): which frameworks
            a fork server imports for its workers.
    """

    def __init__(self, feed: Callable[[str], None], engine: str):
        self._feed = feed
        self._engine = engine
        self.procs: list[subprocess.Popen | forkserver.ForkedProcess] = []
        self._readers: list[threading.Thread] = []

    def start(self, payload: str, result: str, env: dict):
        """Start one worker (rank = the order of ``start`` calls)."""
        env = {**env, **launcher_path_env(), "PYTHONUNBUFFERED": "1"}
        proc = forkserver.start(_ENTRY, [payload, result], env, self._engine)
        if proc is None:
            proc = subprocess.Popen(
                [sys.executable, "-m", _ENTRY, payload, result], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        for pipe in (proc.stdout, proc.stderr):
            reader = threading.Thread(target=self._forward, args=(pipe,), daemon=True,
                                      name="dist_dl-forward")
            reader.start()
            self._readers.append(reader)
        return proc

    def _forward(self, pipe) -> None:
        # Whole lines: a Spark task sends them on over one connection from
        # two reader threads, where partial lines would interleave.
        with pipe:
            for line in pipe:
                self._feed(line.decode(errors="replace"))

    def wait(self, deadline: float | None,
             stop: Callable[[], bool] = lambda: False) -> tuple[tuple[int, int] | None, bool]:
        """Wait until every worker exited 0, one failed, ``deadline``
        (``time.monotonic()``) passed, or ``stop()`` is true.

        Returns:
            ((rank, exit code) of the first failed worker or None, whether the
            deadline passed). Of workers seen failed at the same poll, one
            killed by a signal comes first: a worker SIGKILLed in an allreduce
            makes its peer fail too (exit code 1), often within the 50 ms
            between two polls, and the peer is the consequence, not the cause
            (the reliability suite's F1 once reported the peer).
        """
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                return min(failed, key=lambda failure: (failure[1] >= 0, failure[0])), False
            if all(c == 0 for c in codes) or stop():
                return None, False
            if deadline is not None and time.monotonic() > deadline:
                return None, True
            time.sleep(0.05)

    def stop(self) -> None:
        """End every worker and everything it started; wait for their output."""
        end_process_groups(self.procs)
        for reader in self._readers:
            reader.join(5)


def end_process_groups(procs: list) -> None:
    """End every process of ``procs`` (each the leader of its own process
    group, with ``pid`` and ``wait``) and everything it started: SIGTERM and
    SIGCONT to each group, up to 5 s, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = False
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
                alive = True
                if sig == signal.SIGTERM:
                    # A stopped worker (SIGSTOP, a debugger) acts on SIGTERM
                    # only once continued, as service managers do it.
                    os.killpg(proc.pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        if not alive:
            return
        end = time.monotonic() + wait
        for proc in procs:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if not any(_group_alive(p.pid) for p in procs):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
