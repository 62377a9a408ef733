"""The training loop inside every tf.distribute worker of ``train_distributed``
(``engine="tensorflow"``): the counterpart of :mod:`dist_dl.train.worker`
for runtimes without Horovod (Databricks Runtime 16.0 ML and later).

Shipped by :class:`~dist_dl.launch.TFDistributeRunner`, which has set this
worker's ``TF_CONFIG``, threads and visible GPU. One call of
:func:`train_worker_tf` is one attempt, with the same plan, reader, schedule,
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

import os

from dist_dl.core import compat
from dist_dl.core.placement import launcher_place
from dist_dl.train.worker import (WorkerSpec, _build, _fit_and_log, _input_bound_warner,
                                  _learning_rate_callback, _log, _pin_devices_and_precision,
                                  _rank0_callbacks, _schedule, _train_data, _val_data,
                                  _validation_callback)

__all__ = ["train_worker_tf"]


def train_worker_tf(spec: WorkerSpec) -> dict | None:
    """One attempt of data-parallel training on this tf.distribute worker.

    Returns, on rank 0: the logged model's URI and registered version, the
    epoch the attempt started at and the number of epochs; None elsewhere.
    """
    import tensorflow as tf
    keras = compat.keras()

    from dist_dl.train.checkpoint_loop import resume

    cfg = spec.config
    strategy, rank, size, mixed, reader, schedule, manager = _start(tf, spec)
    with strategy.scope():
        model = _build(spec, mixed)
        optimizer = keras.optimizers.SGD(schedule, momentum=cfg.momentum)
        if mixed:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"])
        # Every worker reads the shared folder itself (the optimizer's slots
        # are created here, under the scope, on all workers at once).
        initial_epoch = resume(manager, model, broadcast=False)
    train_data, callbacks = _data_and_callbacks(tf, spec, strategy, reader, schedule, manager,
                                                rank, size, initial_epoch, mixed, "tf.distribute")
    # The final weights are read on every worker: see the module's notes.
    return _fit_and_log(spec, model, train_data, callbacks, rank, initial_epoch, mixed=mixed,
                        weights_everywhere=True)


def _data_and_callbacks(tf, spec: WorkerSpec, strategy, reader, schedule, manager, rank: int,
                        size: int, initial_epoch: int, mixed: bool, engine: str):
    """After resume, on every tf.distribute worker: the check that all
    resumed after the same epoch, the attempt's first line, this worker's
    training data, and the callbacks (the collective ones in the same order
    on every worker, then rank 0's)."""
    from dist_dl.read.dataset import InputWaits
    from dist_dl.train.checkpoint_loop import CheckpointCallback
    from dist_dl.train.timing import step_timer

    cfg = spec.config
    _same_everywhere(tf, strategy, initial_epoch, size, spec.checkpoint_dir)
    _log(rank, f"attempt {spec.attempt}: {size} workers ({engine}), "
               f"{'resuming after epoch ' + str(initial_epoch) if initial_epoch else 'starting'}"
               f" (epochs {cfg.epochs}, {spec.train_steps} steps of {cfg.batch_size} per worker, "
               f"{'mixed' if mixed else 'float32'} precision)")
    # Each worker's own shard, batch_size rows per step: the function is
    # called once on this worker (one input pipeline, one replica).
    waits = InputWaits()
    train_data = strategy.distribute_datasets_from_function(
        lambda _: _train_data(spec, reader, rank, size, initial_epoch, waits))
    callbacks = []
    if spec.val_files:
        val_data = strategy.distribute_datasets_from_function(
            lambda _: _val_data(spec, reader, rank, size))
        # This worker's sums batch by batch (its one replica's), then one
        # all-reduce per pass, as the Horovod worker does.
        callbacks.append(_validation_callback(
            tf, val_data, spec.val_steps,
            step=lambda sums, iterator: strategy.experimental_local_results(
                strategy.run(sums, args=next(iterator)))[0],
            combine=lambda totals: _sum_over_workers(tf, strategy, totals)))
    callbacks += [_learning_rate_callback(tf, schedule),
                  step_timer(cfg.batch_size * size, waits=waits, warn=_input_bound_warner(rank)),
                  CheckpointCallback(manager, metadata={"run_id": spec.run_id},
                                     writer=rank == 0, peers=True)]
    if rank == 0:
        callbacks += _rank0_callbacks(spec, size)
    return train_data, callbacks


def _start(tf, spec: WorkerSpec):
    """This worker's strategy, rank, number of workers, precision, reader
    settings, learning-rate schedule and checkpoint manager: devices and
    precision first (the strategy configures the runtime), then
    MultiWorkerMirroredStrategy from ``TF_CONFIG``, one replica per worker,
    determinism and per-rank seeds."""
    from dist_dl.launch.tfdist import multi_worker_strategy
    from dist_dl.train.checkpoint import CheckpointManager

    cfg = spec.config

    place = launcher_place(os.environ)
    if place is None or "TF_CONFIG" not in os.environ:
        raise RuntimeError("this training loop runs on the workers of TFDistributeRunner, which "
                           "set TF_CONFIG; this process has none")
    mixed = _pin_devices_and_precision(tf, cfg, place.local_rank)
    strategy = multi_worker_strategy()
    size = strategy.cluster_resolver.cluster_spec().num_tasks("worker")
    if strategy.num_replicas_in_sync != size:
        raise RuntimeError(
            f"{strategy.num_replicas_in_sync} replicas for {size} workers: each worker must see "
            "one device (the launcher shows each worker one GPU; a worker that sees several "
            "would take more than its share of each batch)")
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    compat.keras().utils.set_random_seed(cfg.seed + place.rank)
    manager = CheckpointManager(spec.checkpoint_dir, keep=cfg.keep_checkpoints,
                                key=spec.checkpoint_key)
    return (strategy, place.rank, size, mixed, cfg.reader_config(),
            _schedule(cfg, size, spec.train_steps), manager)


def _same_everywhere(tf, strategy, epoch: int, size: int, checkpoint_dir: str) -> None:
    """All workers must resume after the same epoch (each read the shared
    folder itself); else ``fit`` would run different steps on each and hang.
    (Sums of the epoch and its square: equal everywhere iff their variance is 0.)"""
    total, squares = _sum_over_workers(
        tf, strategy, tf.constant([epoch, epoch * epoch], tf.int64)).numpy()
    if size * int(squares) != int(total) ** 2:
        raise RuntimeError(
            f"the workers found different checkpoints in {checkpoint_dir} (this one resumes "
            f"after epoch {epoch}, the mean of all is {total / size:g}): checkpoint_dir must be "
            "one folder that every worker sees, on shared storage (on Databricks a /dbfs/... or "
            "/Volumes/... path)")


def _sum_over_workers(tf, strategy, value):
    """``value`` (this worker's) summed over all workers: one all-reduce.
    Each worker has one replica (checked in :func:`train_worker_tf`)."""
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: value), axis=None)
