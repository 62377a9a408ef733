"""``np < 0``: worker processes on the driver machine, Horovod over Gloo on loopback.

Horovod's Gloo pieces are used as they are (its rendezvous server, slot
assignment and environment), but not its function launcher
``horovod.runner.run``: that one hands every worker ``HOROVOD_CYCLE_TIME="(None,)"``
(see ``device.horovod_env_fixes``) and gives no hook for per-rank output,
error records or a deadline. The processes are ours: each in its own process
group, so that nothing a worker started outlives the job.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import cloudpickle

from dist_dl import compat
from dist_dl.launch.errors import JobTimeout, failure_from
from dist_dl.launch.protocol import DriverSink
from dist_dl.launch.worker import WorkerOptions

__all__ = ["LocalBackend"]


def _loopback_interface() -> str:
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    raise RuntimeError("no network interface has 127.0.0.1; local workers need loopback")


class _Rendezvous:
    """Horovod's Gloo rendezvous server, bound to 127.0.0.1 only.

    ``RendezvousServer.start`` binds every interface; the server class itself
    takes an address, so it is built directly here.
    """

    def __init__(self, slots):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._server = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
        self._server.init(slots)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="dist_dl-rendezvous")
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class LocalBackend:
    """Runs workers as child processes of the driver.

    Args:
        grace: Seconds past the job's timeout before the driver kills workers
            that did not stop themselves.
    """

    name = "local"

    def __init__(self, grace: float = 15.0):
        self.grace = grace

    def run(self, fn: Callable[..., Any], kwargs: dict, num_proc: int, options: WorkerOptions,
            sink: DriverSink) -> Any:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

        workdir = tempfile.mkdtemp(prefix=f"dist_dl-{options.job_id}-")
        payload, result = os.path.join(workdir, "payload.pkl"), os.path.join(workdir, "result.pkl")
        with open(payload, "wb") as f:
            cloudpickle.dump((options, fn, kwargs), f)
        slots = get_host_assignments(parse_hosts(f"localhost:{num_proc}"), num_proc)
        rendezvous = _Rendezvous(slots)
        # Keras 2 as tf.keras from the start (the payload may import TensorFlow), unless set.
        base_env = dict({**compat.worker_env(), **os.environ}, PYTHONUNBUFFERED="1", **{
            k: str(v) for k, v in create_run_env_vars(
                "127.0.0.1", [_loopback_interface()], rendezvous.port).items()})
        procs: list[subprocess.Popen] = []
        readers: list[threading.Thread] = []
        first_failed = None
        expired = False
        try:
            for slot in slots:
                env = {**base_env, **create_slot_env_vars(slot)}
                proc = subprocess.Popen(
                    [sys.executable, "-m", "dist_dl.launch._worker_main", payload, result],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                    start_new_session=True)
                procs.append(proc)
                for pipe in (proc.stdout, proc.stderr):
                    reader = threading.Thread(target=_forward, args=(pipe, sink), daemon=True)
                    reader.start()
                    readers.append(reader)
            deadline = time.monotonic() + options.timeout + self.grace if options.timeout else None
            while True:
                codes = [p.poll() for p in procs]
                failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    first_failed = failed[0]
                    break
                if all(c == 0 for c in codes):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    expired = True
                    break
                time.sleep(0.05)
        finally:
            _stop(procs)
            for reader in readers:
                reader.join(5)
            sink.close()
            rendezvous.stop()
        try:
            if expired:
                raise JobTimeout(
                    f"the job did not finish within its timeout of {options.timeout:g} s "
                    f"(+{self.grace:g} s grace) and its workers did not stop themselves; "
                    "they were killed")
            if first_failed is not None:
                raise failure_from(sink, first_failed, options.timeout)
            with open(result, "rb") as f:
                return cloudpickle.load(f)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _forward(pipe, sink: DriverSink) -> None:
    with pipe:
        while True:
            chunk = pipe.read1(65536)
            if not chunk:
                return
            sink.feed(chunk.decode(errors="replace"))


def _stop(procs: list[subprocess.Popen]) -> None:
    """End every worker and everything it started (its whole process group)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = False
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
                alive = True
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
