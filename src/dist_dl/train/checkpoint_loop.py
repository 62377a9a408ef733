"""Checkpoints in the training loop: `resume()` before ``model.fit``,
`CheckpointCallback` at the end of each epoch, and `save_as_peer()`
on the tf.distribute workers that do not write.

Runs inside each worker; the format and the manager are in
`dist_dl.train.checkpoint`, which also says why rank 0 alone restores
and broadcasts under Horovod.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

from dist_dl.core import compat
from dist_dl.core.lazy import lazy_attributes
from dist_dl.core.placement import horovod_if_initialized, process_rank
from dist_dl.train.checkpoint import (CheckpointInfo, CheckpointManager, build_optimizer,
                                      optimizer_of, write_state)

__all__ = ["resume", "CheckpointCallback", "save_as_peer"]


def resume(manager: CheckpointManager, model, *, optimizer=None, broadcast: bool | None = None,
           include_optimizer: bool = True) -> int:
    """Restore the latest checkpoint (if any) before ``model.fit``; returns the
    ``initial_epoch`` to pass to it (0 when starting fresh).

    Call it on every rank, after ``hvd.init()`` and ``model.compile``.

    Args:
        manager: Where the checkpoints are.
        model: The compiled model.
        optimizer: Default ``model.optimizer``.
        broadcast: Restore on Horovod rank 0 only and broadcast the epoch and
            every model and optimizer variable from it (so only rank 0 needs to
            see the directory); with no checkpoint, rank 0's initial state is
            broadcast, so every rank starts identical. Default: when Horovod is
            initialised with more than one rank.
        include_optimizer: Restore the optimizer's state too.
    """
    hvd = horovod_if_initialized()
    if broadcast is None:
        broadcast = hvd is not None and hvd.size() > 1
    if not broadcast:
        info = manager.restore(model, optimizer=optimizer, include_optimizer=include_optimizer)
        return 0 if info is None else info.epoch
    if hvd is None:
        raise ValueError("broadcast=True needs Horovod initialised (call hvd.init() first)")
    info = None
    error = None
    if hvd.rank() == 0:
        try:
            info = manager.restore(model, optimizer=optimizer, include_optimizer=include_optimizer)
        except Exception as exc:  # tell the other ranks, instead of leaving them waiting
            error = exc
    epoch, message = hvd.broadcast_object(
        (None if info is None else info.epoch, None if error is None else str(error)), root_rank=0)
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"rank 0 could not restore the checkpoint: {message}")
    # Broadcast also when starting fresh: every rank then takes its first
    # step from rank 0's initial weights, as one worker would.
    variables = list(model.variables)
    opt = optimizer_of(model, optimizer) if include_optimizer else None
    if opt is not None:
        build_optimizer(opt, model)
        variables += list(opt.variables)
    hvd.broadcast_variables(variables, root_rank=0)
    return 0 if epoch is None else int(epoch)


def _define_checkpoint_callback():
    keras = compat.keras()

    from dist_dl.tracking.metrics import numeric_logs

    class CheckpointCallback(keras.callbacks.Callback):
        """Keras callback: save a checkpoint at the end of every epoch (``every``).

        Only the writer saves (default: Horovod rank 0, or the only process).
        Restoring is not a callback's job, since ``model.fit`` must already know
        ``initial_epoch``: call `resume()` before ``fit``. List it after
        Horovod's ``MetricAverageCallback`` so that the metrics it stores are the
        averaged ones.

        Args:
            manager: Where to save.
            every: Save every this many epochs (default 1); the last epoch of
                ``fit`` is always saved.
            writer: Whether this process writes; default rank 0.
            metadata: Extra JSON values stored with every checkpoint (the epoch's
                metrics are stored under ``"logs"``).
            include_optimizer: Save the optimizer's state (default True).
            peers: Under tf.distribute's ``MultiWorkerMirroredStrategy``, give
                every worker this callback with ``peers=True``: a save reads
                the variables synchronised on read (BatchNormalization's
                moving statistics), each read an all-reduce that every worker
                must join (TensorFlow's multi-worker guide: all workers save,
                the others to a temporary place). The workers that do not
                write save the same state to a temporary local folder,
                removed at once (`save_as_peer()`).

        Attributes:
            last_saved: The checkpoint this callback published last, or None.
        """

        def __init__(self, manager: CheckpointManager, *, every: int = 1, writer: bool | None = None,
                     metadata: Mapping[str, Any] | None = None, include_optimizer: bool = True,
                     peers: bool = False):
            super().__init__()
            if not isinstance(manager, CheckpointManager):
                raise ValueError(f"manager must be a CheckpointManager, got {type(manager).__name__}")
            if not isinstance(every, int) or every < 1:
                raise ValueError(f"every must be an int >= 1, got {every!r}")
            if writer is None:
                writer = process_rank() == 0
            self.manager = manager
            self.every = every
            self.writer = writer
            self.extra_metadata = dict(metadata or {})
            self.include_optimizer = include_optimizer
            self.peers = peers
            self.last_saved: CheckpointInfo | None = None
            self._epochs = None

        def on_train_begin(self, logs=None):
            self._epochs = self.params.get("epochs") if self.params else None

        def on_epoch_end(self, epoch, logs=None):
            completed = epoch + 1
            if completed % self.every and completed != self._epochs:
                return
            if not self.writer:
                if self.peers:
                    save_as_peer(self.model, include_optimizer=self.include_optimizer)
                return
            metrics = numeric_logs(logs)
            self.last_saved = self.manager.save(
                self.model, completed, include_optimizer=self.include_optimizer,
                metadata={**self.extra_metadata, "logs": metrics})

    CheckpointCallback.__module__ = __name__
    CheckpointCallback.__qualname__ = "CheckpointCallback"
    return CheckpointCallback


def save_as_peer(model, *, optimizer=None, include_optimizer: bool = True) -> None:
    """The part of `CheckpointManager.save()` that reads the state, on a
    tf.distribute worker that does not write: the same variables read in the
    same order (joining the writer's all-reduces), written to a temporary
    local folder (in the job's folder where a launcher of this library started
    the worker) that is removed at once."""
    from dist_dl.launch.core.worker import job_folder

    optimizer = optimizer_of(model, optimizer) if include_optimizer else None
    if optimizer is not None:
        build_optimizer(optimizer, model)
    # In the job's folder: a worker killed mid-write (a cancelled job) leaves
    # nothing behind once its launcher removes that folder.
    with tempfile.TemporaryDirectory(prefix="dist_dl-peer-checkpoint-", dir=job_folder()) as tmp:
        write_state(Path(tmp), model, optimizer)


# CheckpointCallback subclasses a Keras class: defined on first use (see dist_dl.core.lazy).
__getattr__ = lazy_attributes(globals(), CheckpointCallback=_define_checkpoint_callback)
