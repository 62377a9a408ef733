"""The training loop inside every tf.distribute worker of ``train_distributed``
(``engine="tensorflow"``): the counterpart of `dist_dl.train.engines.horovod`
for runtimes without Horovod (Databricks Runtime 16.0 ML and later).

Shipped by `TFDistributeRunner`, which has set this
worker's ``TF_CONFIG``, threads and visible GPU. One call of
`train()` is one attempt, with the same plan, reader, schedule,
checkpoints and MLflow logging as the Horovod worker; what differs is how
the workers agree:

- ``MultiWorkerMirroredStrategy`` (RING on CPU, NCCL on GPUs), created first,
  before any other TensorFlow op; model, optimizer and resume under its
  scope. Variables are created identical on every worker (the strategy
  broadcasts their initial values), Keras sums the gradients of all workers
  in ``fit`` and aggregates its metrics across them (no metric-averaging
  callback);
- each worker reads its own row groups (rank = task index) through
  ``distribute_datasets_from_function``: no auto-sharding, no re-batching,
  ``batch_size`` per worker as with Horovod;
- every worker resumes from the shared checkpoint folder itself, and the
  workers check that they all resumed after the same epoch;
- every worker takes part in each checkpoint and in reading the final
  weights (a read of a variable synchronised on read is an all-reduce), while
  rank 0 alone writes, logs and registers.
"""
from __future__ import annotations

from dist_dl.core import compat
from dist_dl.train.config import TrainConfig
from dist_dl.train.engines.core import WorkerSpec
from dist_dl.train.engines.keras_common import (build_model, fit_and_log, keras_runner,
                                                start_tf_distribute,
                                                tf_distribute_data_and_callbacks)

__all__ = ["train", "runner"]


def runner(cfg: TrainConfig, backend: str, spark):
    """`TFDistributeRunner` for ``cfg``'s workers (Keras 2 as tf.keras)."""
    from dist_dl.core.quiet import quiet_env
    from dist_dl.launch import TFDistributeRunner

    return keras_runner(TFDistributeRunner, cfg, backend, spark, quiet_env())


def train(spec: WorkerSpec) -> dict | None:
    """One attempt of data-parallel training on this tf.distribute worker.

    Returns, on rank 0: the logged model's URI and registered version, the
    epoch the attempt started at and the number of epochs; None elsewhere.
    """
    import tensorflow as tf
    keras = compat.keras()

    from dist_dl.train.checkpoint_loop import resume

    cfg = spec.config
    strategy, rank, size, mixed, reader, schedule, manager = start_tf_distribute(tf, spec)
    with strategy.scope():
        model = build_model(spec, mixed)
        optimizer = keras.optimizers.SGD(schedule, momentum=cfg.momentum)
        if mixed:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"])
        # Every worker reads the shared folder itself (the optimizer's slots
        # are created here, under the scope, on all workers at once).
        initial_epoch = resume(manager, model, broadcast=False)
    train_data, callbacks = tf_distribute_data_and_callbacks(
        tf, spec, strategy, reader, schedule, manager, rank, size, initial_epoch, mixed,
        "tf.distribute")
    # The final weights are read on every worker: see the module's notes.
    return fit_and_log(spec, model, train_data, callbacks, rank, initial_epoch, mixed=mixed,
                        weights_everywhere=True)
