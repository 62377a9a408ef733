"""What every engine's worker shares, whatever its framework: the attempt's
settings (`WorkerSpec`, built and checked on the driver), rank 0's
MLflow context, progress lines and messages to the driver.

An engine is one module of this package with ``train(spec)`` (one attempt on
one worker) and ``runner(cfg, backend, spark)`` (its launcher); see
`dist_dl.train.engines`. Imports no framework.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from dist_dl.core.progress import format_duration
from dist_dl.launch.core import device
from dist_dl.train.config import TrainConfig

__all__ = ["WorkerSpec", "drivers_run", "progress_text", "attempt_text", "rank0_log",
           "input_bound_warner"]


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
        initial_epoch: The epoch the run's first attempt starts at (its
            newest complete checkpoint's; each attempt finds its own).
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
    initial_epoch: int = 0


def drivers_run(spec: WorkerSpec):
    """Rank 0's MLflow context: the driver's tracking store and registry,
    and the run the driver created as the active run, whose status only the
    driver sets (see `dist_dl.tracking.target.attached_run()`)."""
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


def attempt_text(spec: WorkerSpec, size: int, initial_epoch: int, precision: str,
                 how: str | None = None) -> str:
    """An attempt's first line for the driver: the attempt, its workers
    (``how`` they agree, when given), where it starts and the plan."""
    cfg = spec.config
    return (f"attempt {spec.attempt}: {size} workers{f' ({how})' if how else ''}, "
            f"{'resuming after epoch ' + str(initial_epoch) if initial_epoch else 'starting'}"
            f" (epochs {cfg.epochs}, {spec.train_steps} steps of {cfg.batch_size} per worker, "
            f"{precision})")


def rank0_log(rank: int, message: str) -> None:
    """``message`` to the driver's output (``log_to_driver``), from rank 0 only."""
    if rank == 0:
        from dist_dl.launch import log_to_driver

        log_to_driver(message)


def input_bound_warner(rank: int):
    """What the step timer calls, once, when this worker waited for its input
    for too much of an epoch's steps: rank 0 tells the driver, with the
    levers (decoding on the GPU among them where this worker has one)."""
    def warn(fraction: float) -> None:
        from dist_dl.train.timing import input_bound_message

        rank0_log(rank, input_bound_message(fraction, gpu_decode=bool(device.visible_gpus())))
    return warn
