"""The training loop that runs inside every Horovod worker of ``train_distributed``.

Shipped to the workers by the launcher (``HorovodRunner``), which has already
set this process's threads, visible GPU and default cycle time. One call of
`train()` is one attempt: devices and precision, the model (built
once, before Horovod init, so that its size can choose the cycle time), Horovod
init, the shard of this rank, the scaled and warmed-up learning rate, Horovod's
DistributedOptimizer, resume from the newest checkpoint (broadcast from rank
0), then ``model.fit`` with:

- metric averaging across ranks, and an exact validation pass each epoch
  (every rank scores its validation shard; sums are allreduced);
- on rank 0 only: an atomic checkpoint each epoch, MLflow metrics,
  TensorBoard logs, progress lines to the driver, and at the end the model
  logged to MLflow (and registered).

All Horovod calls of training live here (and in the launcher); what the
TensorFlow engines share is in `dist_dl.train.engines.keras_common`.
"""
from __future__ import annotations

import math
import os

from dist_dl.core import compat
from dist_dl.core.placement import launcher_place
from dist_dl.launch.core import device
from dist_dl.train.config import TrainConfig
from dist_dl.train.engines.core import WorkerSpec, attempt_text, input_bound_warner, rank0_log
from dist_dl.train.engines.keras_common import (build_model, fit_and_log, keras_runner,
                                                learning_rate_callback, lr_schedule,
                                                pin_devices_and_precision, rank0_callbacks,
                                                training_batches, validation_batches,
                                                validation_callback)

__all__ = ["train", "runner"]


def runner(cfg: TrainConfig, backend: str, spark):
    """`HorovodRunner` for ``cfg``'s workers, with its Horovod settings."""
    from dist_dl.core.quiet import quiet_env
    from dist_dl.launch import HorovodRunner

    return keras_runner(HorovodRunner, cfg, backend, spark,
                        {**quiet_env(), **cfg.horovod_env()})


def train(spec: WorkerSpec) -> dict | None:
    """One attempt of data-parallel training, on this worker.

    Returns, on rank 0: the logged model's URI and registered version, the
    epoch the attempt started at and the number of epochs completed; None on
    the other ranks.
    """
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    keras = compat.keras()

    from dist_dl.read.dataset import InputWaits
    from dist_dl.train.checkpoint import CheckpointManager
    from dist_dl.train.checkpoint_loop import CheckpointCallback, resume
    from dist_dl.train.timing import step_timer

    cfg = spec.config
    # Horovod reads the cycle time once, in hvd.init(), and the CPU default
    # depends on the model's size: so the model is built first, with the
    # ranks the launcher put in the environment, and checked against
    # Horovod's after init.
    place = launcher_place(os.environ)
    if place is None:
        # A launcher that does not tell them: Horovod first, and the cycle
        # time stays as the launcher left it (not raised for a large model).
        hvd.init()
        rank, local_rank = hvd.rank(), hvd.local_rank()
    else:
        rank, local_rank = place.rank, place.local_rank
    mixed = pin_devices_and_precision(tf, cfg, local_rank)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Per-rank seeds: different crops and flips on every rank. The initial
    # weights are rank 0's anyway (broadcast below).
    keras.utils.set_random_seed(cfg.seed + rank)
    model = build_model(spec, mixed)
    if place is not None:
        _default_cycle_time(cfg, model)
        hvd.init()
        _check_ranks((rank, local_rank), (hvd.rank(), hvd.local_rank()))
    size = hvd.size()

    reader = cfg.reader_config()
    schedule = lr_schedule(cfg, size, spec.train_steps)
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(schedule, momentum=cfg.momentum),
        compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=cfg.backward_passes_per_step,
        average_aggregated_gradients=True, groups=cfg.allreduce_groups)
    if mixed:
        # Loss scaling outside the allreduce: the scaled gradients are averaged
        # (a linear operation), then unscaled and checked for overflow, with
        # the same result on every rank, so the scales stay in step.
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])

    manager = CheckpointManager(spec.checkpoint_dir, keep=cfg.keep_checkpoints,
                                key=spec.checkpoint_key)
    initial_epoch = resume(manager, model)
    rank0_log(rank, attempt_text(spec, size, initial_epoch,
                                 f"{'mixed' if mixed else 'float32'} precision"))
    waits = InputWaits()
    train_data = training_batches(spec, reader, rank, size, initial_epoch, waits)

    # Order matters: every rank runs the collective callbacks in the same
    # order (an allreduce each), before the rank-0-only ones read the logs.
    callbacks = [hvd.callbacks.MetricAverageCallback()]
    if spec.val_files:
        val_data = validation_batches(spec, reader, rank, size)
        callbacks.append(validation_callback(
            tf, val_data, spec.val_steps,
            combine=lambda totals: hvd.allreduce(totals, op=hvd.Sum, name="dist_dl.validation")))
    callbacks += [learning_rate_callback(tf, schedule),
                  step_timer(cfg.batch_size * size, waits=waits, warn=input_bound_warner(rank))]
    if rank == 0:
        callbacks += [CheckpointCallback(manager, metadata={"run_id": spec.run_id}),
                      *rank0_callbacks(spec, size)]
    return fit_and_log(spec, model, train_data, callbacks, rank, initial_epoch, mixed=mixed)


def _check_ranks(expected: tuple[int, int], actual: tuple[int, int]) -> None:
    """The ranks the model was seeded and pinned with must be Horovod's."""
    if tuple(expected) != tuple(actual):
        raise RuntimeError(
            f"this worker's environment gave rank {expected[0]} and local rank {expected[1]} "
            f"(seed and device chosen with them), but hvd.init() gave rank {actual[0]} and "
            f"local rank {actual[1]}. The launcher must set HOROVOD_RANK and HOROVOD_LOCAL_RANK "
            "(or Open MPI's OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_LOCAL_RANK) to the ranks "
            "Horovod assigns, or set neither")


def _default_cycle_time(cfg: TrainConfig, model) -> None:
    """Before ``hvd.init()``: unless the user chose a cycle time (in the
    config or the environment), CPU workers get ``device.cpu_cycle_time_ms`` of
    their model's float32 gradient bytes; this raises the launcher's 5 ms
    default to 20 ms for large models. GPU workers keep Horovod's default."""
    count = sum(math.prod(w.shape) for w in model.trainable_weights)
    device.default_cycle_time(os.environ, chosen=cfg.cycle_time_ms is not None,
                              gpus=device.visible_gpus(), gradient_bytes=4 * count)
