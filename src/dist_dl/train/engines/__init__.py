"""The training engines: one module each, what runs inside every worker of
``train_distributed`` for one framework and way of agreeing.

=============  ===========================  =====================================
engine         module                       workers
=============  ===========================  =====================================
``horovod``    `.horovod`              Horovod, Keras 2 ``fit``
``tensorflow`` `.tf_distribute`        tf.distribute, Keras 2 ``fit``
``keras3``     `.keras3`               tf.distribute, Keras 3, own loop
``torch``      `.torch_ddp`            DistributedDataParallel
=============  ===========================  =====================================

Each module has ``train(spec)``, one attempt on one worker (the
`WorkerSpec` built on the driver), and
``runner(cfg, backend, spark)``, the launcher that starts its workers. What
they share: `.core` (every engine: the spec, rank 0's MLflow context,
messages and progress lines to the driver) and `.keras_common` (the
TensorFlow engines: devices, the model, each rank's data, the schedule,
validation, callbacks, ``fit`` and the final model's logging). The driver's
side (the plan, the run, retries, checkpoints' resume) is the same for all
(`dist_dl.train.driver`, `dist_dl.train.attempts`). A new engine is
a module with those two functions and its line in ``ENGINES``.

No engine module imports a framework at import time (the launcher sets a
worker's threads and devices before one loads), and none imports another.
"""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["ENGINES", "engine_name", "engine_module"]

ENGINES = {
    "horovod": "dist_dl.train.engines.horovod",
    "tensorflow": "dist_dl.train.engines.tf_distribute",
    "keras3": "dist_dl.train.engines.keras3",
    "torch": "dist_dl.train.engines.torch_ddp",
}


def engine_name(cfg) -> str:
    """The engine of a checked ``TrainConfig``: its ``engine``, except that
    Keras 3 (``keras=3``) trains in the tf.distribute loop of its own."""
    return "keras3" if cfg.engine != "torch" and cfg.keras == 3 else cfg.engine


def engine_module(cfg) -> ModuleType:
    """The module of ``cfg``'s engine (imports no framework)."""
    return importlib.import_module(ENGINES[engine_name(cfg)])
