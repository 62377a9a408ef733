"""Worker processes forked from a server that has imported what they import.

A worker started as a new interpreter spends seconds of CPU importing
TensorFlow and Horovod (or PyTorch) before it runs a line of the job, and a
job's retries and the launcher's later jobs pay it again for every worker.
A fork server (``dist_dl.launch.fork._server``) imports those frameworks
once and forks each worker from itself; the worker then runs the same
command a new interpreter would, with its own session, pipes, environment,
working directory and process title (see that module).

One server per launching process, for one *import key*: the interpreter,
the working directory, the modules it imports, and the environment less the
variables a launch sets per job or rank (Horovod's, its job's secret key
included, ``TF_CONFIG``, torchrun's, dist_dl's per-worker ones): what an
import may read. A launch with another key ends the server and starts its
own (or, while the server's workers of another job run, starts new
interpreters). In a Spark task's Python worker, the server is the
executor's, per import key: shared by the executor's Python workers (a job's
concurrent tasks, and the workers PySpark starts after it ends idle ones),
found at an abstract Unix socket named after the executor's PySpark daemon
and the key, serving only its own user's processes, and ending when that
daemon does (``dist_dl.launch.fork._server``). The server imports the engine's framework (tf.distribute's
TensorFlow, PyTorch's) and the frameworks the launching process has
imported itself (or, in a Spark task, those the job's driver had imported:
``dist_dl.launch.horovod.sparkfork``), with Horovod's binding of each for Horovod
jobs: workers get nothing that neither their engine nor their driver uses.

Workers are forked only where no GPU is visible to the launching process or
named for its workers (CUDA's state must not cross a fork), and not where
``DIST_DL_FORK_WORKERS=0``; everywhere else, and whenever the server cannot
serve, they start as new interpreters.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import os
import pickle
import socket
import subprocess
import sys
import threading

from dist_dl.core import placement
from dist_dl.launch.core import device, network
from dist_dl.launch.core.worker import TASK_CONTEXT_VAR

__all__ = ["ForkedProcess", "start", "shutdown", "imported_frameworks", "driver_switch",
           "SWITCH"]

SWITCH = "DIST_DL_FORK_WORKERS"
# A server with no request and no worker for this long exits (its imports
# hold memory); the next launch starts another.
IDLE_SECONDS = 300.0
# How long the first launch waits for the server's imports.
READY_SECONDS = 180.0
# Servers a launching process keeps (one per import key): each holds its
# imports' memory (a few hundred MB with TensorFlow) until it idles out.
MAX_SERVERS = 3
# The GPUs the launchers give a worker.
_GPU_VARS = (placement.TASK_GPUS_VAR, device.WORKER_GPUS_VAR)
# Set per job or rank by the launchers; not part of what an import reads.
_PER_LAUNCH = ("TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
               "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE",
               "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", TASK_CONTEXT_VAR,
               placement.HOST_SHARE_VAR, *_GPU_VARS,
               # The collectives' interfaces, named per job, read when a
               # collective starts, not at import.
               *network.IFNAME_VARS,
               # Workers are forked only where no GPU is visible to them
               # (_gpus_visible): CUDA is not initialised by an import, and each
               # worker gets its own value in its environment.
               "CUDA_VISIBLE_DEVICES",
               # pytest's name of the running test
               "PYTEST_CURRENT_TEST")
# What importing a framework writes into os.environ, whatever was there
# (tensorflow/__init__.py and tensorflow/python/tpu/__init__.py assign these):
# the server's own import writes the same, so they are no part of what its
# imports read, and a launch made before the launching process imported the
# framework shares the server of one made after.
_SET_BY_IMPORT = {"tensorflow": ("TF2_BEHAVIOR", "TPU_ML_PLATFORM")}
# In the order a server imports them: torch before TensorFlow. TensorFlow's
# libtensorflow_framework exports its own copy of libstdc++'s
# std::random_device, which torch's binds to when TensorFlow is loaded
# first; torch's TCPStore then fails ("random_device could not be read") or
# crashes (SIGSEGV) in init_process_group (pytorch/pytorch#101152,
# tensorflow/tensorflow#61741; seen with torch 2.6 and TensorFlow 2.17).
_FRAMEWORKS = {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"}
# The framework an engine's workers always import.
_ENGINE_FRAMEWORK = {"tensorflow": "tensorflow", "torch": "torch"}


class ForkedProcess:
    """A worker forked by the server: what ``WorkerProcesses`` uses of
    ``subprocess.Popen`` (``pid``, ``stdout``, ``stderr``, ``returncode``,
    ``poll``, ``wait``)."""

    def __init__(self, server: "_Server", pid: int, stdout, stderr):
        self._server = server
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout)
            self.returncode = code
        return self.returncode


class _Server:
    """A client's connection to a fork server. ``owner`` None: a server of
    this process's own (a socket pair; it ends with this process). Else the
    server shared by the Python workers of one executor, found at
    ``address`` or started there, which ends with ``owner`` (the executor's
    PySpark daemon)."""

    def __init__(self, env: dict, preload: list[str], owner: int | None = None,
                 address: str | None = None):
        self._proc = None
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[tuple] = []
        self._pids: set[int] = set()
        self._closed = False
        if owner is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._proc = self._spawn(env, preload, theirs, [])
            finally:
                theirs.close()
            self._sock = ours
            ready = self._ready()
        else:
            ready = self._join(env, preload, owner, address)
        self.pid = ready[1]
        threading.Thread(target=self._read, daemon=True, name="dist_dl-fork-server").start()

    @staticmethod
    def _spawn(env: dict, preload: list[str], end: socket.socket, owner: list[str]):
        room = " " * 1024  # for the workers' process titles
        return subprocess.Popen(
            [sys.executable, "-m", "dist_dl.launch.fork._server", str(end.fileno()),
             ",".join(preload), str(IDLE_SECONDS), room, *owner],
            env={**env, "PYTHONUNBUFFERED": "1"}, pass_fds=[end.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def _join(self, env: dict, preload: list[str], owner: int, address: str) -> tuple:
        """Connect to the server at ``address``, starting it there if none
        listens; its "ready". Tried three times: another Python worker of the
        executor may bind the name first, a server may idle out as one connects."""
        for _ in range(3):
            sock = _dial(address)
            if sock is None and self._start_at(address, env, preload, owner):
                sock = _dial(address)  # queued until the server's imports are done
            if sock is None:
                continue
            self._sock = sock
            try:
                return self._ready()
            except OSError:
                continue
        raise OSError("no fork server for this executor")

    def _start_at(self, address: str, env: dict, preload: list[str], owner: int) -> bool:
        """Start a server listening at ``address``; False if another Python
        worker of the executor bound it first."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(address)
            listener.listen(64)
            # Not kept: the server outlives this Python worker, and its exit
            # is reaped by whoever inherits it.
            self._spawn(env, preload, listener, [str(owner)])
            return True
        except OSError:
            return False
        finally:
            listener.close()

    def _ready(self) -> tuple:
        self._sock.settimeout(READY_SECONDS)
        try:
            ready = pickle.loads(self._sock.recv(_MAX_REPLY))
        except (OSError, EOFError, pickle.UnpicklingError):
            self.close()
            raise OSError("the fork server did not start") from None
        if not ready or ready[0] != "ready" or "setproctitle" in ready[2]:
            # Without setproctitle its workers would show the server's
            # command line, where tools look for a worker's.
            self.close()
            raise OSError(f"the fork server answered {ready!r}")
        self._sock.settimeout(None)
        return ready

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_REPLY)
            except OSError:
                data = b""
            try:
                message = pickle.loads(data) if data else None
            except (pickle.UnpicklingError, EOFError, ValueError):
                message = None
            with self._changed:
                if message is None:
                    self._closed = True
                    self._changed.notify_all()
                    return
                if message[0] == "exit":
                    self._exits[message[1]] = message[2]
                else:
                    self._replies.append(message)
                self._changed.notify_all()

    def fork(self, module: str, args: list[str], env: dict) -> ForkedProcess:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._lock:
                request = {"module": module, "args": list(args), "env": dict(env),
                           "cwd": os.getcwd()}
                socket.send_fds(self._sock, [pickle.dumps(request)], [out_w, err_w])
                with self._changed:
                    if not self._changed.wait_for(lambda: self._replies or self._closed, 60):
                        raise OSError("the fork server did not answer")
                    if not self._replies:
                        raise OSError("the fork server is gone")
                    reply = self._replies.pop(0)
                    if reply[0] == "started":
                        self._pids.add(reply[1])
            if reply[0] != "started":
                raise OSError(f"the fork server could not fork: {reply[1]}")
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return ForkedProcess(self, reply[1], os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._closed, timeout)
            if pid in self._exits:
                return self._exits[pid]
            if self._closed:
                # The server went away first: it ended its workers before it
                # exited (SIGTERM, then SIGKILL).
                return -9
            return None

    def running(self) -> bool:
        """Whether a worker of this server is still running."""
        with self._changed:
            return not self._closed and bool(self._pids - self._exits.keys())

    @property
    def alive(self) -> bool:
        return not self._closed and (self._proc is None or self._proc.poll() is None)

    def close(self) -> None:
        """Leave the server, which ends this client's workers; a server of
        this process's own exits, and is waited for."""
        try:
            # shutdown, not only close: the reader thread blocked in recv
            # keeps a closed socket open, and the server would see no end.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        finally:
            if self._proc is not None:
                try:
                    self._proc.wait(15)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()


def _dial(address: str) -> socket.socket | None:
    """A connection to the server listening at ``address``, or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        return None
    return sock


_MAX_REPLY = 1 << 16
_lock = threading.Lock()
# Import key -> server, least recently used first.
_servers: dict[tuple, _Server] = {}
_failed: set[tuple] = set()


def _import_env(env: dict) -> dict:
    """``env`` less what a launch sets per job or rank, and this switch."""
    return {k: v for k, v in env.items()
            if not k.startswith(("HOROVOD_", "_HOROVOD_")) and k not in _PER_LAUNCH
            and k != SWITCH}


def _key(env: dict, preload: list[str]) -> tuple:
    written = {name for framework in preload for name in _SET_BY_IMPORT.get(framework, ())}
    read = {k: v for k, v in _import_env(env).items() if k not in written}
    return sys.executable, os.getcwd(), tuple(preload), tuple(sorted(read.items()))


def driver_switch() -> dict[str, str]:
    """This process's setting of `SWITCH`, if any, for the environment
    of workers it starts elsewhere (Spark tasks): ``DIST_DL_FORK_WORKERS=0``
    on the driver reaches its jobs' workers on the executors too."""
    return {SWITCH: os.environ[SWITCH]} if SWITCH in os.environ else {}


def imported_frameworks() -> list[str]:
    """The frameworks (TensorFlow, PyTorch) this process has imported."""
    return [name for name in _FRAMEWORKS if name in sys.modules]


def preload_for(engine: str, imported: list[str] | None = None) -> list[str]:
    """The engine's own framework (tf.distribute's TensorFlow, PyTorch's)
    and the frameworks the launching side has imported (``imported``;
    default: this process's), with Horovod's binding of each for Horovod
    jobs; those that import here."""
    import importlib.util

    imported = imported_frameworks() if imported is None else imported

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    names = []
    for framework, binding in _FRAMEWORKS.items():
        if (framework == _ENGINE_FRAMEWORK.get(engine) or framework in imported) \
                and found(framework):
            names.append(framework)
            if engine == "horovod" and found("horovod"):
                names.append(binding)
    return names


def start(module: str, args: list[str], env: dict, engine: str,
          imported: list[str] | None = None) -> ForkedProcess | None:
    """Fork a worker that runs ``python -m module *args`` with ``env``;
    None where workers are not forked here (the caller starts a new
    interpreter). ``imported``: the frameworks the job's driver imported,
    where it is not this process (see `preload_for()`)."""
    if os.environ.get(SWITCH, "1") == "0" or env.get(SWITCH, "1") == "0":
        return None
    if any(env.get(name) for name in _GPU_VARS) or _gpus_visible(env):
        return None
    preload = preload_for(engine, imported)
    key = _key(env, preload)
    owner = _executor_daemon()
    with _lock:
        if key in _failed:
            return None
        for gone in [k for k, server in _servers.items() if not server.alive]:
            _servers.pop(gone).close()
        for _ in range(2):
            server = _servers.pop(key, None)
            if server is None:
                if not _make_room():
                    return None  # every server's workers of other jobs run
                try:
                    server = _Server(_import_env(env), preload, owner,
                                     None if owner is None else _address(owner, key))
                except OSError:
                    _failed.add(key)
                    return None
            _servers[key] = server  # now the most recently used
            try:
                return server.fork(module, args, env)
            except OSError:
                # An idle server that exited as the request went out: once more
                # with a new one, then a new interpreter.
                _servers.pop(key).close()
        return None


def _executor_daemon() -> int | None:
    """The PySpark daemon this process was forked from, where it is a Spark
    task's Python worker (the executor's servers are shared); else None."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return None
    daemon = os.getppid()
    try:
        with open(f"/proc/{daemon}/cmdline", "rb") as f:
            command = f.read().split(b"\0")
    except OSError:
        return None
    return daemon if b"pyspark.daemon" in command else None


def _address(owner: int, key: tuple) -> str:
    """The abstract socket name of ``owner``'s server for ``key``, for this
    user: ``owner``'s start time in it, so a recycled pid names another."""
    try:
        with open(f"/proc/{owner}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = ""
    digest = hashlib.sha256(repr((os.getuid(), owner, started, key)).encode()).hexdigest()
    return f"\0dist_dl-fork-{digest[:40]}"


def _make_room() -> bool:
    """Below `MAX_SERVERS` servers, ending the least recently used idle
    one if need be; False where every server has workers running."""
    if len(_servers) < MAX_SERVERS:
        return True
    for key, server in _servers.items():
        if not server.running():
            _servers.pop(key).close()
            return True
    return False


def shutdown() -> None:
    """End this process's fork servers, if any (at exit, too)."""
    with _lock:
        while _servers:
            _servers.popitem()[1].close()


def _gpus_visible(env: dict) -> bool:
    """GPUs a worker with ``env`` may use: its ``CUDA_VISIBLE_DEVICES``, else
    ``nvidia-smi``'s list (asked once)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return bool(device.visible_gpus(env))
    return _machine_gpus()


@functools.lru_cache(maxsize=None)
def _machine_gpus() -> bool:
    return bool(device.visible_gpus({}))


atexit.register(shutdown)
