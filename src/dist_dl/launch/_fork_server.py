"""Process entry of a fork server: ``python -m dist_dl.launch._fork_server FD PRELOAD IDLE ROOM``.

Imports the modules named in PRELOAD (comma-separated) once, then forks one
worker per request that arrives on the socket FD (see
``dist_dl.launch.forkserver`` for the requests and the replies). Each worker
runs ``python -m MODULE ARGS...`` as a new interpreter would: in a session of
its own, with /dev/null as stdin and the two pipe ends it was sent as stdout
and stderr, exactly the environment, working directory and arguments of its
request, and a process title that names that command (``ps`` and
``/proc/PID/cmdline`` show the worker's command, not the server's; ROOM is
blank room in this server's argv for that title).

The server ends its workers' process groups and exits when the socket
reaches its end (the launching process closed it or died), or after IDLE
seconds with no request and no worker running.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys
import time

# A request's pickled size limit: an environment and a few arguments.
MAX_MESSAGE = 1 << 20
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


def _run_worker(sock: socket.socket, request: dict, out: int, err: int) -> None:
    """In the forked child: become the requested worker; never returns."""
    code = 1
    try:
        sock.close()
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
        from dist_dl.launch._worker_main import _exit

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


def serve(fd: int, preload: list[str], idle: float) -> None:
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
    from dist_dl.launch.worker import take_launcher_imports

    take_launcher_imports()
    failed = _preload(preload + ["cloudpickle", "setproctitle", "runpy"])
    _send(sock, "ready", os.getpid(), failed)
    children: set[int] = set()
    last = time.monotonic()
    try:
        while True:
            readable, _, _ = select.select([sock], [], [], 0.05)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                children.discard(pid)
                last = time.monotonic()
                _send(sock, "exit", pid, os.waitstatus_to_exitcode(status))
            if readable:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
                if not data:
                    return
                last = time.monotonic()
                try:
                    request = pickle.loads(data)
                    for stream in (sys.stdout, sys.stderr):
                        stream.flush()
                    pid = os.fork()
                except BaseException as exc:  # noqa: BLE001 - answered, the launcher falls back
                    _send(sock, "error", f"{type(exc).__name__}: {exc}")
                else:
                    if pid == 0:
                        _run_worker(sock, request, *fds)
                    children.add(pid)
                    _send(sock, "started", pid)
                finally:
                    for received in fds:
                        os.close(received)
            elif not children and time.monotonic() - last > idle:
                return
    except OSError:
        return  # the launcher is gone
    finally:
        _end_all(children)


if __name__ == "__main__":
    serve(int(sys.argv[1]), [m for m in sys.argv[2].split(",") if m], float(sys.argv[3]))
