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
import threading
from typing import Any, Callable

from dist_dl.core import compat
from dist_dl.launch.backends.processes import run_processes
from dist_dl.launch.core.network import loopback_interface
from dist_dl.launch.core.protocol import DriverSink
from dist_dl.launch.core.worker import WorkerOptions

__all__ = ["LocalBackend"]


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

        slots = get_host_assignments(parse_hosts(f"localhost:{num_proc}"), num_proc)
        rendezvous = _Rendezvous(slots)
        try:
            # Keras 2 as tf.keras from the start (the payload may import
            # TensorFlow), unless the environment says otherwise.
            base_env = dict({**compat.worker_env(), **os.environ}, **{
                k: str(v) for k, v in create_run_env_vars(
                    "127.0.0.1", [loopback_interface()], rendezvous.port).items()})
            envs = [{**base_env, **create_slot_env_vars(slot)} for slot in slots]
            return run_processes(fn, kwargs, envs, options, sink, self.grace)
        finally:
            rendezvous.stop()
