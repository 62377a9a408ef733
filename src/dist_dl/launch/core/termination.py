"""Ending a process tree: what every backend does when a job ends, so that
nothing a worker started outlives it.

`end_process_groups()` ends workers that lead process groups of their
own (the processes of `dist_dl.launch.backends.processes`, the fork
server's workers); `terminate_tree()` ends a process and everything
under it by walking the tree (a shell whose children may have left its
group); `end_children()` ends what this process started (a worker's
data-loader pools and subprocesses). Each sends SIGTERM and SIGCONT, gives
a grace, then SIGKILL, as
service managers do (systemd sends SIGCONT after SIGTERM: a stopped
process, by SIGSTOP, a debugger or a frozen cgroup, acts on SIGTERM only
once continued).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

__all__ = ["end_process_groups", "terminate_tree", "end_children", "child_pids", "GRACE_S"]

GRACE_S = 5.0   # as Horovod's GRACEFUL_TERMINATION_TIME_S


def terminate_tree(pid: int, grace: float = GRACE_S) -> None:
    """End the process ``pid`` (the executor shell) and everything under it:
    SIGTERM and SIGCONT to every descendant, ``grace`` seconds for them to
    exit, then SIGKILL to the survivors and to ``pid`` itself."""
    import psutil

    try:
        shell = psutil.Process(pid)
        tree = shell.children(recursive=True)
    except psutil.Error:
        return
    alive = _stop(tree, grace)
    # Anything the workers started meanwhile, too.
    try:
        alive += [p for p in shell.children(recursive=True) if p not in alive]
    except psutil.Error:
        pass
    _kill(alive + [shell])


def child_pids() -> frozenset:
    """The process ids of every process this one started, still running."""
    import psutil

    try:
        return frozenset(p.pid for p in psutil.Process().children(recursive=True))
    except psutil.Error:
        return frozenset()


def end_children(keep: frozenset = frozenset(), grace: float = 3.0) -> None:
    """End every process this one started that is still running, but those
    in ``keep`` (process ids): SIGTERM and SIGCONT, ``grace`` seconds, then
    SIGKILL."""
    import psutil

    try:
        children = [p for p in psutil.Process().children(recursive=True) if p.pid not in keep]
    except psutil.Error:
        return
    _kill(_stop(children, grace))


def _stop(procs: list, grace: float) -> list:
    """SIGTERM and SIGCONT to each of ``procs`` (``psutil.Process``); those
    still alive after ``grace`` seconds."""
    import psutil

    for proc in procs:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                proc.send_signal(sig)
            except psutil.Error:
                break
    _, alive = psutil.wait_procs(procs, timeout=grace)
    return alive


def _kill(procs: list) -> None:
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass


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
