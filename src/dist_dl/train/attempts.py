"""Attempts of a training run: launch the workers, and when an attempt fails
in a way another can fix (a lost host, a timeout), retry it from the last
complete checkpoint; otherwise raise `TrainingFailed` naming the error
and where a new run can resume.

Runs on the Spark driver, for `dist_dl.train.driver.train_distributed()`.
"""
from __future__ import annotations

import dataclasses

from dist_dl.core.redact import redact_secrets
from dist_dl.tracking.target import drop_unwritten_metrics
from dist_dl.train.config import TrainConfig

__all__ = ["TrainingFailed", "resumable_epoch", "run_attempts", "last_checkpoint", "training_failed",
           "wait_for_capacity", "retriable"]

# Errors of the code or the data: another attempt would fail the same way.
_NOT_RETRIED = {"ValueError", "TypeError", "KeyError", "IndexError", "AttributeError",
                "NameError", "ImportError", "ModuleNotFoundError", "NotImplementedError",
                "AssertionError", "SyntaxError", "ZeroDivisionError", "FileNotFoundError",
                "InvalidArgumentError", "UnimplementedError",
                # The cluster's set-up (dist_dl.launch.core.worker.check_gloo_host_address).
                "LoopbackHostname"}


class TrainingFailed(RuntimeError):
    """Every attempt failed (or one failed in a way a retry cannot fix).

    Attributes:
        run_id: The MLflow run (marked FAILED).
        checkpoint: The newest complete checkpoint's folder, or None.
        checkpoint_epoch: Epochs it holds (0 if none).
        attempts: Attempts made.
    """

    def __init__(self, message: str, *, run_id: str, checkpoint: str | None,
                 checkpoint_epoch: int, attempts: int):
        super().__init__(message)
        self.run_id = run_id
        self.checkpoint = checkpoint
        self.checkpoint_epoch = checkpoint_epoch
        self.attempts = attempts


def resumable_epoch(checkpoint_dir: str, cfg: TrainConfig, key: bytes) -> int:
    """Epochs done by the newest complete checkpoint in ``checkpoint_dir``
    (0 if none): where the first attempt will start."""
    from dist_dl.train.checkpoint import CheckpointManager

    latest = CheckpointManager(checkpoint_dir, key=key).latest()
    if latest is None:
        return 0
    if latest.epoch >= cfg.epochs:
        print(f"dist_dl: {checkpoint_dir} already holds epoch {latest.epoch} of {cfg.epochs}: "
              "nothing left to train; the model is logged from that checkpoint", flush=True)
    else:
        print(f"dist_dl: resuming from {latest.path} (after epoch {latest.epoch})", flush=True)
    return latest.epoch


def run_attempts(spec, cfg: TrainConfig, backend: str, spark, client, run_id: str):
    from dist_dl.launch import JobTimeout, WorkerError

    runner, train_worker = _runner(cfg, backend, spark)
    attempt = 0
    while True:
        attempt += 1
        try:
            result = runner.run(train_worker, spec=dataclasses.replace(spec, attempt=attempt))
            client.set_tag(run_id, "dist_dl.attempts", str(attempt))
            return result, attempt
        except (WorkerError, JobTimeout) as exc:
            _keep_run_readable(spec, run_id, attempt)
            # Worker errors are text the worker chose, and may quote a
            # secret: redacted before it is stored or shown (the worker
            # redacted what its environment knows; this, the driver's).
            first_line = redact_secrets(str(exc)).splitlines()[0]
            client.set_tag(run_id, f"dist_dl.attempt_{attempt}_error", first_line[:4000])
            again = retriable(exc)
            if attempt > cfg.max_retries or not again:
                why = (f"after {attempt} attempts (max_retries={cfg.max_retries})" if again
                       else "and is not retried (an error of the code or the data fails again)")
                raise training_failed(f"training failed {why}: {first_line}.", spec, run_id,
                                       attempt) from exc
            print(f"dist_dl: attempt {attempt} failed ({first_line}); retry "
                  f"{attempt}/{cfg.max_retries} resumes from checkpoint "
                  f"{last_checkpoint(spec)[1]}", flush=True)
            if backend == "spark":
                wait_for_capacity(spark, cfg, spec, attempt, first_line, run_id)
        except BaseException:
            _keep_run_readable(spec, run_id, attempt)
            raise


def _keep_run_readable(spec, run_id: str, attempt: int) -> None:
    """After a failed attempt: the run's metric files its stopped workers
    created but did not write removed (`drop_unwritten_metrics()`), saying so."""
    try:
        dropped = drop_unwritten_metrics(spec.tracking_uri, run_id)
    except OSError as error:  # the attempt's own error is the one to raise
        print(f"dist_dl: run {run_id}'s metric files could not be checked: {error}", flush=True)
        return
    if dropped:
        print(f"dist_dl: attempt {attempt} ended with {', '.join(dropped)} of run {run_id} "
              "created but not written (a worker stopped while logging); removed, so that "
              "the run can be read", flush=True)


def _runner(cfg: TrainConfig, backend: str, spark):
    """The runner of ``cfg``'s engine on ``backend``, and its worker function."""
    from dist_dl.train.engines import engine_module

    engine = engine_module(cfg)
    return engine.runner(cfg, backend, spark), engine.train


def last_checkpoint(spec):
    """The newest complete checkpoint of the run (or None), and words for it."""
    from dist_dl.train.checkpoint import CheckpointManager

    latest = CheckpointManager(spec.checkpoint_dir, key=spec.checkpoint_key).latest()
    where = (f"{latest.path} (after epoch {latest.epoch})" if latest
             else f"none yet in {spec.checkpoint_dir}")
    return latest, where


def training_failed(text: str, spec, run_id: str, attempts: int) -> TrainingFailed:
    """``TrainingFailed`` with ``text``, then where the run can resume from."""
    latest, where = last_checkpoint(spec)
    return TrainingFailed(
        f"{text} Last complete checkpoint: {where}; a new run with "
        f"checkpoint_dir={spec.checkpoint_dir!r} resumes from it.",
        run_id=run_id, checkpoint=str(latest.path) if latest else None,
        checkpoint_epoch=latest.epoch if latest else 0, attempts=attempts)


def wait_for_capacity(spark, cfg: TrainConfig, spec, attempt: int, failure: str,
                       run_id: str) -> None:
    """Before a retry on Spark tasks, wait up to ``cfg.retry_wait`` for
    ``num_workers`` task slots.

    The failure being retried is often a lost host: Spark drops its executor
    (the standalone master after ``spark.worker.timeout``, 60 s, without a
    heartbeat) and starts a new one once the host is back. A retry that
    checked the slots at once would fail with ``NotEnoughSlots`` in that gap
    (a host cut off the network for longer than the timeout: the attempt
    fails while the executor is gone, and its slots come back with the host).
    """
    from dist_dl.launch import NotEnoughSlots
    from dist_dl.launch.core.slots import check_slots

    try:
        check_slots(spark, cfg.num_workers, cfg.retry_wait, every=15.0)
    except NotEnoughSlots as exc:
        raise training_failed(
            f"training failed: attempt {attempt} failed ({failure}) and its retry found too few "
            f"task slots within retry_wait={cfg.retry_wait:g} s: {exc}", spec, run_id,
            attempt) from exc


def retriable(exc: Exception) -> bool:
    worker_type = getattr(exc, "worker_type", None)
    return worker_type is None or worker_type not in _NOT_RETRIED
