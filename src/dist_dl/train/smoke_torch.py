"""A small CNN trained with PyTorch DistributedDataParallel on image shards:
the worker function of the TorchDistributor notebook, and the pattern for
your own torch code on the library's runner and reader.

Runs inside each worker (started by ``dist_dl.TorchDistributor``, which sets
torchrun's variables: ``init_process_group`` reads them).
"""
from __future__ import annotations

import time

__all__ = ["train_small_cnn_torch"]


def _small_cnn(classes: int, config):
    """Normalisation on the device (the loader's images are uint8), two
    convolution blocks, pooling to 4 x 4 (where a digit's strokes are still
    apart), a linear classifier."""
    from torch import nn

    from dist_dl.read import Normalize

    return nn.Sequential(
        Normalize(config),
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64 * 16, classes))


def train_small_cnn_torch(train_url: str, validation_url: str, *, epochs: int = 4,
                          batch_size: int = 32, image_size: int = 32,
                          learning_rate: float = 0.002, seed: int = 0) -> dict:
    """Train a small CNN data-parallel on the shards at ``train_url``; return
    (on every rank) each epoch's training loss and exact validation accuracy.

    Every rank reads its own part of the shards (``dist_dl.read.make_loader``:
    the same number of steps on each, every validation row once across the
    ranks, padding rows weighted 0); ``DistributedDataParallel`` averages the
    gradients; Adam's learning rate is scaled by the number of processes (the
    global batch grows with them). Digits-style data: no flip, crops keep at
    least 60 % of the image.
    """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from dist_dl.prepare import load_label_index
    from dist_dl.read import ReaderConfig, make_loader

    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
        config = ReaderConfig(image_size=image_size, flip=False, area_range=(0.6, 1.0),
                              reader="arrow")
        classes = len(load_label_index(train_url))
        torch.manual_seed(seed)  # the same start everywhere (DDP also broadcasts rank 0's)
        model = DistributedDataParallel(_small_cnn(classes, config).to(device),
                                        device_ids=[device.index] if gpu else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate * world)
        train = make_loader(train_url, rank, world, batch_size, training=True, config=config,
                            seed=seed)
        validation = make_loader(validation_url, rank, world, batch_size, training=False,
                                 config=config, with_weights=True)
        loss_fn = nn.CrossEntropyLoss()
        history = {"loss": [], "val_accuracy": []}
        started, images = time.perf_counter(), 0
        for _ in range(epochs):
            model.train()
            total = torch.zeros(2, device=device)  # loss sum, batches
            for x, y in train:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                total += torch.stack([loss.detach(), torch.ones((), device=device)])
                images += len(y)
            model.eval()
            counts = torch.zeros(2, device=device)  # right, rows (padding weighs 0)
            with torch.no_grad():
                for x, y, w in validation:
                    x, y, w = x.to(device), y.to(device), w.to(device)
                    right = (model(x).argmax(1) == y).float()
                    counts += torch.stack([(right * w).sum(), w.sum()])
            for tensor in (total, counts):
                dist.all_reduce(tensor)
            history["loss"].append(float(total[0] / total[1]))
            history["val_accuracy"].append(float(counts[0] / counts[1]))
        seconds = time.perf_counter() - started
        return {"history": history, "validation_rows": int(counts[1]), "num_workers": world,
                "images_per_second": images * world / seconds, "seconds": seconds}
    finally:
        dist.destroy_process_group()
