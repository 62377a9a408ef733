"""Workers as processes on this machine: `WorkerProcesses` (the worker
processes of one job, started and ended together: shared by every engine's
processes on the driver and by the Spark task that hosts an engine's
workers), `run_processes()` (a job's processes on the driver, one per
environment) and `BarrierLocalBackend` (an engine's workers as
processes on the driver, on 127.0.0.1).

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

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import cloudpickle

from dist_dl.launch.core.errors import JobTimeout, failure_from, runner_prefix
from dist_dl.launch.core.protocol import DriverSink
from dist_dl.launch.core.rendezvous import Engine, pick_ports, with_gpus
from dist_dl.launch.core.termination import end_process_groups
from dist_dl.launch.core.worker import WorkerOptions, launcher_path_env
from dist_dl.launch.fork import client as forkserver

__all__ = ["WorkerProcesses", "run_processes", "BarrierLocalBackend"]

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


def run_processes(fn: Callable[..., Any], kwargs: dict, envs: list[dict], options: WorkerOptions,
                  sink: DriverSink, grace: float) -> Any:
    """Run one worker process per environment in ``envs`` (rank = position)
    and return rank 0's result; the part of a local launch every engine shares.

    Raises:
        JobTimeout: the workers outlived ``options.timeout`` + ``grace``.
        WorkerError: a worker raised or died (see ``failure_from``).
    """
    workdir = tempfile.mkdtemp(prefix=f"dist_dl-{options.job_id}-")
    payload, result = os.path.join(workdir, "payload.pkl"), os.path.join(workdir, "result.pkl")
    try:
        with open(payload, "wb") as f:
            cloudpickle.dump((options, fn, kwargs), f)
        workers = WorkerProcesses(sink.feed, options.engine)
        try:
            for env in envs:
                workers.start(payload, result, env)
            deadline = time.monotonic() + options.timeout + grace if options.timeout else None
            first_failed, expired = workers.wait(deadline)
        finally:
            workers.stop()
            sink.close()
        if expired:
            raise JobTimeout(
                f"{runner_prefix(options.runner)}the job did not finish within its timeout of "
                f"{options.timeout:g} s (+{grace:g} s grace) and its workers did not stop "
                "themselves; they were killed")
        if first_failed is not None:
            raise failure_from(sink, first_failed, options.timeout, options.runner)
        with open(result, "rb") as f:
            return cloudpickle.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class BarrierLocalBackend:
    """An engine's worker processes on the driver machine, on 127.0.0.1.

    Args:
        engine: The engine.
        grace: Seconds past the job's timeout before the driver kills workers
            that did not stop themselves.
        worker_gpus: The GPU ids each place's workers see, all of them their
            own (an empty list: none, CPU training); None: the device plan's
            one GPU per worker where the host has GPUs.
    """

    name = "barrier-local"

    def __init__(self, engine: Engine, grace: float = 15.0,
                 worker_gpus: list[list[str]] | None = None):
        self.grace = grace
        self.engine = engine
        self.worker_gpus = worker_gpus

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        layout = self.engine.local_layout(num_proc)
        places = [f"127.0.0.1:{port}" for port in pick_ports(len(layout))]
        envs = []
        for place, count in enumerate(layout):
            for local in range(count):
                env = self.engine.worker_env(dict(os.environ), places, place, local, layout)
                if self.worker_gpus is not None:
                    env = with_gpus(env, self.worker_gpus[place])
                envs.append(env)
        options = dataclasses.replace(options, engine=self.engine.name)
        return run_processes(fn, kwargs, envs, options, sink, self.grace)
