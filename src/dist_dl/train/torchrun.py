"""The torch engine's training on one rank, under any launcher that sets
torchrun's variables: ``torchrun`` (``python -m torch.distributed.run``),
pyspark's own ``TorchDistributor``, Databricks serverless GPU
(``databricks.air.distributed``), or a job scheduler.

`train_torch_rank()` is what ``train_distributed(data, engine="torch")``
runs on each rank, callable as a plain function in every process of a job
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
set). The data is given by location (shards written by
`dist_dl.prepare.prepare_image_dataset()`), which every rank can read.
Rank 0 does what the driver of ``train_distributed`` does before it launches
the workers (plans the shards, opens the MLflow run, finds the checkpoint to
resume from), then every rank trains the same attempt: the same model as
``train_distributed`` with the same settings and data.

What the launcher owns: how many processes, where, their restarts
(``torchrun --max-restarts``: a restarted job resumes from the newest
complete checkpoint in ``checkpoint_dir``), their output. Retries,
timeouts and slot checks of ``train_distributed`` are its launcher's, not
this function's.
"""
from __future__ import annotations

import dataclasses
import os

__all__ = ["train_torch_rank", "TORCHRUN_VARS"]

# What a launcher must set in every process.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def train_torch_rank(data, validation=None, *, model=None, config=None,
                     tracking_uri: str | None = None, experiment_name: str | None = None,
                     run_name: str | None = None, registered_model_name: str | None = None,
                     **settings):
    """Train this rank's part of one torch DistributedDataParallel job.

    Args:
        data: The training shards' location (a folder or ``file:``/``dbfs:``
            URL every rank can read).
        validation: The validation shards' location, or None.
        model, config, tracking_uri, experiment_name, run_name,
            registered_model_name, settings: As ``train_distributed``'s
            (``engine`` is "torch"; ``num_workers`` is the launcher's
            ``WORLD_SIZE``; ``output_dir`` and ``checkpoint_dir`` must be
            shared by the ranks where they run on several hosts).

    Returns:
        On rank 0, the `TrainedModel`; None on
        the other ranks.

    Raises:
        RuntimeError: a torchrun variable is unset (not started by such a
            launcher).
        ValueError: a setting or input ``train_distributed`` refuses.
    """
    missing = [name for name in TORCHRUN_VARS if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            f"train_torch_rank runs in every process of a torch.distributed job, started by a "
            f"launcher that sets {', '.join(TORCHRUN_VARS)}; {', '.join(missing)} unset here. "
            f"Start it with torchrun (python -m torch.distributed.run --nproc_per_node=N "
            f"script.py), or call dist_dl.train_distributed(..., engine='torch') to launch "
            f"the workers from a driver")
    import torch.distributed as dist

    from dist_dl.train.driver import trained_model
    from dist_dl.train.engines.torch_ddp import process_group, train

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with process_group():
        shared = [None]
        if rank == 0:
            try:
                shared = [_open(data, validation, model, config, tracking_uri, experiment_name,
                                run_name, registered_model_name, settings, size)]
            except BaseException as exc:
                shared = [exc]
        dist.broadcast_object_list(shared, src=0)
        if isinstance(shared[0], BaseException):
            raise shared[0] if rank == 0 else RuntimeError(
                f"rank 0 could not start the run: {shared[0]}")
        spec = shared[0]
        if rank != 0:
            return train(spec)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(spec.tracking_uri)
        try:
            result = train(spec)
        except BaseException as exc:
            killed = isinstance(exc, KeyboardInterrupt)
            client.set_terminated(spec.run_id, "KILLED" if killed else "FAILED")
            raise
        client.set_tag(spec.run_id, "dist_dl.attempts", "1")
        client.set_terminated(spec.run_id, "FINISHED")
        return trained_model(spec, result, client, attempts=1)


def _open(data, validation, model, config, tracking_uri, experiment_name, run_name,
          registered_model_name, settings, size):
    """Rank 0: the checked settings and the attempt's spec, its run opened."""
    from dist_dl.core.locations import local_path
    from dist_dl.train.driver import _resolve_inputs, _settings, open_run

    if settings.get("engine", "torch") != "torch":
        raise ValueError(f"train_torch_rank trains with engine 'torch', got engine="
                         f"{settings['engine']!r}")
    cfg = _settings(config, {**settings, "engine": "torch"})
    cfg = dataclasses.replace(cfg, engine="torch", num_workers=size)
    builder = model if model is not None else cfg.model
    train_url, val_url, rows, _ = _resolve_inputs(data, validation, cfg, None, None)
    output_dir = local_path(cfg.output_dir, "output_dir")
    spec, _ = open_run(train_url, val_url, rows, cfg, builder, None, "torchrun", output_dir,
                       tracking_uri, experiment_name, run_name, registered_model_name)
    return spec

