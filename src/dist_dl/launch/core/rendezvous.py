"""How an engine's workers meet at addresses they pick themselves, whichever
backend runs them: an `Engine` says what differs between engines (the
environment that places each worker in its job: ``TF_CONFIG``; torchrun's
``MASTER_ADDR``, ``RANK``, ...; and how many worker processes each place
holds), and `pick_ports()` picks each place's port.

Ports. Each place (a Spark task, or the driver for local workers) picks one
port below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
where no ``bind(port 0)`` and no outgoing connection of another program is
ever given one, after checking that it is free; the engine's server binds it
itself (TensorFlow's gRPC server, torch's TCPStore), and a port cannot stay
reserved until then (TensorFlow's server binds without ``SO_REUSEPORT``:
a reserving socket held open makes it fail with "Could not start gRPC
server"). A collision needs another program to bind that very port
explicitly in the seconds before the worker starts. On Spark, tasks sharing
a host pick independently, so the gathered list is checked for duplicates
and picked again until every address is distinct
(`dist_dl.launch.backends.spark_classic`).
"""
from __future__ import annotations

import dataclasses
import random
import socket
from typing import Callable

from dist_dl.launch.core.device import WORKER_GPUS_VAR
from dist_dl.launch.core.worker import WorkerOptions

__all__ = ["Engine", "pick_ports", "without_foreign_place", "with_gpus", "first_rank",
           "runner_label"]

# Variables by which another launcher places a worker; inherited from a
# driver that is itself a worker, they would override the engine's place.
_FOREIGN_PLACE = ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_SIZE",
                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE",
                  "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
_PORT_FLOOR = 20000


@dataclasses.dataclass(frozen=True)
class Engine:
    """What an engine's workers need from the launch.

    Attributes:
        name: ``WorkerOptions.engine`` of its workers.
        runner: Its runner's class name, for messages.
        worker_env: ``(base, places, place, local, layout) -> env``: the
            environment of worker ``local`` of place ``place``, given the
            environment it starts from, every place's ``host:port`` and the
            number of workers of each place. Called where the worker runs
            (in its Spark task), so it may look at that host.
        local_layout: ``num_proc -> layout`` for workers on the driver:
            ``[1] * n`` (a place, and a port, per worker) or ``[n]`` (one
            place holding them all).
    """

    name: str
    runner: str
    worker_env: Callable[[dict, list, int, int, list], dict]
    local_layout: Callable[[int], list]


def without_foreign_place(env: dict) -> dict:
    """``env`` less the variables by which another launcher places a worker."""
    return {k: v for k, v in env.items() if k not in _FOREIGN_PLACE}


def with_gpus(env: dict, gpus: list[str]) -> dict:
    """``env`` with ``gpus`` the only GPUs its worker sees, from the start
    (a framework may be imported while the payload is unpickled), and kept
    by the worker's device plan."""
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(gpus), WORKER_GPUS_VAR: ",".join(gpus)}


def first_rank(layout: list[int], place: int) -> int:
    return sum(layout[:place])


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _port_free(port: int) -> bool:
    # TensorFlow's server binds every interface, so that is what is checked.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, exclude: set[int] = frozenset()) -> list[int]:
    """``count`` distinct free ports of this host, below its ephemeral range
    (see the module's notes), not in ``exclude``."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    chosen: list[int] = []
    if low - _PORT_FLOOR >= 1000:
        candidates = range(_PORT_FLOOR, low)
        for _ in range(200 * count):
            port = rng.choice(candidates)
            if port not in chosen and port not in exclude and _port_free(port):
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    # A host whose ephemeral range starts low: the kernel's own choice.
    while len(chosen) < count:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in chosen and port not in exclude:
            chosen.append(port)
    return chosen


def runner_label(options: WorkerOptions, engine: Engine, num_proc: int) -> str:
    """The runner as its user wrote it, for messages."""
    return options.runner or f"{engine.runner}(np={num_proc})"
