"""Process entry of a Horovod worker in a Spark task, in place of Horovod's
``python -m horovod.spark.task.gloo_exec_fn DRIVER_ADDRESSES SETTINGS``
(see ``dist_dl.launch.horovod.spark._workers_exit_without_final_collection``): the
same ``main``, ended by `dist_dl.launch.core._worker_main._exit()`, after
taking the task's ``sys.path`` (``dist_dl.launch.horovod.spark._wrap_horovod_tasks``).
"""
import sys
import traceback

from horovod.runner.common.util import codec
from horovod.spark.task import gloo_exec_fn

from dist_dl.launch.core._worker_main import _exit
from dist_dl.launch.core.worker import take_launcher_imports


def _run(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: python -m dist_dl.launch.horovod._spark_worker_main <driver addresses> "
              f"<settings>, got {len(argv)} arguments", file=sys.stderr)
        return 1
    take_launcher_imports()
    try:
        gloo_exec_fn.main(codec.loads_base64(argv[0]), codec.loads_base64(argv[1]))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # as the interpreter would: the traceback, exit code 1
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    _exit(_run(sys.argv[1:]))
