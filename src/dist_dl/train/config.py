"""``TrainConfig``: every setting of ``train_distributed``, validated on construction.

Plain Python (no TensorFlow), so the driver builds and checks it, the
``train`` section of a ``conf/*.yaml`` file loads into it, and workers receive
it pickled.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainConfig", "BACKENDS"]

BACKENDS = ("auto", "local", "spark")


def _positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"TrainConfig.{name} must be a positive int"
                         f"{' or None' if allow_none else ''}, got {value!r}")


def _number(name: str, value, low: float, high: float | None = None,
            low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"TrainConfig.{name} must be a number {bound}, got {value!r}")


@dataclass(frozen=True)
class TrainConfig:
    """How ``train_distributed`` trains.

    Model and data:
        model: Registry name (``"resnet50"``, ``"small_cnn"``); a Python
            builder ``(input_shape, classes) -> keras.Model`` can be passed to
            ``train_distributed(model=...)`` instead.
        image_size: Side of the square images the model sees (pixels).
        classes: Number of classes; default: from the label index stored
            beside the shards.
        image_col, label_col: Columns of a Spark DataFrame input.
        validation_fraction: Share of a DataFrame's rows held out for the
            validation pass when no validation data is given (0 turns the
            validation pass off).

    Workers:
        num_workers: Data-parallel workers (Horovod ranks).
        backend: ``"spark"``: Spark tasks (``HorovodRunner(np=num_workers)``);
            ``"local"``: processes on the driver machine (``np=-num_workers``);
            ``"auto"`` (default): local processes when Spark's master is
            ``local[...]`` (the same machine, without Spark's start-up cost),
            Spark tasks on a cluster.
        threads_per_worker: CPU threads per worker (default: the host's cores
            shared evenly).
        pin_cpus: Pin each worker to its own share of the host's cores.
        timeout: Seconds one attempt may run (None: no limit).
        max_retries: Attempts after a failed one (a worker killed, a lost
            executor, a timeout); each resumes from the last checkpoint.

    Optimisation (the linear scaling rule of Goyal et al. 2017):
        epochs: Epochs to train in total (a resumed run continues to this).
        batch_size: Images per step on each worker; the global batch is
            ``batch_size * num_workers``.
        learning_rate: Learning rate for one worker at ``batch_size``; with
            ``scale_learning_rate`` it rises to ``learning_rate *
            num_workers`` over ``warmup_epochs``.
        momentum: SGD momentum (Nesterov off).
        warmup_epochs: Epochs of linear warmup (5 in the paper).
        lr_schedule: After warmup, ``"cosine"`` (default): decay to 0 at the
            last epoch; ``"constant"``: stay at the scaled rate.
        scale_learning_rate: Apply the scaling rule (default True).
        max_steps_per_epoch: Cap on steps per epoch (quick runs, benchmarks);
            default: one pass over the largest shard.

    Input pipeline:
        augment: Random resized crop and flip in training (False: the
            evaluation transform, centre crop).
        shuffle: Shuffle row groups and rows in training.
        flip: Horizontal flips when augmenting (turn off for digits, text).
        min_crop_area: Smallest crop, as a share of the image, when augmenting.
        eval_crop_fraction: Centre crop of the evaluation transform.
        shuffle_buffer: Rows in the shuffle buffer.
        reader_threads: Petastorm reader threads per worker.
        cache_dir: Local folder to cache each worker's shard after the first epoch.

    Precision and communication:
        mixed_precision: ``"auto"`` (default): float16 compute on GPUs,
            float32 on CPUs; ``"on"`` or ``"off"`` to force.
        fp16_allreduce: Compress gradients to float16 for the allreduce.
        backward_passes_per_step: Accumulate gradients of this many batches
            locally before one allreduce and update (fewer allreduces per
            image; the update sees ``batch_size * backward_passes_per_step``
            images per worker).
        cycle_time_ms: Horovod's cycle time (``HOROVOD_CYCLE_TIME``): how long
            its background thread waits to batch tensors into one allreduce.
            None: Horovod's default (1 ms in 0.28.1) on GPU workers; on CPU
            workers, where that thread takes CPU time from the compute, 20 ms
            for models with 16 MB or more of float32 gradients and 5 ms for
            smaller ones (measured: benchmarks/RESULTS.md), counted on the
            model each worker builds, once, before Horovod starts.
        allreduce_groups: Gradients allreduced in this many explicit groups
            (Horovod's ``DistributedOptimizer(groups=...)``; 1: one fused
            allreduce per step, negotiated once); None: Horovod's default,
            each gradient on its own, fused by the cycle time.
        fusion_threshold_mb: Horovod's tensor fusion buffer
            (``HOROVOD_FUSION_THRESHOLD``); None: Horovod's default (128 MB).
        seed: Seed of weights, shuffling and augmentation.
        deterministic: Deterministic TensorFlow ops and a single reader
            thread (fixed row order): bit-for-bit repeatable runs, slower.

    Output:
        output_dir: Where materialised shards, checkpoints and TensorBoard
            logs go by default (a path every worker can reach; on Databricks
            a ``/dbfs/...`` or ``/Volumes/...`` path).
        checkpoint_dir: Checkpoints; a run pointed at a folder that holds
            some resumes from the newest complete one. Default: a new folder
            under ``output_dir`` per run.
        keep_checkpoints: Newest checkpoints kept.
    """

    model: str = "small_cnn"
    image_size: int = 224
    classes: int | None = None
    image_col: str = "image"
    label_col: str = "label"
    validation_fraction: float = 0.1

    num_workers: int = 2
    backend: str = "auto"
    threads_per_worker: int | None = None
    pin_cpus: bool = False
    timeout: float | None = None
    max_retries: int = 2

    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.0125
    momentum: float = 0.9
    warmup_epochs: float = 5.0
    lr_schedule: str = "cosine"
    scale_learning_rate: bool = True
    max_steps_per_epoch: int | None = None

    augment: bool = True
    shuffle: bool = True
    flip: bool = True
    min_crop_area: float = 0.08
    eval_crop_fraction: float = 0.875
    shuffle_buffer: int = 1024
    reader_threads: int = 2
    cache_dir: str | None = None

    mixed_precision: str = "auto"
    fp16_allreduce: bool = False
    backward_passes_per_step: int = 1
    cycle_time_ms: float | None = None
    allreduce_groups: int | None = None
    fusion_threshold_mb: int | None = None
    seed: int = 0
    deterministic: bool = False

    output_dir: str = "runs"
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 3

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"TrainConfig.model must be a model name, got {self.model!r}; pass a "
                             "builder function as train_distributed(model=...) instead")
        if not isinstance(self.image_size, int) or isinstance(self.image_size, bool) \
                or self.image_size < 8:
            raise ValueError(f"TrainConfig.image_size must be an int >= 8, got {self.image_size!r}")
        if self.classes is not None and (not isinstance(self.classes, int)
                                         or isinstance(self.classes, bool) or self.classes < 2):
            raise ValueError(f"TrainConfig.classes must be None or an int >= 2, got {self.classes!r}")
        _number("validation_fraction", self.validation_fraction, 0.0, 0.5)
        for name in ("num_workers", "epochs", "batch_size", "shuffle_buffer", "reader_threads",
                     "keep_checkpoints", "backward_passes_per_step"):
            _positive_int(name, getattr(self, name))
        for name in ("threads_per_worker", "max_steps_per_epoch", "fusion_threshold_mb",
                     "allreduce_groups"):
            _positive_int(name, getattr(self, name), allow_none=True)
        if self.backend not in BACKENDS:
            raise ValueError(f"TrainConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.timeout is not None:
            _number("timeout", self.timeout, 0.0, low_open=True)
        if self.cycle_time_ms is not None:
            _number("cycle_time_ms", self.cycle_time_ms, 0.0, low_open=True)
        if not isinstance(self.max_retries, int) or isinstance(self.max_retries, bool) \
                or self.max_retries < 0:
            raise ValueError(f"TrainConfig.max_retries must be an int >= 0, got {self.max_retries!r}")
        _number("learning_rate", self.learning_rate, 0.0, low_open=True)
        _number("momentum", self.momentum, 0.0, 1.0)
        _number("warmup_epochs", self.warmup_epochs, 0.0)
        _number("min_crop_area", self.min_crop_area, 0.0, 1.0, low_open=True)
        _number("eval_crop_fraction", self.eval_crop_fraction, 0.0, 1.0, low_open=True)
        if self.lr_schedule not in ("cosine", "constant"):
            raise ValueError(f"TrainConfig.lr_schedule must be 'cosine' or 'constant', "
                             f"got {self.lr_schedule!r}")
        if self.mixed_precision not in ("auto", "on", "off"):
            raise ValueError(f"TrainConfig.mixed_precision must be 'auto', 'on' or 'off', "
                             f"got {self.mixed_precision!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"TrainConfig.seed must be an int, got {self.seed!r}")

    def horovod_env(self) -> dict[str, str]:
        """The Horovod settings of this configuration, as worker environment."""
        env = {}
        if self.cycle_time_ms is not None:
            env["HOROVOD_CYCLE_TIME"] = str(float(self.cycle_time_ms))
        if self.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(self.fusion_threshold_mb * 1024 * 1024)
        return env
        for name in ("scale_learning_rate", "augment", "shuffle", "flip", "fp16_allreduce",
                     "deterministic", "pin_cpus"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TrainConfig.{name} must be true or false, "
                                 f"got {getattr(self, name)!r}")
        for name in ("image_col", "label_col", "output_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"TrainConfig.{name} must be a non-empty string, "
                                 f"got {getattr(self, name)!r}")
