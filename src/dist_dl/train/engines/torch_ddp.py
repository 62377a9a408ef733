"""The training loop inside every torch worker of ``train_distributed``
(``engine="torch"``): PyTorch DistributedDataParallel on the plan, reader,
schedule, checkpoints and MLflow run of the other engines.

Launched by `TorchDistributor`, which has set
torchrun's variables, this worker's threads, and its GPU (that of its local
rank). One call of `train()` is one attempt:

- ``torch.distributed`` over NCCL on GPUs, Gloo on CPUs; the model built
  with the same seed on every rank and wrapped in ``DistributedDataParallel``
  (which broadcasts rank 0's weights and averages the gradients of every
  step), with `Normalize` as its first layer;
  on GPUs in channels-last memory;
- this rank's shard through `make_loader()`
  (the rows and transforms of the TensorFlow reader; decoded on the CPU or,
  with ``decode="gpu"``, on the GPU), ``train_steps`` batches per epoch;
- SGD with momentum at the scaled, warmed-up rate of
  `WarmupScaledRates`, set before every step;
- on GPUs autocast to bfloat16 (float16 with a gradient scaler where the GPU
  has no bfloat16); on CPUs float32 (bfloat16 with ``mixed_precision="on"``);
- per epoch: training loss and accuracy over all ranks' rows, an exact
  validation pass (every real row once; sums all-reduced), and on rank 0 a
  signed, atomic checkpoint (model, optimizer, scaler, step, epoch), the
  epoch's metrics in MLflow and a progress line to the driver;
- resume: rank 0 picks the newest verified checkpoint and every rank loads
  that one, so all continue from the same step;
- at the end rank 0 logs the model (`dist_dl.tracking.torch_log`).

Imports no TensorFlow.
"""
from __future__ import annotations

import contextlib
import os
import time

from dist_dl.train.config import TrainConfig
from dist_dl.train.engines.core import (WorkerSpec, attempt_text, drivers_run, progress_text,
                                        rank0_log)

__all__ = ["train", "runner", "torch_uses_gpu", "precision", "process_group"]


def runner(cfg: TrainConfig, backend: str, spark):
    """`TorchDistributor` for ``cfg``'s workers, on the
    GPUs where the cluster has them (`torch_uses_gpu()`)."""
    from dist_dl.core.quiet import quiet_env
    from dist_dl.launch import TorchDistributor

    # Progress comes through log_to_driver; the workers' own output only with
    # an error (its last lines), on either backend.
    return TorchDistributor(
        num_processes=cfg.num_workers, local_mode=backend == "local",
        use_gpu=torch_uses_gpu(backend, spark), timeout=cfg.timeout,
        threads_per_worker=cfg.threads_per_worker, pin_cpus=cfg.pin_cpus, env=quiet_env(),
        spark=spark, driver_log_verbosity="log_callback_only")


def torch_uses_gpu(backend: str, spark) -> bool:
    """Whether the torch engine's workers train on GPUs: on the driver where
    it has GPUs, on Spark tasks where GPU scheduling gives tasks GPUs
    (``spark.task.resource.gpu.amount``)."""
    from dist_dl.core.sessionkind import session_conf
    from dist_dl.launch.core.slots import driver_gpus
    from dist_dl.launch.runners.torch_distributor import GPU_RESOURCE

    if backend == "local":
        return bool(driver_gpus(spark, GPU_RESOURCE))
    return session_conf(spark, f"spark.task.resource.{GPU_RESOURCE}.amount") is not None


def precision(mixed_precision: str, device) -> tuple:
    """``(autocast dtype or None, use a gradient scaler)`` for ``mixed_precision``
    ("auto", "on", "off") on ``device``."""
    import torch

    on_gpu = device.type == "cuda"
    if mixed_precision == "off" or (mixed_precision == "auto" and not on_gpu):
        return None, False
    if on_gpu and not torch.cuda.is_bf16_supported():
        return torch.float16, True
    return torch.bfloat16, False


def train(spec: WorkerSpec) -> dict | None:
    """One attempt of data-parallel training on this torch worker.

    Returns, on rank 0: the logged model's URI and registered version, the
    epoch the attempt started at and the number of epochs; None elsewhere.
    """
    cfg = spec.config
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with process_group() as device:
        return _train(spec, cfg, rank, size, device)


@contextlib.contextmanager
def process_group():
    """This worker's device, in torch.distributed's default process group
    (NCCL on GPUs, Gloo on CPUs) from torchrun's variables; one that is
    already initialized (`dist_dl.train.torchrun.train_torch_rank`)
    is used, and left, as it is."""
    import torch.distributed as dist

    device = _device(int(os.environ.get("LOCAL_RANK", "0")))
    if dist.is_initialized():
        yield device
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            **({"device_id": device} if device.type == "cuda" else {}))
    try:
        yield device
    finally:
        dist.destroy_process_group()


def _device(local_rank: int):
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _train(spec: WorkerSpec, cfg, rank: int, size: int, device):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from dist_dl.read.torchdata import Normalize, decode_threads, make_loader
    from dist_dl.train.checkpoint import CheckpointManager
    from dist_dl.train.models_torch import build_torch_model
    from dist_dl.train.schedule import WarmupScaledRates
    from dist_dl.read.dataset import InputWaits
    from dist_dl.train.timing import InputBoundWarning, StepTimes, input_wait_fraction

    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.backends.cudnn.benchmark = not cfg.deterministic
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    # The same initial weights on every rank (DDP broadcasts rank 0's anyway);
    # crops and flips differ per rank through the loader's seed.
    torch.manual_seed(cfg.seed)
    reader = cfg.reader_config()
    net = build_torch_model(spec.model, (cfg.image_size, cfg.image_size, 3), spec.classes)
    normalize = Normalize(reader)
    model = torch.nn.Sequential(normalize, net).to(device)
    if on_gpu:
        model = model.to(memory_format=torch.channels_last)
    autocast_dtype, scaled = precision(cfg.mixed_precision, device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.learning_rate, momentum=cfg.momentum)
    scaler = torch.amp.GradScaler("cuda", enabled=scaled)
    rate = WarmupScaledRates(cfg.learning_rate, size if cfg.scale_learning_rate else 1,
                             spec.train_steps, min(cfg.warmup_epochs, cfg.epochs),
                             total_epochs=cfg.epochs if cfg.lr_schedule == "cosine" else None)

    manager = CheckpointManager(spec.checkpoint_dir, keep=cfg.keep_checkpoints,
                                key=spec.checkpoint_key)
    initial_epoch, step = _resume(manager, rank, net, optimizer, scaler, device)
    how = "torch, " + ("NCCL on " + torch.cuda.get_device_name(device) if on_gpu else "Gloo on CPU")
    rank0_log(rank, attempt_text(spec, size, initial_epoch, _precision_name(autocast_dtype), how))
    if cfg.decode == "cpu":
        from dist_dl.read.imaging import decoder_name

        rank0_log(rank, f"JPEGs decoded on the CPU by {decoder_name()}")
    # A worker with two cores or more decodes its training images in as many
    # processes (benchmarks/loader_scaling.py: on two cores 0.90 of twice one
    # core's rate, against 0.84 in threads, which share the GIL with the
    # thread that reads rows); with one core, in one thread of its own.
    # Validation, a short pass, decodes in threads.
    cores = decode_threads()
    processes = cores if cfg.decode == "cpu" and cores >= 2 else None
    loader = make_loader(list(spec.train_files), rank, size, cfg.batch_size,
                         training=cfg.augment, shuffle=cfg.shuffle, config=reader,
                         steps_per_epoch=spec.reader_steps, seed=cfg.seed + rank,
                         epoch=initial_epoch, decode=cfg.decode, with_weights=True,
                         decode_processes=processes,
                         pin_memory=on_gpu, device=device if cfg.decode != "cpu" else None)
    if processes:
        rank0_log(rank, f"training images decoded in {processes} processes a worker")
    val_loader = (make_loader(list(spec.val_files), rank, size, cfg.batch_size, training=False,
                              config=reader, steps_per_epoch=spec.val_steps, decode=cfg.decode,
                              with_weights=True, pin_memory=on_gpu,
                              device=device if cfg.decode != "cpu" else None)
                  if spec.val_files else None)
    autocast = (lambda: torch.autocast(device.type, dtype=autocast_dtype)) \
        if autocast_dtype is not None else contextlib.nullcontext
    global_batch = cfg.batch_size * size
    progress = _Progress(rank, cfg.epochs, spec.train_steps, global_batch)
    # The steps' CPU seconds: this process's and its decoding processes'.
    times = StepTimes(cpu_clock=lambda: time.process_time() + loader.decode_cpu_seconds())
    waits = InputWaits()
    input_bound = InputBoundWarning(lambda fraction: _warn_input_bound(rank, fraction, cfg,
                                                                       on_gpu))

    def to_device(batch):
        images, labels, weights = batch
        memory = torch.channels_last if on_gpu else torch.preserve_format
        return (images.to(device, non_blocking=True, memory_format=memory),
                labels.to(device, non_blocking=True), weights.to(device, non_blocking=True))

    with loader:  # its decoding processes end with the training, however it ends
        for epoch in range(initial_epoch, cfg.epochs):
            started = time.perf_counter()
            ddp.train()
            sums = torch.zeros(4, dtype=torch.float64, device=device)
            rejected = loader.decoded["region_rejected"]
            times.clear()
            waits.clear()
            loader.set_epoch(epoch)
            batches = iter(loader)
            try:
                for index in range(spec.train_steps):
                    waits.ask()
                    batch = next(batches)
                    waits.got()
                    images, labels, weights = to_device(batch)
                    for group in optimizer.param_groups:
                        group["lr"] = rate(step)
                    with autocast():
                        logits = ddp(images)
                    losses = F.cross_entropy(logits.float(), labels, reduction="none")
                    # Keras' weighted loss: a sum over the batch's rows / rows.
                    loss = (losses * weights).mean()
                    optimizer.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    step += 1
                    with torch.no_grad():
                        correct = (logits.argmax(-1) == labels).to(weights.dtype)
                        sums[:3] += torch.stack([(losses.detach() * weights).sum(),
                                                 (correct * weights).sum(), weights.sum()]).double()
                    progress.step(epoch)
                    # The steps are timed between their ends: on a GPU, the first
                    # and the last when their work is done.
                    if on_gpu and index in (0, spec.train_steps - 1):
                        torch.cuda.synchronize(device)
                    times.record()
            finally:
                batches.close()
            # Images the region decoder refused this epoch (decoded whole instead), all ranks.
            sums[3] = loader.decoded["region_rejected"] - rejected
            dist.all_reduce(sums)
            logs = {"loss": float(sums[0] / sums[2]), "accuracy": float(sums[1] / sums[2]),
                    "learning_rate": rate(step)}
            if cfg.decode == "cpu":
                logs["train_region_decode_rejected"] = float(sums[3])
            images_per_second = times.rate(global_batch)
            if images_per_second is not None:
                logs["train_images_per_second"] = images_per_second
                logs["train_cpu_per_second"] = times.cpu_per_second()
                # From the first step's end: its wait fills the pipeline.
                logs["train_input_wait_fraction"] = input_wait_fraction(waits, times)
                input_bound(logs["train_input_wait_fraction"])
            if val_loader is not None:
                logs.update(_validate(ddp, val_loader, to_device, autocast, device))
            if rank == 0:
                state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                         "scaler": scaler.state_dict(), "step": step, "epoch": epoch + 1}
                manager.save_torch(state, epoch + 1, metadata={"run_id": spec.run_id})
                seconds = time.perf_counter() - started
                logs["epoch_seconds"] = seconds
                logs["images_per_second"] = global_batch * spec.train_steps / seconds
                _log_metrics(spec, logs, epoch + 1)
            progress.epoch_end(epoch, logs)
            # No rank runs ahead of rank 0's checkpoint: a failure in the next
            # epoch resumes after this one on every rank.
            dist.barrier()

    if rank != 0:
        return None
    logged = _log_model(spec, net, normalize, cfg)
    return {**logged, "initial_epoch": initial_epoch, "epochs": cfg.epochs}


def _warn_input_bound(rank: int, fraction: float, cfg, on_gpu: bool) -> None:
    """Rank 0 tells the driver that the workers waited for their input for
    more than ``INPUT_BOUND`` of the training steps' time, with what to do."""
    from dist_dl.train.timing import input_bound_message

    rank0_log(rank, input_bound_message(fraction, gpu_decode=on_gpu and cfg.decode == "cpu",
                                        decode=cfg.decode))


def _validate(ddp, loader, to_device, autocast, device) -> dict:
    """Exact validation over all ranks: sums of weighted loss, correct rows
    and weights (rows repeated to even out the shards have weight 0)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    ddp.eval()
    # DDP hands rank 0's buffers (BatchNorm's running statistics) to every
    # rank at the start of each training forward pass, so after the epoch's
    # last step each rank holds those of its own last batch: every rank
    # validates with rank 0's, the ones checkpointed and logged.
    with torch.no_grad():
        for buffer in ddp.module.buffers():
            dist.broadcast(buffer, 0)
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for batch in loader:
            images, labels, weights = to_device(batch)
            with autocast():
                # The module itself: DDP's forward would sync buffers, and
                # validation changes none.
                logits = ddp.module(images).float()
            losses = F.cross_entropy(logits, labels, reduction="none")
            correct = (logits.argmax(-1) == labels).to(weights.dtype)
            sums += torch.stack([(losses * weights).sum(), (correct * weights).sum(),
                                 weights.sum()]).double()
    dist.all_reduce(sums)
    if sums[2] <= 0:
        return {}
    return {"val_loss": float(sums[0] / sums[2]), "val_accuracy": float(sums[1] / sums[2])}


def _resume(manager, rank: int, net, optimizer, scaler, device) -> tuple[int, int]:
    """``(epochs done, optimizer steps done)`` of the checkpoint rank 0 picks
    (0, 0 without one); every rank loads that one into its model, optimizer
    and scaler."""
    import torch.distributed as dist

    chosen = [None]
    if rank == 0:
        latest = manager.latest()
        chosen = [None if latest is None else str(latest.path)]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return 0, 0
    state = manager.read_torch(chosen[0], map_location=device)
    try:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ValueError(f"checkpoint {chosen[0]} does not match this model or optimizer (built "
                         f"by another builder?): {exc}") from None
    scaler.load_state_dict(state.get("scaler", {}))
    rank0_log(rank, f"restored checkpoint {chosen[0]} (epoch {state['epoch']})")
    return int(state["epoch"]), int(state["step"])


def _log_metrics(spec: WorkerSpec, logs: dict, epoch: int) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    MlflowClient(spec.tracking_uri).log_batch(
        spec.run_id, metrics=[Metric(k, float(v), now, epoch) for k, v in sorted(logs.items())])


def _log_model(spec: WorkerSpec, net, normalize, cfg) -> dict:
    """Rank 0: the trained model into the driver's run (see
    `dist_dl.tracking.torch_log`)."""
    from dist_dl.tracking.torch_log import log_torch_classifier

    with drivers_run(spec):
        logged = log_torch_classifier(net, normalize, image_size=cfg.image_size,
                                      crop_fraction=cfg.eval_crop_fraction,
                                      class_names=list(spec.class_names),
                                      registered_model_name=spec.registered_model_name)
    return {"model_uri": logged.model_uri, "registered_version": logged.registered_version}


def _precision_name(dtype) -> str:
    return "float32" if dtype is None else f"{str(dtype).rsplit('.', 1)[-1]} autocast"


class _Progress:
    """Progress lines to the driver (rank 0): every ``every`` seconds and at
    each epoch's end (`progress_text()`)."""

    def __init__(self, rank: int, epochs: int, steps: int, global_batch: int,
                 every: float = 30.0):
        self._rank, self._epochs, self._steps = rank, epochs, steps
        self._global_batch, self._every = global_batch, every
        self._start = self._last = time.perf_counter()
        self._done, self._in_epoch = 0, 0

    def step(self, epoch: int) -> None:
        self._done += 1
        self._in_epoch += 1
        now = time.perf_counter()
        if now - self._last >= self._every:
            self._last = now
            self._report(epoch, self._in_epoch, now)

    def epoch_end(self, epoch: int, logs: dict) -> None:
        self._report(epoch, self._steps, time.perf_counter(), logs)
        self._in_epoch = 0

    def _report(self, epoch: int, step: int, now: float, logs: dict | None = None) -> None:
        rank0_log(self._rank, progress_text(epoch, self._epochs, step, self._steps, self._done,
                                            now - self._start, self._global_batch, logs))
