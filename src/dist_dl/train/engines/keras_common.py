"""What the TensorFlow engines share (Horovod, tf.distribute with Keras 2,
and the Keras 3 loop on tf.distribute): devices and precision, the model,
each rank's data, the learning-rate schedule, the exact validation pass, the
Keras callbacks (learning rate, progress, rank 0's MLflow and TensorBoard),
``fit`` and the final model's logging; and the tf.distribute start and data
wiring that both tf.distribute engines use.

TensorFlow is imported inside the functions: importing this module loads no
framework (a worker sets its threads and devices before TensorFlow loads).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

from dist_dl.core import compat
from dist_dl.core.placement import launcher_place
from dist_dl.train.config import TrainConfig
from dist_dl.train.engines.core import (WorkerSpec, attempt_text, drivers_run,
                                        input_bound_warner, progress_text, rank0_log)

__all__ = ["pin_devices_and_precision", "build_model", "training_batches", "validation_batches",
           "lr_schedule", "rank0_callbacks", "fit_and_log", "validation_callback",
           "learning_rate_callback", "progress_callback", "log_final_model", "start_tf_distribute",
           "tf_distribute_data_and_callbacks", "same_epoch_everywhere", "sum_over_workers",
           "keras_runner"]


def pin_devices_and_precision(tf, cfg: TrainConfig, local_rank: int) -> bool:
    """Give this worker one GPU (if any) and decide on mixed precision."""
    keras = compat.keras()
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > 1:
        # The launcher shows each worker only its local rank's GPU; a runner
        # that did not (a user's own launcher) still gets one GPU per rank.
        gpus = [gpus[local_rank % len(gpus)]]
        tf.config.set_visible_devices(gpus, "GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    mixed = cfg.mixed_precision == "on" or (cfg.mixed_precision == "auto" and bool(gpus))
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    return mixed


def build_model(spec: WorkerSpec, mixed: bool):
    """The model of ``spec``: pixels in, normalised by its first layer, logits out."""
    from dist_dl.train.models import build_classifier

    return build_classifier(spec.model, spec.config.reader_config(), spec.classes, mixed=mixed)


def training_batches(spec: WorkerSpec, reader, rank: int, size: int, initial_epoch: int,
                     waits=None):
    """This rank's training batches: ``batch_size`` rows, ``reader_steps`` per
    pass, the orders continuing after ``initial_epoch`` epochs; ``waits``
    (an ``InputWaits``) times the waits for them."""
    from dist_dl.read import make_dataset

    cfg = spec.config
    return make_dataset(list(spec.train_files), rank, size, cfg.batch_size,
                        training=cfg.augment, shuffle=cfg.shuffle, config=reader,
                        steps_per_epoch=spec.reader_steps, seed=cfg.seed + rank,
                        cache_dir=cfg.cache_dir, with_weights=True, initial_epoch=initial_epoch,
                        waits=waits)


def validation_batches(spec: WorkerSpec, reader, rank: int, size: int):
    from dist_dl.read import make_dataset

    return make_dataset(list(spec.val_files), rank, size, spec.config.batch_size,
                        training=False, config=reader, steps_per_epoch=spec.val_steps,
                        with_weights=True)


def lr_schedule(cfg: TrainConfig, size: int, steps: int):
    from dist_dl.train.schedule import WarmupScaledSchedule

    return WarmupScaledSchedule(
        cfg.learning_rate, size if cfg.scale_learning_rate else 1, steps,
        min(cfg.warmup_epochs, cfg.epochs),
        total_epochs=cfg.epochs if cfg.lr_schedule == "cosine" else None)


def rank0_callbacks(spec: WorkerSpec, size: int) -> list:
    """Rank 0's callbacks after its checkpoint: MLflow metrics, TensorBoard, progress."""
    import tensorflow as tf
    keras = compat.keras()

    from dist_dl.tracking import MlflowEpochLogger

    cfg = spec.config
    return [
        MlflowEpochLogger(images_per_epoch=cfg.batch_size * size * spec.train_steps, writer=True),
        keras.callbacks.TensorBoard(spec.tensorboard_dir, update_freq="epoch", profile_batch=0,
                                    write_graph=False),
        progress_callback(tf, cfg.epochs, spec.train_steps, cfg.batch_size * size),
    ]


def fit_and_log(spec: WorkerSpec, model, train_data, callbacks: list, rank: int,
                 initial_epoch: int, *, mixed: bool = False, weights_everywhere: bool = False,
                 fit: Callable[[list], None] | None = None):
    """``fit`` from ``initial_epoch`` (the user's callbacks last), then rank 0
    logs the model into the run the driver created (and will close).
    ``mixed``: trained in mixed precision (a float32 model is logged).
    ``weights_everywhere``: every worker reads the final weights (tf.distribute).
    ``fit(callbacks)``: a training loop of one's own instead of ``model.fit``."""
    cfg = spec.config
    if spec.callbacks is not None:
        callbacks = [*callbacks, *spec.callbacks()]
    with drivers_run(spec) if rank == 0 else contextlib.nullcontext():
        if initial_epoch < cfg.epochs and fit is not None:
            fit(callbacks)
        elif initial_epoch < cfg.epochs:
            model.fit(train_data, epochs=cfg.epochs, initial_epoch=initial_epoch,
                      steps_per_epoch=spec.train_steps, callbacks=callbacks, verbose=0)
        weights = model.get_weights() if weights_everywhere else None
        if rank != 0:
            return None
        logged = log_final_model(spec, model, mixed, weights=weights)
    return {**logged, "initial_epoch": initial_epoch, "epochs": cfg.epochs}


def validation_callback(tf, data, steps: int, *, step=None, combine=None):
    """Exact validation over all ranks: sums of weighted loss, correct
    predictions and weights, so rows repeated to even out the shards (weight
    0) count nothing and every real row counts once.

    ``step(sums, iterator)`` gives one batch's sums (default: this rank's,
    ``sums(*next(iterator))``); ``combine(totals)`` adds up the ranks' totals
    at the end (default: none, the steps' sums are over all ranks already).
    """
    keras = compat.keras()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    step = step or (lambda sums, iterator: sums(*next(iterator)))

    class DistributedValidation(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._iterator = None
            self._step = None

        def _sums(self, images, labels, weights):
            logits = tf.cast(self.model(images, training=False), tf.float32)
            correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                                       tf.cast(labels, tf.int32)), tf.float32)
            return tf.stack([tf.reduce_sum(loss_fn(labels, logits) * weights),
                             tf.reduce_sum(correct * weights), tf.reduce_sum(weights)])

        def on_epoch_end(self, epoch, logs=None):
            if self._iterator is None:
                self._iterator = iter(data)
                # Graph code already: no AutoGraph rewrite (see make_dataset).
                self._step = tf.function(lambda iterator: step(self._sums, iterator),
                                         autograph=False)
            totals = tf.zeros([3], tf.float32)
            for _ in range(steps):
                totals += self._step(self._iterator)
            totals = (combine(totals) if combine else totals).numpy()
            if logs is not None and totals[2] > 0:
                logs["val_loss"] = float(totals[0] / totals[2])
                logs["val_accuracy"] = float(totals[1] / totals[2])

    return DistributedValidation()


def learning_rate_callback(tf, schedule):
    """Adds the learning rate reached (warmup shows in the metrics) to the logs."""
    keras = compat.keras()

    class LearningRate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                # The inner optimizer's steps under loss scaling (Keras 3.5's
                # LossScaleOptimizer counts none of its own).
                optimizer = self.model.optimizer
                optimizer = getattr(optimizer, "inner_optimizer", optimizer)
                logs["learning_rate"] = schedule.value_at(int(optimizer.iterations.numpy()))

    return LearningRate()


def progress_callback(tf, epochs: int, steps: int, global_batch: int, every: float = 30.0):
    """Progress lines to the driver: epoch, step, images/s and time left."""
    keras = compat.keras()
    from dist_dl.launch import log_to_driver

    class Progress(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self._start = time.perf_counter()
            self._last = self._start
            self._done = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self._done += 1
            now = time.perf_counter()
            if now - self._last >= every:
                self._last = now
                self._report(batch + 1, now)

        def on_epoch_end(self, epoch, logs=None):
            self._report(steps, time.perf_counter(), logs)

        def _report(self, step, now, logs=None):
            log_to_driver(progress_text(self._epoch, epochs, step, steps, self._done,
                                        now - self._start, global_batch, logs))

    return Progress()


def log_final_model(spec: WorkerSpec, model, mixed: bool, weights=None) -> dict:
    """Rank 0, inside the run: the trained model (float32, for serving
    anywhere) and the TensorBoard logs. With ``weights`` (read from ``model``
    by every worker, as tf.distribute needs), a model built outside any
    strategy with those weights is logged instead."""
    keras = compat.keras()

    from dist_dl.tracking import ImagePreprocessing, log_keras_classifier, log_tensorboard

    serving = model
    if mixed or weights is not None:
        keras.mixed_precision.set_global_policy("float32")
        serving = build_model(spec, mixed=False)
        serving.set_weights(model.get_weights() if weights is None else weights)
    # Served from decoded images: whole pixel values 0-255, as the reader's
    # uint8 ones, normalised by the model's first layer as in training.
    preprocessing = ImagePreprocessing(image_size=spec.config.image_size, channels=3,
                                       rescale=1.0, integer_pixels=True,
                                       crop_fraction=spec.config.eval_crop_fraction)
    logged = log_keras_classifier(serving, preprocessing, image_col="image",
                                  registered_model_name=spec.registered_model_name,
                                  class_names=list(spec.class_names), from_logits=True)
    if os.path.isdir(spec.tensorboard_dir) and any(os.scandir(spec.tensorboard_dir)):
        log_tensorboard(spec.tensorboard_dir)
    return {"model_uri": logged.model_uri, "registered_version": logged.registered_version}


def start_tf_distribute(tf, spec: WorkerSpec):
    """This worker's strategy, rank, number of workers, precision, reader
    settings, learning-rate schedule and checkpoint manager: devices and
    precision first (the strategy configures the runtime), then
    MultiWorkerMirroredStrategy from ``TF_CONFIG``, one replica per worker,
    determinism and per-rank seeds."""
    from dist_dl.launch.engines.tensorflow import multi_worker_strategy
    from dist_dl.train.checkpoint import CheckpointManager

    cfg = spec.config

    place = launcher_place(os.environ)
    if place is None or "TF_CONFIG" not in os.environ:
        raise RuntimeError("this training loop runs on the workers of TFDistributeRunner, which "
                           "set TF_CONFIG; this process has none")
    mixed = pin_devices_and_precision(tf, cfg, place.local_rank)
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
            lr_schedule(cfg, size, spec.train_steps), manager)


def tf_distribute_data_and_callbacks(tf, spec: WorkerSpec, strategy, reader, schedule, manager,
                                     rank: int, size: int, initial_epoch: int, mixed: bool,
                                     engine: str):
    """After resume, on every tf.distribute worker: the check that all
    resumed after the same epoch, the attempt's first line, this worker's
    training data, and the callbacks (the collective ones in the same order
    on every worker, then rank 0's)."""
    from dist_dl.read.dataset import InputWaits
    from dist_dl.train.checkpoint_loop import CheckpointCallback
    from dist_dl.train.timing import step_timer

    cfg = spec.config
    same_epoch_everywhere(tf, strategy, initial_epoch, size, spec.checkpoint_dir)
    rank0_log(rank, attempt_text(spec, size, initial_epoch,
                                 f"{'mixed' if mixed else 'float32'} precision", engine))
    # Each worker's own shard, batch_size rows per step: the function is
    # called once on this worker (one input pipeline, one replica).
    waits = InputWaits()
    train_data = strategy.distribute_datasets_from_function(
        lambda _: training_batches(spec, reader, rank, size, initial_epoch, waits))
    callbacks = []
    if spec.val_files:
        val_data = strategy.distribute_datasets_from_function(
            lambda _: validation_batches(spec, reader, rank, size))
        # This worker's sums batch by batch (its one replica's), then one
        # all-reduce per pass, as the Horovod worker does.
        callbacks.append(validation_callback(
            tf, val_data, spec.val_steps,
            step=lambda sums, iterator: strategy.experimental_local_results(
                strategy.run(sums, args=next(iterator)))[0],
            combine=lambda totals: sum_over_workers(tf, strategy, totals)))
    callbacks += [learning_rate_callback(tf, schedule),
                  step_timer(cfg.batch_size * size, waits=waits, warn=input_bound_warner(rank)),
                  CheckpointCallback(manager, metadata={"run_id": spec.run_id},
                                     writer=rank == 0, peers=True)]
    if rank == 0:
        callbacks += rank0_callbacks(spec, size)
    return train_data, callbacks


def same_epoch_everywhere(tf, strategy, epoch: int, size: int, checkpoint_dir: str) -> None:
    """All workers must resume after the same epoch (each read the shared
    folder itself); else ``fit`` would run different steps on each and hang.
    (Sums of the epoch and its square: equal everywhere iff their variance is 0.)"""
    total, squares = sum_over_workers(
        tf, strategy, tf.constant([epoch, epoch * epoch], tf.int64)).numpy()
    if size * int(squares) != int(total) ** 2:
        raise RuntimeError(
            f"the workers found different checkpoints in {checkpoint_dir} (this one resumes "
            f"after epoch {epoch}, the mean of all is {total / size:g}): checkpoint_dir must be "
            "one folder that every worker sees, on shared storage (on Databricks a /dbfs/... or "
            "/Volumes/... path)")


def sum_over_workers(tf, strategy, value):
    """``value`` (this worker's) summed over all workers: one all-reduce.
    Each worker has one replica (checked in `start_tf_distribute()`)."""
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: value), axis=None)


def keras_runner(runner_class, cfg: TrainConfig, backend: str, spark, env: dict):
    """``runner_class`` (``HorovodRunner`` or ``TFDistributeRunner``) for
    ``cfg``'s workers on ``backend``, ``env`` set in every worker."""
    # Progress comes through log_to_driver; the workers' own output only with
    # an error (its last lines), on either backend.
    return runner_class(np=cfg.num_workers if backend == "spark" else -cfg.num_workers,
                        timeout=cfg.timeout, threads_per_worker=cfg.threads_per_worker,
                        pin_cpus=cfg.pin_cpus, env=env, spark=spark,
                        driver_log_verbosity="log_callback_only")
