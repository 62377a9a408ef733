"""How Horovod's Spark tasks end their worker processes, made prompt.

On a Spark executor, each Horovod worker runs as ``sh -c "env ... python -m
horovod.spark.task.gloo_exec_fn ..."`` under a "middleman" process
(``horovod.runner.common.util.safe_shell_exec``), which ends the shell and the
worker when the job is aborted or the Spark task is killed. Horovod 0.28.1's
``terminate_executor_shell_and_children`` sends SIGTERM to the shell's
children, waits up to 5 s, then *stops the shell with SIGSTOP*, kills the
children, and sends SIGTERM to the stopped shell and waits another 5 s for it:
a stopped process cannot act on SIGTERM, so that wait always runs out before
the SIGKILL. A worker that is itself stopped (SIGSTOP, a debugger, a frozen
cgroup) waits out the first 5 s too, so its processes outlive the driver's
timeout error by about 10 s (tests/test_reliability.py, a worker stopped
with SIGSTOP, on the cluster of separate hosts).

Here the tree is ended by `dist_dl.launch.core.termination.terminate_tree()`:
SIGTERM and SIGCONT to every process under the shell, the same grace for them
to exit, then SIGKILL to what is left and to the shell. Horovod is
unmaintained (0.28.1 is its last release), so the middleman is wrapped
rather than fixed upstream.

The wrapping happens where the middleman starts: in the Python worker of each
Spark task, before Horovod's task function runs (the task prologue that
``dist_dl.launch.horovod.spark._wrap_horovod_tasks`` puts around Horovod's Spark
mapper on the driver calls `prompt_termination()`). ``safe_shell_exec.execute``
starts the middleman with multiprocessing's ``spawn``, which pickles its target
by name: the target set here is `_middleman()` of this module, which the
new interpreter imports, and which patches its own fresh copy of Horovod's
module before running Horovod's middleman.
"""
from __future__ import annotations

from dist_dl.launch.core.termination import terminate_tree

__all__ = ["prompt_termination"]


def _middleman(*args, **kwargs):
    """Horovod's middleman with `terminate_tree()` in place of its own.
    Runs in the process ``spawn`` made, whose copy of Horovod's module is
    fresh (its ``_exec_middleman`` is Horovod's own); in a process where
    `prompt_termination()` ran, the original is kept on this function."""
    from horovod.runner.common.util import safe_shell_exec

    original = safe_shell_exec._exec_middleman
    if original is _middleman:
        original = _middleman.__wrapped__
    safe_shell_exec.terminate_executor_shell_and_children = terminate_tree
    return original(*args, **kwargs)


def prompt_termination() -> None:
    """In this process (a Spark task's Python worker): the middlemen that
    ``safe_shell_exec.execute`` starts from now on run `_middleman()`."""
    from horovod.runner.common.util import safe_shell_exec

    if safe_shell_exec._exec_middleman is not _middleman:
        _middleman.__wrapped__ = safe_shell_exec._exec_middleman
        safe_shell_exec._exec_middleman = _middleman
