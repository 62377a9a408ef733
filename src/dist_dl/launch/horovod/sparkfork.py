"""Horovod's workers in a Spark task, forked from the executor's fork server.

Horovod's task service runs each worker's command, ``env VAR=... python -m
dist_dl.launch.horovod._spark_worker_main ADDRESSES SETTINGS``, through
``safe_shell_exec.execute``: a middleman interpreter (multiprocessing's
``spawn``) starts a shell, which starts a new interpreter, which imports
TensorFlow and Horovod before the job's first line. In a Spark task prepared
by `install()` (the task prologue of
``dist_dl.launch.horovod.spark._wrap_horovod_tasks``), that command is forked from
the executor's fork server (`dist_dl.launch.fork.client`) instead,
which has imported the frameworks the driver imported. Every Python worker
of the executor uses the same server (a job's concurrent tasks, and the
Python workers PySpark starts after it ends idle ones): a job's retries and
the later jobs of the application fork from it.

What Horovod's ``execute`` gives is kept: the worker's environment (the task
service's, then the command's own assignments, as ``env`` applies them), its
output prefixed line by line as Horovod does (Horovod's
``prefix_connection``), the abort events ending the worker and what it
started (SIGTERM and SIGCONT to its process group, a grace, then SIGKILL, as
`dist_dl.launch.core.termination.terminate_tree()` ends the shell's tree), and the exit code a
shell reports (128 + N for a worker ended by signal N). Any other command,
another interpreter than this one, or a worker the server does not fork
(GPUs, ``DIST_DL_FORK_WORKERS=0``, a failure) runs through Horovod's own
``execute`` as before.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
import threading

from dist_dl.launch.fork import client as forkserver
from dist_dl.launch.core.termination import end_process_groups

__all__ = ["install", "execute", "worker_command", "ENTRY"]

# The module Horovod's Spark launcher runs in each task
# (dist_dl.launch.horovod.spark._workers_exit_without_final_collection).
ENTRY = "dist_dl.launch.horovod._spark_worker_main"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# The frameworks the driver of this task's job had imported (install).
_frameworks: list[str] = []


def install(frameworks: list[str]) -> None:
    """In this process (a Spark task's Python worker): Horovod's
    ``safe_shell_exec.execute`` forks the library's worker command from now
    on, preloading ``frameworks`` (those the job's driver imported)."""
    from horovod.runner.common.util import safe_shell_exec

    _frameworks[:] = frameworks
    if safe_shell_exec.execute is not execute:
        execute.__wrapped__ = safe_shell_exec.execute
        safe_shell_exec.execute = execute


def worker_command(command: str, env: dict | None) -> tuple[list[str], dict] | None:
    """The arguments and environment of the library's Horovod worker if
    ``command`` starts it with this interpreter, else None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or words[0] != "env":
        return None
    worker_env = dict(os.environ if env is None else env)
    i = 1
    while i < len(words) and _NAME.match(words[i]):
        name, value = words[i].split("=", 1)
        worker_env[name] = value
        i += 1
    rest = words[i:]
    if (len(rest) != 5 or rest[1:3] != ["-m", ENTRY]
            or os.path.abspath(rest[0]) != os.path.abspath(sys.executable)):
        return None
    return rest[3:], worker_env


def execute(command, env=None, stdout=None, stderr=None, index=None, events=None,
            prefix_output_with_timestamp=False):
    """``safe_shell_exec.execute``'s contract (see the module's docstring)."""
    parsed = worker_command(command, env)
    proc = None
    if parsed is not None:
        args, worker_env = parsed
        proc = forkserver.start(ENTRY, args, worker_env, "horovod", imported=_frameworks)
    if proc is None:
        return execute.__wrapped__(command, env=env, stdout=stdout, stderr=stderr, index=index,
                                   events=events,
                                   prefix_output_with_timestamp=prefix_output_with_timestamp)
    from horovod.runner.common.util.safe_shell_exec import prefix_connection
    from horovod.runner.util.threads import in_thread, on_event

    forwards = [in_thread(prefix_connection, (pipe, stream, name, index,
                                              prefix_output_with_timestamp))
                for pipe, stream, name in ((proc.stdout, stdout or sys.stdout, "stdout"),
                                           (proc.stderr, stderr or sys.stderr, "stderr"))]
    stop = threading.Event()
    for event in events or []:
        on_event(event, end_process_groups, args=([proc],), stop=stop, silent=True)
    try:
        code = proc.wait()
    except BaseException:
        end_process_groups([proc])
        raise
    finally:
        stop.set()
    for forward in forwards:
        forward.join()
    return code if code >= 0 else 128 - code
