"""Process entry of a fork server: ``python -m dist_dl.launch.fork._server FD PRELOAD IDLE ROOM [OWNER]``.

Imports the modules named in PRELOAD (comma-separated) once, then forks one
worker per request that arrives from a client (see
``dist_dl.launch.fork.client`` for the requests and the replies). Each worker
runs ``python -m MODULE ARGS...`` as a new interpreter would: in a session of
its own, with /dev/null as stdin and the two pipe ends it was sent as stdout
and stderr, exactly the environment, working directory and arguments of its
request, and a process title that names that command (``ps`` and
``/proc/PID/cmdline`` show the worker's command, not the server's; ROOM is
blank room in this server's argv for that title).

Without OWNER, FD is the one client's end of a socket pair: the server ends
its workers' process groups and exits when that socket reaches its end (the
launching process closed it or died), or after IDLE seconds with no request
and no worker running.

With OWNER (a process id: the PySpark daemon of an executor), FD is a
listening socket that the Python workers of that executor connect to, each
a client of its own; only a client of this server's user is served. A
client that goes away takes its own workers with it (SIGTERM to their
process groups, SIGKILL 5 s later); the server goes on for the others. It
exits, ending every worker, when OWNER exits, and after IDLE seconds with no
client and no worker.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import sys
import time

# A request's pickled size limit: an environment and a few arguments.
MAX_MESSAGE = 1 << 20
# How long a gone client's workers get between SIGTERM and SIGKILL.
GRACE = 5.0
_inherited_sigchld = signal.SIG_DFL


def _preload(names: list[str]) -> dict[str, str]:
    """Import each module; returns {name: error} for those that failed (a
    worker that needs one imports it itself, and fails with its own error)."""
    import importlib

    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - any failure leaves the import to the worker
            failed[name] = f"{type(exc).__name__}: {exc}"
    return failed


def _send(sock: socket.socket, *message) -> None:
    sock.send(pickle.dumps(message))


def _run_worker(inherited: list, request: dict, out: int, err: int) -> None:
    """In the forked child: become the requested worker; never returns.
    ``inherited``: the server's sockets and other files, closed here."""
    code = 1
    try:
        for thing in inherited:
            if isinstance(thing, int):
                os.close(thing)
            else:
                thing.close()
        os.setsid()
        signal.signal(signal.SIGCHLD, _inherited_sigchld)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (devnull, out, err):
            if fd > 2:
                os.close(fd)
        module, args = request["module"], request["args"]
        from setproctitle import setproctitle

        setproctitle(" ".join([sys.executable, "-m", module, *args]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy" in sys.modules:
            # A new interpreter seeds numpy's global generator from the OS;
            # a forked one would share the server's state with every sibling.
            sys.modules["numpy"].random.seed()
        import runpy

        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the worker's stderr, as Python would
        import traceback

        traceback.print_exc()
    finally:
        # As a new interpreter would leave: exit handlers, flushed streams.
        from dist_dl.launch.core._worker_main import _exit

        _exit(code)


def _end_all(children: set[int]) -> None:
    """End every live worker's process group: SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in children:
            try:
                os.killpg(pid, sig)
                if sig == signal.SIGTERM:
                    os.killpg(pid, signal.SIGCONT)
            except OSError:
                pass
        end = time.monotonic() + wait
        while children and time.monotonic() < end:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid:
                children.discard(pid)
            else:
                time.sleep(0.05)
        if not children:
            return


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _watch(owner: int):
    """A file that becomes readable when process ``owner`` exits (a pidfd),
    or None where the kernel has none (then `_gone()` is asked)."""
    try:
        return os.pidfd_open(owner)
    except (AttributeError, OSError):
        return None


def _gone(owner: int) -> bool:
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _tell(client: socket.socket, *message) -> None:
    """Send to a client that may be gone (its end is read in the main loop)."""
    try:
        _send(client, *message)
    except OSError:
        pass


def serve(fd: int, preload: list[str], idle: float, owner: int | None = None) -> None:
    global _inherited_sigchld
    sock = socket.socket(fileno=fd)
    # The server reaps its workers itself; a launcher that ignores SIGCHLD
    # (its children reaped for it) would leave none to wait for. Workers get
    # the disposition back: a new interpreter would have inherited it.
    _inherited_sigchld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # What the workers' setproctitle reads once: title within the argv area,
    # leaving /proc/PID/environ as the server's.
    os.environ["SPT_NOENV"] = "1"
    # The launcher's sys.path, as its workers take it, before anything imports.
    from dist_dl.launch.core.worker import take_launcher_imports

    take_launcher_imports()
    failed = _preload(preload + ["cloudpickle", "setproctitle", "runpy"])
    shared = owner is not None
    listener = sock if shared else None
    watch = _watch(owner) if shared else None
    # The server's files besides its clients: waited on, and closed in a worker.
    own = [f for f in (listener, watch) if f is not None]
    clients: dict[socket.socket, set[int]] = {}  # client -> its running workers
    if not shared:
        clients[sock] = set()
        _send(sock, "ready", os.getpid(), failed)
    client_of: dict[int, socket.socket] = {}  # worker pid -> its client
    # Worker pid -> the job folder its launcher made (its payload's): the
    # launcher of a gone client can no longer remove it.
    folder_of: dict[int, str] = {}
    # Client -> the job folders of the workers it started: a client killed
    # after its workers ended (a cancelled Spark task's Python worker gets
    # SIGKILL while it winds up) leaves them too.
    folders: dict[socket.socket, set[str]] = {}
    # The one launcher gone, the server goes; one of many, the others stay.
    reply = _tell if shared else _send
    doomed: dict[int, float] = {}  # a gone client's worker -> when it gets SIGKILL
    last = time.monotonic()
    gone = False
    try:
        while True:
            readable, _, _ = select.select([*clients, *own], [], [], 0.05)
            now = time.monotonic()
            while client_of or doomed:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                last = now
                if doomed.pop(pid, None) is not None:
                    _remove_job_folder(folder_of.get(pid))
                folder_of.pop(pid, None)
                client = client_of.pop(pid, None)
                if client in clients:
                    clients[client].discard(pid)
                    reply(client, "exit", pid, os.waitstatus_to_exitcode(status))
            for pid, when in list(doomed.items()):
                if now >= when:
                    _signal_group(pid, signal.SIGKILL)
                    doomed[pid] = float("inf")
            if shared and (watch in readable if watch is not None else _gone(owner)):
                return  # the executor is gone
            if listener in readable:
                try:
                    conn, _ = listener.accept()
                    mine = _peer_uid(conn) == os.getuid()
                except OSError:
                    conn, mine = None, False
                if conn is not None and not mine:
                    conn.close()
                elif conn is not None:
                    clients[conn] = set()
                    _tell(conn, "ready", os.getpid(), failed)
            for client in [c for c in readable if c in clients]:
                try:
                    data, fds, _, _ = socket.recv_fds(client, MAX_MESSAGE, 2)
                except OSError:
                    data, fds = b"", []
                if not data:
                    if not shared:
                        gone = True
                        return  # the launcher is gone
                    # This client's workers go with it; the others run on.
                    running = clients.pop(client)
                    for pid in running:
                        _signal_group(pid, signal.SIGTERM)
                        _signal_group(pid, signal.SIGCONT)
                        doomed[pid] = now + GRACE
                    # Its job folders that no worker uses any more go now;
                    # the others when their last worker is reaped (above).
                    busy = {folder_of.get(pid) for pid in running}
                    for folder in folders.pop(client, set()) - busy:
                        _remove_job_folder(folder)
                    client.close()
                    last = now
                    continue
                last = now
                try:
                    request = pickle.loads(data)
                    for stream in (sys.stdout, sys.stderr):
                        stream.flush()
                    pid = os.fork()
                except BaseException as exc:  # noqa: BLE001 - answered, the launcher falls back
                    reply(client, "error", f"{type(exc).__name__}: {exc}")
                else:
                    if pid == 0:
                        _run_worker([*clients, *own], request, *fds)
                    clients[client].add(pid)
                    client_of[pid] = client
                    folder = folder_of[pid] = _job_folder(request)
                    if folder is not None:
                        # A reused client's earlier jobs' folders, removed
                        # by their launchers, are forgotten.
                        mine = {f for f in folders.get(client, ()) if os.path.isdir(f)}
                        folders[client] = mine | {folder}
                    reply(client, "started", pid)
                finally:
                    for received in fds:
                        os.close(received)
            if not client_of and not doomed and now - last > idle and not (shared and clients):
                return
    except OSError:
        gone = not shared
        return  # the launcher is gone
    finally:
        _end_all(set(client_of) | set(doomed))
        if gone:
            # The launcher died with workers running: nobody else removes
            # their jobs' folders. (It closes the server itself only when
            # none of its workers runs, and then its jobs' folders are its own.)
            for folder in set(folder_of.values()):
                _remove_job_folder(folder)


def _job_folder(request: dict) -> str | None:
    """The folder a launcher made for a worker's job (its payload's), or None."""
    from dist_dl.launch.core.worker import folder_of_payload

    args = request.get("args") or []
    return folder_of_payload(args[0]) if args else None


def _remove_job_folder(folder: str | None) -> None:
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


if __name__ == "__main__":
    serve(int(sys.argv[1]), [m for m in sys.argv[2].split(",") if m], float(sys.argv[3]),
          int(sys.argv[5]) if len(sys.argv) > 5 else None)
