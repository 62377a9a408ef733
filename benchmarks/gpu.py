"""ResNet50 at 224 px on this machine's NVIDIA GPUs: the library's torch
engine against a plain PyTorch DDP loop, side by side.

For a machine with NVIDIA GPUs and PyTorch and torchvision installed; needs
only the library's wheel and MLflow (skinny), no TensorFlow and no PySpark:
the library trains with ``train_distributed(engine="torch", backend="local")``,
one worker per GPU. Every setup trains ResNet50 (torchvision's, random
initial weights, 1000 classes) for ``--epochs`` epochs of ``--steps`` steps
of ``--batch-size`` images per GPU, with bf16 autocast (fp16 with a gradient
scaler where a GPU has no bf16), channels-last memory, SGD with momentum:

- ``synthetic``: no input pipeline. The library with ``decode="synthetic"``
  (random images made once on the GPU, the shards' labels); the plain loop
  on random images made once on the GPU.
- ``jpeg_cpu``: JPEG shards decoded on the CPU. The library's loader
  (Pillow in threads, each worker its share of the cores); the plain loop
  with torchvision's reference input (a ``DataLoader`` over the same rows
  with a worker process per core of its share, ``RandomResizedCrop(224)``,
  ``RandomHorizontalFlip``, ``ToDtype`` and ``Normalize``, pinned memory).
- ``jpeg_gpu``: the library decoding the same shards on the GPU
  (``decode="gpu"``: torchvision's CUDA JPEG decoder, crop, resize and flip
  there).

The shards hold ImageNet-like JPEGs (``--images`` cuts of scikit-learn's two
sample photographs, about 500 x 375, quality 90; benchmarks/max_side.py),
repeated to fill every step. A rate is images per second per GPU over the
last epoch's steps after its first (the library's
``train_images_per_second``; the same window in the plain loop, both timed
between CUDA synchronisations), and ``cpu_per_second`` the CPU seconds per
second that one GPU's worker used then (its process and its decoding
processes). Setups run one after another, library and plain in turns, each
in fresh processes.

Writes ``gpu.*`` keys to ``--results`` (``benchmarks/results.json``):
``gpu.<setup>.library`` and ``gpu.<setup>.plain`` (images/s per GPU),
``gpu.synthetic.library_vs_plain`` (goal >= 0.95), ``gpu.jpeg_gpu.vs_synthetic``
(goal >= 0.8), ``gpu.jpeg_cpu.vs_synthetic`` and ``gpu.jpeg_cpu.library_vs_plain``,
each with the GPU's name, the cores and the stack; and the torch loader alone
on the machine's cores (``decode="cpu"``, no training): ``gpu.loader.images_per_second``
(its best thread count), ``gpu.loader.per_core`` (images per CPU-second with a
thread per core) and ``gpu.loader.vs_decode`` (that against one thread's
simplejpeg decode-only loop; goal >= 0.8, issue 31's per-core goal); and
decoding in processes of its own (``decode_processes``, half the cores and
all): ``gpu.loader.processes.images_per_second`` (the best count) and
``gpu.loader.processes_vs_threads`` (that over the best thread count's).

    python3 benchmarks/gpu.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SETUPS = ("synthetic", "jpeg_cpu", "jpeg_gpu")
CLASSES = 1000
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# A rate at which ResNet50 from random weights, without warmup, does not
# diverge in bf16 (the speed does not depend on it).
LEARNING_RATE = 0.02


# ------------------------------------------------------------------ the data

def _photos(args: tuple) -> list[bytes]:
    sys.path.insert(0, HERE)
    from max_side import make_photos

    count, seed = args
    return make_photos(count, 500, seed=seed)


def make_shards(folder: str, distinct: int, rows: int, rows_per_group: int) -> str:
    """``rows`` rows of ``distinct`` ImageNet-like JPEGs, made in parallel."""
    from multiprocessing import Pool

    from dist_dl.prepare.synthetic import write_image_shards

    workers = max(1, min(os.cpu_count() or 1, 16))
    chunks = [(len(part), seed) for seed, part in
              enumerate([range(distinct)[i::workers] for i in range(workers)]) if len(part)]
    with Pool(workers) as pool:
        photos = [p for part in pool.map(_photos, chunks) for p in part]
    path = os.path.join(folder, "shards")
    write_image_shards(path, (photos[i % len(photos)] for i in range(rows)),
                       [i % CLASSES for i in range(rows)], CLASSES, source="photo",
                       rows_per_row_group=rows_per_group,
                       encoding={"resize_short_side": None, "max_side": 500, "jpeg_quality": 90})
    return path


# ------------------------------------------------------------ the library

def run_library(setup: str, shards: str, folder: str, args, gpus: int) -> dict:
    import dist_dl

    decode = {"synthetic": "synthetic", "jpeg_cpu": "cpu", "jpeg_gpu": "gpu"}[setup]
    started = time.perf_counter()
    model = dist_dl.train_distributed(
        shards, engine="torch", backend="local", num_workers=gpus, model="resnet50",
        image_size=224, classes=CLASSES, epochs=args.epochs, batch_size=args.batch_size,
        max_steps_per_epoch=args.steps, learning_rate=LEARNING_RATE, warmup_epochs=0,
        lr_schedule="constant", decode=decode, timeout=args.timeout, max_retries=0,
        output_dir=os.path.join(folder, f"out-{setup}"),
        tracking_uri="file:" + os.path.join(folder, "mlruns"), experiment_name="gpu",
        run_name=f"library-{setup}")
    history = model.history
    return {"images_per_second": history["train_images_per_second"][-1] / gpus,
            "cpu_per_second": history["train_cpu_per_second"][-1],
            "loss": history["loss"][-1], "seconds": time.perf_counter() - started}


# ------------------------------------------------------- the plain loop

class _Rows:
    """A map-style dataset of one rank's JPEG rows (torchvision's reference
    decodes with Pillow in its DataLoader's worker processes)."""

    def __init__(self, shards: str, rank: int, world: int, transform):
        import pyarrow.parquet as pq

        table = pq.read_table(shards, columns=["image", "label"])
        self.images = table.column("image").to_pylist()[rank::world]
        self.labels = table.column("label").to_pylist()[rank::world]
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        import io

        from PIL import Image

        with Image.open(io.BytesIO(self.images[i])) as image:
            return self.transform(image.convert("RGB")), self.labels[i]


def _plain_worker(rank: int, world: int, setup: str, shards: str, args, port: int,
                  out: str) -> None:
    import psutil
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    on_gpu = not args.cpu
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None, num_classes=CLASSES)
    model = model.to(device, memory_format=torch.channels_last)
    ddp = DistributedDataParallel(model, device_ids=[rank] if on_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)
    bf16 = not on_gpu or torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler("cuda", enabled=not bf16)
    criterion = torch.nn.CrossEntropyLoss()
    batch = args.batch_size
    if setup == "synthetic":
        images = torch.randn(batch, 3, 224, 224, device=device).contiguous(
            memory_format=torch.channels_last)
        labels = torch.randint(0, CLASSES, (batch,), device=device)
        epoch_batches = lambda: ((images, labels) for _ in range(args.steps))  # noqa: E731
    else:
        import torchvision.transforms.v2 as T

        transform = T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(),
                               T.PILToTensor(), T.ToDtype(torch.float32, scale=True),
                               T.Normalize(MEAN, STD)])
        workers = max(1, (len(os.sched_getaffinity(0)) // world) - 1)
        loader = torch.utils.data.DataLoader(
            _Rows(shards, rank, world, transform), batch_size=batch, shuffle=True,
            num_workers=workers, pin_memory=True, drop_last=True)
        epoch_batches = lambda: iter(loader)  # noqa: E731
    me = psutil.Process()
    for _ in range(args.epochs):
        ends, cpu = [], []
        batches = epoch_batches()
        for _, (x, y) in zip(range(args.steps), batches):
            x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16 if bf16 else torch.float16,
                                enabled=on_gpu):
                loss = criterion(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if not ends and on_gpu:
                torch.cuda.synchronize(device)
            ends.append(time.perf_counter())
            cpu.append(_cpu_seconds(me))
        if on_gpu:
            torch.cuda.synchronize(device)
        ends[-1] = time.perf_counter()
        cpu[-1] = _cpu_seconds(me)
        del batches
    rate = (len(ends) - 1) * batch / (ends[-1] - ends[0])
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"images_per_second": rate,
                       "cpu_per_second": (cpu[-1] - cpu[0]) / (ends[-1] - ends[0]),
                       "loss": loss.item()}, f)
    dist.destroy_process_group()


def _cpu_seconds(process) -> float:
    """CPU seconds of ``process`` and of its living children (DataLoader workers)."""
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except Exception:  # a worker that just ended
            pass
    return total


def run_plain(setup: str, shards: str, folder: str, args, gpus: int) -> dict:
    import torch.multiprocessing as mp

    from dist_dl.launch.core.rendezvous import pick_ports

    out = os.path.join(folder, f"plain-{setup}.json")
    started = time.perf_counter()
    mp.spawn(_plain_worker, args=(gpus, setup, shards, args, pick_ports(1)[0], out), nprocs=gpus)
    with open(out) as f:
        result = json.load(f)
    return {**result, "seconds": time.perf_counter() - started}


# ------------------------------------------------------------ the checks

def _runner_probe(value: float) -> dict:
    """In every TorchDistributor process: its device and an NCCL all-reduce."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    total = torch.tensor([value], device=device)
    dist.all_reduce(total)
    found = {"backend": dist.get_backend(), "device": str(device),
             "local_rank": os.environ["LOCAL_RANK"], "sum": float(total),
             "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    dist.destroy_process_group()
    return found


def check_runner(gpus: int, use_gpu: bool) -> dict:
    """TorchDistributor in local mode on the GPUs: each process on the GPU of
    its local rank, NCCL between them."""
    from dist_dl import TorchDistributor

    return TorchDistributor(num_processes=gpus, local_mode=True, use_gpu=use_gpu,
                            timeout=120).run(_runner_probe, 1.0)


def check_decode(shards: str, count: int = 64) -> dict:
    """The GPU decoder's evaluation images against the CPU decoder's (Pillow),
    on the same rows: pixel differences (0-255)."""
    import torch

    from dist_dl.read import ReaderConfig
    from dist_dl.read.torchdata import make_loader

    batches = {}
    for decode in ("cpu", "gpu"):
        loader = make_loader(shards, 0, 1, count, training=False, decode=decode,
                             config=ReaderConfig(image_size=224), steps_per_epoch=1)
        images, _ = next(iter(loader))
        batches[decode] = images.to("cpu", torch.float32)
    diff = (batches["cpu"] - batches["gpu"]).abs()
    return {"mean_abs": float(diff.mean()), "p99_abs": float(diff.flatten().quantile(0.99)),
            "max_abs": float(diff.max()), "images": count}


def check_loader(shards: str, batch_size: int, batches: int = 12) -> dict:
    """The torch loader alone on this machine's cores (``decode="cpu"``, train
    transforms, one rank): images/s and images per CPU-second at several
    decoding-thread counts and at two decoding-process counts, against one
    thread's loops over the same JPEGs that only decode (simplejpeg; Pillow)
    and that decode, crop and resize (``decode_into``): issue 31's per-core
    figures on a GPU node's cores."""
    import numpy as np
    import pyarrow.parquet as pq

    from dist_dl.read import ReaderConfig
    from dist_dl.read.imaging import crop_draws, decode_into
    from dist_dl.read.torchdata import make_loader

    config = ReaderConfig(image_size=224)
    jpegs = pq.read_table(shards, columns=["image"]).column("image").to_pylist()[:256]

    def loop(work) -> float:
        """Images per CPU-second of ``work(jpeg, i)`` over ``jpegs``, one thread, best of 2."""
        best = 0.0
        for _ in range(2):
            cpu = time.process_time()
            for i, jpeg in enumerate(jpegs):
                work(jpeg, i)
            best = max(best, len(jpegs) / max(1e-9, time.process_time() - cpu))
        return best

    import io

    import simplejpeg
    from PIL import Image

    def pillow(jpeg, _):
        with Image.open(io.BytesIO(jpeg)) as image:
            image.load()

    out = np.empty((224, 224, 3), np.uint8)
    draws = crop_draws(np.random.default_rng(0), len(jpegs))
    found = {"decode_simplejpeg": loop(lambda jpeg, _: simplejpeg.decode_jpeg(jpeg)),
             "decode_pillow": loop(pillow),
             "decode_into": loop(lambda jpeg, i: decode_into(out, jpeg, config, draws[i],
                                                             bool(i % 2)))}
    import psutil

    me = psutil.Process()

    def timed(**decoders) -> dict:
        """The loader's figures over ``batches`` batches after two, its
        decoding processes' CPU included."""
        with make_loader(shards, 0, 1, batch_size, training=True, decode="cpu", config=config,
                         seed=0, steps_per_epoch=batches + 2, **decoders) as loader:
            it = iter(loader)
            next(it), next(it)
            wall, cpu = time.perf_counter(), _cpu_seconds(me)
            for _ in range(batches):
                next(it)
            # psutil counts CPU time in clock ticks: never 0 over a short run.
            wall, cpu = time.perf_counter() - wall, max(1e-3, _cpu_seconds(me) - cpu)
            it.close()
        return {"images_per_second": batches * batch_size / wall,
                "images_per_cpu_second": batches * batch_size / cpu, "cpu_per_second": cpu / wall}

    cores = len(os.sched_getaffinity(0))
    for threads in sorted({1, max(1, cores // 4), max(1, cores // 2), cores}):
        found[f"loader_threads_{threads}"] = timed(threads=threads)
    # The same loader decoding in processes of its own (make_loader(decode_processes=N)).
    for processes in sorted({max(1, cores // 2), cores}):
        found[f"loader_processes_{processes}"] = timed(decode_processes=processes)
    found["loader_vs_decode"] = (found[f"loader_threads_{cores}"]["images_per_cpu_second"]
                                 / found["decode_simplejpeg"])
    return found


# ------------------------------------------------------------------ main

def _stack() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
             "gpus": torch.cuda.device_count(),
             "cores": len(os.sched_getaffinity(0))}
    for name in ("torch", "torchvision", "mlflow-skinny", "mlflow", "pillow", "dist_dl"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=256, help="images per step per GPU")
    parser.add_argument("--steps", type=int, default=50, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs per setup (the last one is timed)")
    parser.add_argument("--images", type=int, default=1024, help="distinct JPEGs in the shards")
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per library run")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--results", default=os.path.join(HERE, "results.json"))
    parser.add_argument("--report", default=None, help="also write every figure here (JSON)")
    parser.add_argument("--no-plain", dest="plain", action="store_false",
                        help="the library's runs only")
    parser.add_argument("--cpu", action="store_true",
                        help="check the script on a machine without GPUs: one CPU worker, "
                             "float32, no jpeg_gpu, and nothing written to --results")
    args = parser.parse_args(argv)
    setups = [s for s in args.setups.split(",") if s]
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        parser.error(f"unknown setup {unknown[0]!r}: use some of {', '.join(SETUPS)}")

    import torch

    gpus = 1 if args.cpu else torch.cuda.device_count()
    if args.cpu:
        setups = [s for s in setups if s != "jpeg_gpu"]
    elif gpus == 0:
        print("benchmarks/gpu.py needs NVIDIA GPUs, and torch sees none here", file=sys.stderr)
        return 2
    stack = _stack()
    print(f"gpu.py: {stack}", flush=True)
    folder = args.work or tempfile.mkdtemp(prefix="dist_dl-gpu-")
    started = time.perf_counter()
    rows = args.steps * args.batch_size * gpus
    shards = make_shards(folder, min(args.images, rows), rows, args.batch_size)
    print(f"gpu.py: {rows} rows of JPEGs in {time.perf_counter() - started:.0f} s", flush=True)

    checks = {"runner": check_runner(gpus, not args.cpu)}
    print(f"gpu.py: runner check {checks['runner']}", flush=True)
    figures = {}
    for setup in setups:
        runs = [("library", run_library)]
        if setup != "jpeg_gpu" and args.plain:
            runs.append(("plain", run_plain))
        for name, run in runs:
            result = run(setup, shards, folder, args, gpus)
            figures[f"{setup}.{name}"] = result
            print(f"gpu.py: {setup} {name}: {result['images_per_second']:.0f} images/s per GPU, "
                  f"{result['cpu_per_second']:.1f} CPU s/s, {result['seconds']:.0f} s in all",
                  flush=True)
    if not args.cpu:
        # Last: this process's own CUDA work stays out of the timed runs.
        checks["decode_gpu_vs_cpu"] = check_decode(shards)
        print(f"gpu.py: decode check {checks['decode_gpu_vs_cpu']}", flush=True)
    checks["loader"] = check_loader(shards, args.batch_size)
    print(f"gpu.py: loader check {checks['loader']}", flush=True)
    report = {"stack": stack, "checks": checks, "figures": figures, "batch_size": args.batch_size,
              "steps": args.steps, "epochs": args.epochs, "model": "resnet50",
              "seconds": time.perf_counter() - started}
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    if not args.cpu:
        publish(report, args.results)
    return 0


def publish(report: dict, path: str) -> None:
    """``gpu.*`` keys into the results file, its PNG redrawn (one run: each value is its own
    round)."""
    from dist_dl.app.bench import publish_results, result_entry

    figures, stack = report["figures"], report["stack"]
    extra = {**stack, "batch_size": report["batch_size"], "steps": report["steps"],
             "model": report["model"]}
    entries = {}
    for key, result in figures.items():
        entries[f"gpu.{key}"] = result_entry([result["images_per_second"]],
                                             cpu_per_second=result["cpu_per_second"], **extra)

    def ratio(name, top, bottom, goal=None):
        if top in figures and bottom in figures:
            entries[f"gpu.{name}"] = result_entry(
                [figures[top]["images_per_second"] / figures[bottom]["images_per_second"]],
                goal=goal, **extra)

    ratio("synthetic.library_vs_plain", "synthetic.library", "synthetic.plain", 0.95)
    ratio("jpeg_gpu.vs_synthetic", "jpeg_gpu.library", "synthetic.library", 0.8)
    ratio("jpeg_cpu.vs_synthetic", "jpeg_cpu.library", "synthetic.library")
    ratio("jpeg_cpu.library_vs_plain", "jpeg_cpu.library", "jpeg_cpu.plain")
    loader = report["checks"].get("loader")
    if loader:
        best = max((v for k, v in loader.items() if k.startswith("loader_threads_")),
                   key=lambda v: v["images_per_second"])
        entries["gpu.loader.images_per_second"] = result_entry(
            [best["images_per_second"]], cpu_per_second=best["cpu_per_second"], **extra)
        processes = [v for k, v in loader.items() if k.startswith("loader_processes_")]
        if processes:
            fastest = max(processes, key=lambda v: v["images_per_second"])
            entries["gpu.loader.processes.images_per_second"] = result_entry(
                [fastest["images_per_second"]], cpu_per_second=fastest["cpu_per_second"],
                **extra)
            entries["gpu.loader.processes_vs_threads"] = result_entry(
                [fastest["images_per_second"] / best["images_per_second"]], **extra)
        entries["gpu.loader.per_core"] = result_entry(
            [loader[f"loader_threads_{stack['cores']}"]["images_per_cpu_second"]], **extra)
        entries["gpu.loader.vs_decode"] = result_entry([loader["loader_vs_decode"]], goal=0.8,
                                                       **extra)
    publish_results(path, entries, own_prefixes=("gpu.",))
    print(f"gpu.py: {len(entries)} gpu.* keys into {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
