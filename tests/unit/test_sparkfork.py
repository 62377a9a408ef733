"""Which commands of Horovod's Spark task service the library forks
(dist_dl.launch.horovod.sparkfork.worker_command): its own worker's, for this
interpreter, with the environment ``env`` would give it."""
from __future__ import annotations

import shlex
import sys

import pytest

from dist_dl.launch.horovod.sparkfork import ENTRY, worker_command

pytestmark = pytest.mark.timeout(30)


def _command(python: str = sys.executable, module: str = ENTRY, args=("QUREUg==", "U0VU")) -> str:
    # As Horovod's gloo_run writes it: env, the rank's variables, the job's
    # exported variables quoted, then the interpreter and its arguments.
    return " ".join(["env", "HOROVOD_RANK=1", "HOROVOD_SIZE=2",
                     f"TF_USE_LEGACY_KERAS={shlex.quote('1')}",
                     f"NOTE={shlex.quote('two words; $HOME')}", "HOROVOD_RANK=0",
                     python, "-m", module, *args])


def test_the_library_worker_command_gives_its_arguments_and_environment():
    args, env = worker_command(_command(), {"PATH": "/bin", "HOROVOD_SIZE": "9"})
    assert args == ["QUREUg==", "U0VU"]
    # The task's environment, then the command's assignments in order.
    assert env == {"PATH": "/bin", "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2",
                   "TF_USE_LEGACY_KERAS": "1", "NOTE": "two words; $HOME"}


def test_other_commands_and_other_interpreters_are_left_to_horovod():
    assert worker_command(_command(python="/opt/other/bin/python"), {}) is None
    assert worker_command(_command(module="horovod.spark.task.gloo_exec_fn"), {}) is None
    assert worker_command(_command(args=("one",)), {}) is None
    assert worker_command(_command().replace("env ", "nice ", 1), {}) is None
    assert worker_command("env A='unclosed " + sys.executable, {}) is None
    assert worker_command("", {}) is None
