"""``TrainConfig``: every setting of ``train_distributed``, validated on construction.

Plain Python (no TensorFlow), so the driver builds and checks it, the
``train`` section of a ``conf/*.yaml`` file loads into it, and workers receive
it pickled.
"""
from __future__ import annotations

from dataclasses import dataclass

from dist_dl.core.settings import checked, setting
from dist_dl.prepare.images import MIN_SIDE
from dist_dl.read.augment import READERS, ReaderConfig

__all__ = ["TrainConfig", "BACKENDS", "ENGINES", "DECODES"]

BACKENDS = ("auto", "local", "spark")
ENGINES = ("auto", "horovod", "tensorflow", "torch")
DECODES = ("cpu", "gpu", "synthetic")
# Settings of Horovod's allreduce that tf.distribute has no counterpart for:
# with engine="tensorflow" they are refused, not ignored.
HOROVOD_ONLY = {"fp16_allreduce": False, "backward_passes_per_step": 1, "cycle_time_ms": None,
                "allreduce_groups": None, "fusion_threshold_mb": None}


@dataclass(frozen=True)
@checked("TrainConfig.")
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
        max_side: For a DataFrame input, the longest side its images are
            stored at (pre-resized shards, which decode faster every epoch:
            `dist_dl.prepare.ShardConfig`); None (default) keeps
            their size. Shards given by location are read as written (their
            encoding is logged as the run's ``data.*`` parameters).

    Workers:
        num_workers: Data-parallel workers (Horovod ranks).
        engine: ``"horovod"`` (allreduce by Horovod over Gloo, NCCL or MPI),
            ``"tensorflow"`` (tf.distribute's MultiWorkerMirroredStrategy:
            for runtimes without Horovod, Databricks Runtime 16.0 ML and
            later), ``"torch"`` (PyTorch DistributedDataParallel over Gloo
            on CPUs, NCCL on GPUs; the model a ``torch.nn.Module``) or
            ``"auto"`` (default): Horovod where ``horovod.tensorflow``
            imports, else tf.distribute where TensorFlow imports, else torch.
        keras: ``2`` (default): the model is a Keras 2 model (``tf.keras``
            up to TensorFlow 2.15, the ``tf-keras`` package from 2.16 on, as
            Horovod needs); ``3``: a Keras 3 model (the ``keras`` package,
            3.5 or later: runtime 16.4 LTS ML's and later; 3.2.1, runtime
            15.4's, does not sum the workers' gradients under the strategy,
            keras-team/keras#19891), trained by the tf.distribute engine
            with a training loop of the library's own (Keras 3's ``fit``
            does not work under MultiWorkerMirroredStrategy:
            keras-team/keras#20585); every BatchNormalization layer is made
            synchronized (Keras 3 would let its moving statistics drift apart
            per worker), and mixed precision's overflow check is agreed by
            all workers (see `dist_dl.train.engines.keras3`).
            ``engine="auto"`` picks tf.distribute for it.
        backend: ``"spark"``: Spark tasks (``HorovodRunner(np=num_workers)``);
            ``"local"``: processes on the driver machine (``np=-num_workers``);
            ``"auto"`` (default): local processes when Spark's master is
            ``local[...]`` (the same machine, without Spark's start-up cost),
            Spark tasks on a cluster. The same names as the runners'
            ``backend`` (which also takes a launcher object).
        threads_per_worker: CPU threads per worker (default: the host's cores
            shared evenly).
        pin_cpus: Pin each worker to its own share of the host's cores.
        timeout: Seconds one attempt may run (None: no limit).
        max_retries: Attempts after a failed one (a worker killed, a lost
            executor, a timeout); each resumes from the last checkpoint.
        retry_wait: Seconds a retry on Spark tasks waits for the cluster to
            have ``num_workers`` task slots again (the executor of a host
            that was lost coming back, an autoscaled worker joining) before
            the run fails.

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
        reader_threads: Parquet reader threads per worker.
        reader: ``"auto"`` (default: Petastorm where it imports, else the
            arrow reader), ``"petastorm"`` or ``"arrow"`` (pyarrow alone);
            see `dist_dl.read.ReaderConfig`.
        cache_dir: Local folder to cache each worker's shard after the first epoch.
        decode: Where the torch engine decodes JPEGs: ``"cpu"`` (default:
            Pillow in threads, the worker's share of the host's cores) or
            ``"gpu"`` (torchvision's CUDA decoder, crop and resize on the
            worker's GPU), or ``"synthetic"`` (no decoding: random images
            made once on the worker's device, with the shards' labels: the
            training loop's speed without its input, for benchmarks). The
            TensorFlow engines decode on the CPU only.

    Precision and communication:
        mixed_precision: ``"auto"`` (default): float16 compute on GPUs,
            float32 on CPUs; ``"on"`` or ``"off"`` to force. The torch
            engine computes in bfloat16 where the GPU has it (autocast; no
            loss scaling needed), else float16 with a gradient scaler, and
            in bfloat16 on CPUs with ``"on"``.
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
            smaller ones (benchmarks/RESULTS.md has the figures), counted on the
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

    model: str = setting("small_cnn", nonempty=True, expected="a model name",
                         why="pass a builder function as train_distributed(model=...) instead")
    image_size: int = setting(224, low=8)
    classes: int | None = setting(None, low=2)
    image_col: str = setting("image", nonempty=True)
    label_col: str = setting("label", nonempty=True)
    validation_fraction: float = setting(0.1, low=0.0, high=0.5)
    max_side: int | None = setting(None, low=MIN_SIDE)

    num_workers: int = setting(2, low=1)
    engine: str = setting("auto", choices=ENGINES)
    keras: int = setting(2, choices=(2, 3))
    backend: str = setting("auto", choices=BACKENDS)
    threads_per_worker: int | None = setting(None, low=1)
    pin_cpus: bool = setting(False)
    timeout: float | None = setting(None, low=0.0, low_open=True)
    max_retries: int = setting(2, low=0)
    retry_wait: float = setting(300.0, low=0.0)

    epochs: int = setting(1, low=1)
    batch_size: int = setting(32, low=1)
    learning_rate: float = setting(0.0125, low=0.0, low_open=True)
    momentum: float = setting(0.9, low=0.0, high=1.0)
    warmup_epochs: float = setting(5.0, low=0.0)
    lr_schedule: str = setting("cosine", choices=("cosine", "constant"))
    scale_learning_rate: bool = setting(True)
    max_steps_per_epoch: int | None = setting(None, low=1)

    augment: bool = setting(True)
    shuffle: bool = setting(True)
    flip: bool = setting(True)
    min_crop_area: float = setting(0.08, low=0.0, high=1.0, low_open=True)
    eval_crop_fraction: float = setting(0.875, low=0.0, high=1.0, low_open=True)
    shuffle_buffer: int = setting(1024, low=1)
    reader_threads: int = setting(2, low=1)
    reader: str = setting("auto", choices=READERS)
    cache_dir: str | None = setting(None)
    decode: str = setting("cpu", choices=DECODES)

    mixed_precision: str = setting("auto", choices=("auto", "on", "off"))
    fp16_allreduce: bool = setting(False)
    backward_passes_per_step: int = setting(1, low=1)
    cycle_time_ms: float | None = setting(None, low=0.0, low_open=True)
    allreduce_groups: int | None = setting(None, low=1)
    fusion_threshold_mb: int | None = setting(None, low=1)
    seed: int = setting(0)
    deterministic: bool = setting(False)

    output_dir: str = setting("runs", nonempty=True)
    checkpoint_dir: str | None = setting(None)
    keep_checkpoints: int = setting(3, low=1)

    def reader_config(self) -> ReaderConfig:
        """The reader settings every engine's workers read with: images end
        at uint8 pixels (``normalize=False``) and the model normalises them
        as its first layer."""
        return ReaderConfig(image_size=self.image_size, eval_crop_fraction=self.eval_crop_fraction,
                            area_range=(self.min_crop_area, 1.0), flip=self.flip,
                            shuffle_buffer=self.shuffle_buffer,
                            reader_threads=1 if self.deterministic else self.reader_threads,
                            reader=self.reader, normalize=False)

    def horovod_env(self) -> dict[str, str]:
        """The Horovod settings of this configuration, as worker environment."""
        env = {}
        if self.cycle_time_ms is not None:
            env["HOROVOD_CYCLE_TIME"] = str(float(self.cycle_time_ms))
        if self.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(self.fusion_threshold_mb * 1024 * 1024)
        return env
