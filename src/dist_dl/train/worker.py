"""The training loop that runs inside every Horovod worker of ``train_distributed``.

Shipped to the workers by the launcher (``HorovodRunner``), which has already
set this process's threads, visible GPU and default cycle time. One call of
:func:`train_worker` is one attempt: devices and precision, the model (built
once, before Horovod init, so that its size can choose the cycle time), Horovod
init, the shard of this rank, the scaled and warmed-up learning rate, Horovod's
DistributedOptimizer, resume from the newest checkpoint (broadcast from rank
0), then ``model.fit`` with:

- metric averaging across ranks, and an exact validation pass each epoch
  (every rank scores its validation shard; sums are allreduced);
- on rank 0 only: an atomic checkpoint each epoch, MLflow metrics,
  TensorBoard logs, progress lines to the driver, and at the end the model
  logged to MLflow (and registered).

All Horovod calls of training live here (and in the launcher), so a second
engine can replace this module without touching data, tracking or scoring.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dist_dl.core import compat
from dist_dl.core.placement import launcher_place
from dist_dl.core.progress import format_duration
from dist_dl.launch import device
from dist_dl.train.config import TrainConfig

__all__ = ["WorkerSpec", "train_worker"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one attempt needs; built and checked on the driver, pickled
    to every worker.

    Attributes:
        config: The training settings.
        model: A registry name or a builder ``(input_shape, classes) -> Model``.
        train_files, val_files: Parquet file URLs of the shards (val may be empty).
        train_steps: Batches per epoch on every rank (the driver's plan).
        reader_steps: Batches in one pass of the reader over a rank's shard.
        val_steps: Validation batches per rank (one pass over its shard).
        classes: Number of classes; ``class_names`` their names by index.
        checkpoint_dir: Where rank 0 saves, and every attempt resumes from.
        tensorboard_dir: Rank 0's TensorBoard log folder.
        tracking_uri, run_id: The MLflow run rank 0 logs to.
        registered_model_name: Register the final model under this name.
        registry_uri: The model registry to register it in (the driver's:
            ``mlflow.set_registry_uri`` there does not reach the workers).
        callbacks: Optional function returning extra Keras callbacks, called
            in every worker (after Horovod init).
        attempt: 1 for the first attempt, 2 for the first retry, ...
        checkpoint_key: Signs and checks the checkpoints (kept out of the
            checkpoint folder; see ``dist_dl.core.integrity.checkpoint_key``).
    """

    config: TrainConfig
    model: Any
    train_files: tuple
    train_steps: int
    reader_steps: int
    val_files: tuple
    val_steps: int
    classes: int
    class_names: tuple
    checkpoint_dir: str
    tensorboard_dir: str
    tracking_uri: str
    run_id: str
    registered_model_name: str | None = None
    registry_uri: str | None = None
    callbacks: Callable[[], list] | None = None
    attempt: int = 1
    checkpoint_key: bytes | None = field(default=None, repr=False)


def train_worker(spec: WorkerSpec) -> dict | None:
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
    mixed = _pin_devices_and_precision(tf, cfg, local_rank)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Per-rank seeds: different crops and flips on every rank. The initial
    # weights are rank 0's anyway (broadcast below).
    keras.utils.set_random_seed(cfg.seed + rank)
    model = _build(spec, mixed)
    if place is not None:
        _default_cycle_time(cfg, model)
        hvd.init()
        _check_ranks((rank, local_rank), (hvd.rank(), hvd.local_rank()))
    size = hvd.size()

    reader = cfg.reader_config()
    schedule = _schedule(cfg, size, spec.train_steps)
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
    _log(rank, f"attempt {spec.attempt}: {size} workers, "
               f"{'resuming after epoch ' + str(initial_epoch) if initial_epoch else 'starting'}"
               f" (epochs {cfg.epochs}, {spec.train_steps} steps of {cfg.batch_size} per worker, "
               f"{'mixed' if mixed else 'float32'} precision)")
    waits = InputWaits()
    train_data = _train_data(spec, reader, rank, size, initial_epoch, waits)

    # Order matters: every rank runs the collective callbacks in the same
    # order (an allreduce each), before the rank-0-only ones read the logs.
    callbacks = [hvd.callbacks.MetricAverageCallback()]
    if spec.val_files:
        val_data = _val_data(spec, reader, rank, size)
        callbacks.append(_validation_callback(
            tf, val_data, spec.val_steps,
            combine=lambda totals: hvd.allreduce(totals, op=hvd.Sum, name="dist_dl.validation")))
    callbacks += [_learning_rate_callback(tf, schedule),
                  step_timer(cfg.batch_size * size, waits=waits, warn=_input_bound_warner(rank))]
    if rank == 0:
        callbacks += [CheckpointCallback(manager, metadata={"run_id": spec.run_id}),
                      *_rank0_callbacks(spec, size)]
    return _fit_and_log(spec, model, train_data, callbacks, rank, initial_epoch, mixed=mixed)


def _train_data(spec: WorkerSpec, reader, rank: int, size: int, initial_epoch: int, waits=None):
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


def _val_data(spec: WorkerSpec, reader, rank: int, size: int):
    from dist_dl.read import make_dataset

    return make_dataset(list(spec.val_files), rank, size, spec.config.batch_size,
                        training=False, config=reader, steps_per_epoch=spec.val_steps,
                        with_weights=True)


def _schedule(cfg: TrainConfig, size: int, steps: int):
    from dist_dl.train.schedule import WarmupScaledSchedule

    return WarmupScaledSchedule(
        cfg.learning_rate, size if cfg.scale_learning_rate else 1, steps,
        min(cfg.warmup_epochs, cfg.epochs),
        total_epochs=cfg.epochs if cfg.lr_schedule == "cosine" else None)


def _rank0_callbacks(spec: WorkerSpec, size: int) -> list:
    """Rank 0's callbacks after its checkpoint: MLflow metrics, TensorBoard, progress."""
    import tensorflow as tf
    keras = compat.keras()

    from dist_dl.tracking import MlflowEpochLogger

    cfg = spec.config
    return [
        MlflowEpochLogger(images_per_epoch=cfg.batch_size * size * spec.train_steps, writer=True),
        keras.callbacks.TensorBoard(spec.tensorboard_dir, update_freq="epoch", profile_batch=0,
                                    write_graph=False),
        _progress_callback(tf, cfg.epochs, spec.train_steps, cfg.batch_size * size),
    ]


def _fit_and_log(spec: WorkerSpec, model, train_data, callbacks: list, rank: int,
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
        logged = _log_final_model(spec, model, mixed, weights=weights)
    return {**logged, "initial_epoch": initial_epoch, "epochs": cfg.epochs}


def drivers_run(spec: WorkerSpec):
    """Rank 0's MLflow context: the driver's tracking store and registry,
    and the run the driver created as the active run, whose status only the
    driver sets (see :func:`dist_dl.tracking.target.attached_run`)."""
    import mlflow

    from dist_dl.tracking.target import attached_run

    mlflow.set_tracking_uri(spec.tracking_uri)
    if spec.registry_uri:
        mlflow.set_registry_uri(spec.registry_uri)
    return attached_run(spec.run_id)


def progress_text(epoch: int, epochs: int, step: int, steps: int, steps_done: int,
                  seconds: float, global_batch: int, logs: dict | None = None) -> str:
    """A progress line for the driver: the epoch (0-based ``epoch``) and
    step, images/s over the ``steps_done`` steps of the last ``seconds``,
    the time left, and the epoch's losses and accuracies when given."""
    rate = steps_done / max(seconds, 1e-9)
    left = ((epochs - epoch) * steps - step) / rate if rate > 0 else math.inf
    text = (f"epoch {epoch + 1}/{epochs} step {step}/{steps}: "
            f"{rate * global_batch:.1f} images/s, {format_duration(left)} left")
    if logs:
        shown = {k: v for k, v in logs.items() if k in ("loss", "accuracy", "val_loss",
                                                        "val_accuracy")}
        text += "; " + ", ".join(f"{k} {float(v):.4f}" for k, v in shown.items())
    return text


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


def _pin_devices_and_precision(tf, cfg: TrainConfig, local_rank: int) -> bool:
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


def _build(spec: WorkerSpec, mixed: bool):
    """The model of ``spec``: pixels in, normalised by its first layer, logits out."""
    from dist_dl.train.models import build_classifier

    return build_classifier(spec.model, spec.config.reader_config(), spec.classes, mixed=mixed)


def _input_bound_warner(rank: int):
    """What the step timer calls, once, when this worker waited for its input
    for too much of an epoch's steps: rank 0 tells the driver, with the
    levers (decoding on the GPU among them where this worker has one)."""
    def warn(fraction: float) -> None:
        from dist_dl.train.timing import input_bound_message

        _log(rank, input_bound_message(fraction, gpu_decode=bool(device.visible_gpus())))
    return warn


def _log(rank: int, message: str) -> None:
    if rank == 0:
        from dist_dl.launch import log_to_driver

        log_to_driver(message)


def _validation_callback(tf, data, steps: int, *, step=None, combine=None):
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
                self._step = tf.function(lambda iterator: step(self._sums, iterator))
            totals = tf.zeros([3], tf.float32)
            for _ in range(steps):
                totals += self._step(self._iterator)
            totals = (combine(totals) if combine else totals).numpy()
            if logs is not None and totals[2] > 0:
                logs["val_loss"] = float(totals[0] / totals[2])
                logs["val_accuracy"] = float(totals[1] / totals[2])

    return DistributedValidation()


def _learning_rate_callback(tf, schedule):
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


def _progress_callback(tf, epochs: int, steps: int, global_batch: int, every: float = 30.0):
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


def _log_final_model(spec: WorkerSpec, model, mixed: bool, weights=None) -> dict:
    """Rank 0, inside the run: the trained model (float32, for serving
    anywhere) and the TensorBoard logs. With ``weights`` (read from ``model``
    by every worker, as tf.distribute needs), a model built outside any
    strategy with those weights is logged instead."""
    keras = compat.keras()

    from dist_dl.tracking import ImagePreprocessing, log_keras_classifier, log_tensorboard

    serving = model
    if mixed or weights is not None:
        keras.mixed_precision.set_global_policy("float32")
        serving = _build(spec, mixed=False)
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
