"""Atomic, verified per-epoch checkpoints of a model and its optimizer (Keras or torch).

Runs inside each worker. One process writes (Horovod rank 0); any process can
read. The format, in ``directory``::

    ckpt-000003-<ns>/            one published checkpoint (3 epochs completed)
        state.index              tf.train.Checkpoint(model=..., optimizer=...)
        state.data-00000-of-00001
        MANIFEST.json            written last: epoch, metadata, and every
                                 file above with its size and SHA-256;
                                 with a key, an HMAC of all that
    .tmp-ckpt-000004-<uuid>/     a write in progress (or one a crash left)

The torch engine (``engine="torch"``) saves one ``state.pt`` instead
(`CheckpointManager.save_torch()`: the model's, optimizer's and gradient
scaler's state dicts and the step, ``torch.save``), published, verified and
signed in the same way, and read back with ``torch.load(weights_only=True)``.

A Keras 3 model (``train_distributed(..., keras=3)``) is saved in Keras 3's
own ``.keras`` format instead of the two ``state`` files: ``model.keras``
(``model.save``: architecture, weights and the compiled optimizer's state),
published, verified and signed in the same way, and restored into the
model (and its optimizer) with ``model.load_weights``, which also refuses
a file whose variables do not match.

Why ``tf.train.Checkpoint`` rather than ``model.save_weights`` plus a copy of
the optimizer's variables: it saves both in one consistent write, matches the
model's variables by their place in the object graph (model -> layer ->
kernel), not by their names (which Keras numbers per process), and checks that
every variable was restored. A model rebuilt by the same builder in a new
process, a Horovod ``DistributedOptimizer`` wrapping the same optimizer, and a
learning-rate schedule driven by ``optimizer.iterations`` all restore exactly.
(Keras 2.15's optimizer tracks its slots as one list in the order of
``model.trainable_variables``, so the same builder must build the model; a
different optimizer or architecture is reported as a mismatch.)

How a checkpoint is published, so that a crash never leaves a partial one as
the latest: everything is written into a hidden temporary directory, each file
is fsynced, the manifest is written and fsynced last, and only then is the
directory renamed to its final name (one atomic ``rename`` on a POSIX file
system) and the parent directory fsynced. A reader also never trusts the name
alone: a checkpoint counts only if its manifest parses and every file's size
and SHA-256 match, so a file truncated or damaged after publishing (or a
non-atomic rename on a FUSE mount such as ``/dbfs``) is skipped, with a
warning that names it, in favour of the previous complete one.

Who may have written it: the checkpoint directory is shared storage, which
others can write too. With a ``key`` (``train_distributed`` always passes
one, see `dist_dl.core.integrity.checkpoint_key()`; it is never stored in
the directory) the writer signs the manifest with an HMAC-SHA256 and a
reader refuses, with `UntrustedCheckpoint`, any published checkpoint
whose manifest is unsigned or signed with another key: only someone without
the key writes such a manifest, so it is an error to look into, not damage to
step over (stepping over it silently would also let a planted checkpoint
roll a run back). A file that does not match the digest in a correctly
signed manifest is handled like damage: skipped with a warning naming the
file and both digests, in favour of the previous checkpoint, which is itself
verified under the key. Bytes a run did not write are never restored.

Resuming under Horovod (see `dist_dl.train.checkpoint_loop.resume()`): rank 0 alone picks
and verifies the latest checkpoint and restores it, then broadcasts the epoch
and every model and optimizer variable to the other ranks *before* training
starts. So the checkpoint directory need only be readable by rank 0, all ranks
agree on the same checkpoint even if one is published meanwhile, and the first
step after resuming is already exact (Horovod's
``BroadcastGlobalVariablesCallback`` broadcasts only after the first batch,
which would average in gradients computed from the other ranks' stale weights).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dist_dl.core import compat
from dist_dl.core.integrity import KEY_ENV, key_id, sha256_file, sign, signature_matches

__all__ = ["CheckpointInfo", "CheckpointManager", "CorruptCheckpointWarning", "UntrustedCheckpoint"]

_log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
_SIGNATURE = "signature"
FORMAT_VERSION = 1
_STATE_PREFIX = "state"
KERAS_STATE = "model.keras"  # a Keras 3 model's checkpoint (see the module's notes)
TORCH_STATE = "state.pt"  # the torch engine's checkpoint (CheckpointManager.save_torch)
_NAME = re.compile(r"^ckpt-(\d{6,})-(\d+)$")
_TMP_PREFIX = ".tmp-ckpt-"


class CorruptCheckpointWarning(UserWarning):
    """A published checkpoint failed verification and was skipped."""


class UntrustedCheckpoint(ValueError):
    """A published checkpoint whose manifest is not signed with the reader's
    key: refused, never skipped (see the module's notes)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One published, verified checkpoint.

    Attributes:
        path: Its directory.
        epoch: Number of epochs completed when it was written; pass it as
            ``initial_epoch`` to ``model.fit`` to continue after it.
        metadata: What the writer stored with it (JSON values).
        has_optimizer: Whether the optimizer's state is in it.
    """

    path: Path
    epoch: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
    has_optimizer: bool = True

    def __post_init__(self):
        if self.epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {self.epoch}")


class CheckpointManager:
    """Writes, finds, verifies, restores and prunes checkpoints in one directory.

    Only one process may write to a directory at a time (in a Horovod job,
    rank 0); any number may read.

    Args:
        directory: Where checkpoints live; created if missing. A local or
            FUSE-mounted path (on Databricks ``/dbfs/...`` or ``/Volumes/...``),
            not a URI.
        keep: How many of the newest checkpoints to keep after each save
            (default 3). Older ones, and temporary directories left by a crashed
            write, are deleted by the next save.
        key: Sign manifests with it when saving, and accept only checkpoints
            signed with it when reading. Keep it out of ``directory`` (a
            secret, or the driver's own disk). None: unsigned manifests,
            which catch damage but not someone who rewrites the manifest too.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, key: bytes | None = None):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be an int >= 1 (how many checkpoints to keep), got {keep!r}")
        text = os.fspath(directory)
        if "://" in text or text.startswith("dbfs:"):
            raise ValueError(f"directory must be a file system path, got the URI {text!r}; "
                             "on Databricks use the FUSE path (/dbfs/... or /Volumes/...)")
        if key is not None and (not isinstance(key, bytes) or len(key) < 16):
            raise ValueError("key must be bytes, at least 16 of them (a random secret)")
        self.directory = Path(text)
        self.keep = keep
        self._key = key  # never in repr, messages or files

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.directory)!r}, keep={self.keep})"

    # ---------------------------------------------------------------- writing

    def save(self, model, epoch: int, *, optimizer=None, include_optimizer: bool = True,
             metadata: Mapping[str, Any] | None = None) -> CheckpointInfo:
        """Write a checkpoint of ``model`` (and its optimizer) and publish it atomically.

        Args:
            model: A Keras model.
            epoch: Number of epochs completed (the ``initial_epoch`` to resume at).
            optimizer: The optimizer to save; default ``model.optimizer``.
            include_optimizer: Save the optimizer's state too (default True).
                Needed to resume training identically.
            metadata: JSON-serialisable values stored in the manifest (for
                example the epoch's metrics or the MLflow run id).

        Returns:
            The published checkpoint.
        """
        metadata = _checked(epoch, metadata)
        optimizer = optimizer_of(model, optimizer) if include_optimizer else None

        if optimizer is not None:
            # Before the first step Keras has not created the slots yet; make
            # them now so that every checkpoint holds the full optimizer state.
            build_optimizer(optimizer, model)
        return self._publish(epoch, metadata, lambda tmp: write_state(tmp, model, optimizer),
                             has_optimizer=optimizer is not None)

    def save_torch(self, state: Mapping[str, Any], epoch: int, *,
                   metadata: Mapping[str, Any] | None = None) -> CheckpointInfo:
        """Write a torch engine's checkpoint and publish it as `save()` does.

        Args:
            state: What to restore: state dicts (model, optimizer, gradient
                scaler) and plain values, saved with ``torch.save`` as
                ``state.pt`` (loaded back with ``weights_only=True``: tensors,
                numbers, strings, lists and dicts only).
            epoch: Number of epochs completed.
            metadata: JSON-serialisable values stored in the manifest.
        """
        import torch

        metadata = _checked(epoch, metadata)
        return self._publish(epoch, metadata,
                             lambda tmp: torch.save(dict(state), tmp / TORCH_STATE),
                             has_optimizer="optimizer" in state)

    def read_torch(self, checkpoint: CheckpointInfo | str | os.PathLike,
                   map_location="cpu") -> dict:
        """The ``state`` a `save_torch()` checkpoint (its info or its
        folder) holds, verified first.

        Raises:
            ValueError: the checkpoint is not a torch engine's, or fails
                verification (see `verify()`).
        """
        import torch

        info = self.verify(getattr(checkpoint, "path", checkpoint))
        path = info.path / TORCH_STATE
        if not path.is_file():
            raise ValueError(f"checkpoint {info.path} was written by a TensorFlow engine, not the "
                             "torch engine: resume it with the engine that wrote it, or train "
                             "into another checkpoint_dir")
        return torch.load(path, map_location=map_location, weights_only=True)

    def _publish(self, epoch: int, metadata: dict, write, *, has_optimizer: bool) -> CheckpointInfo:
        """Run ``write(folder)`` into a temporary folder, then publish it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()
        tmp = self.directory / f"{_TMP_PREFIX}{epoch:06d}-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            write(tmp)
            files = {}
            for path in sorted(tmp.iterdir()):
                _fsync_file(path)
                files[path.name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
            manifest = {"format": FORMAT_VERSION, "epoch": epoch, "has_optimizer": has_optimizer,
                        "created": time.time(), "metadata": metadata, "files": files}
            if self._key is not None:
                manifest[_SIGNATURE] = {"key_id": key_id(self._key),
                                        "hmac": sign(self._key, manifest)}
            with open(tmp / MANIFEST, "w") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            final = self.directory / f"ckpt-{epoch:06d}-{time.time_ns()}"
            os.rename(tmp, final)
            _fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _log.info("checkpoint of epoch %d published at %s", epoch, final)
        self._prune(keep_path=final)
        return CheckpointInfo(final, epoch, metadata, has_optimizer)

    def _remove_stale_temporaries(self) -> None:
        # Only one writer per directory, so any temporary here is from a write
        # that crashed: it was never published, and nothing reads it.
        for path in self.directory.glob(f"{_TMP_PREFIX}*"):
            _log.warning("removing %s, left by an interrupted checkpoint write", path)
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self, keep_path: Path) -> None:
        published = self._published()
        for path, _ in published[:-self.keep]:
            if path != keep_path:
                _log.info("removing old checkpoint %s (keep=%d)", path, self.keep)
                shutil.rmtree(path, ignore_errors=True)

    # ---------------------------------------------------------------- reading

    def _published(self) -> list[tuple[Path, int]]:
        """Published checkpoint directories, oldest first (by epoch, then by
        publishing time: a re-trained epoch replaces an older one)."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), int(match.group(2)), path))
        found.sort()
        return [(path, epoch) for epoch, _, path in found]

    def verify(self, path: str | os.PathLike) -> CheckpointInfo:
        """Check one checkpoint directory against its manifest.

        Returns:
            Its description.

        Raises:
            UntrustedCheckpoint: With a key, a manifest not signed with it.
            ValueError: Naming the checkpoint and what is wrong with it
                (for a file: both digests).
        """
        path = Path(path)
        try:
            with open(path / MANIFEST) as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"checkpoint {path} has no {MANIFEST}") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"checkpoint {path} has an unreadable {MANIFEST}: {exc}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
            raise ValueError(f"checkpoint {path}: {MANIFEST} is not format {FORMAT_VERSION}")
        if self._key is not None:
            self._check_signature(path, manifest)
        files = manifest.get("files") or {}
        if not any(name.startswith(_STATE_PREFIX + ".index") or name in (KERAS_STATE, TORCH_STATE)
                   for name in files):
            raise ValueError(f"checkpoint {path}: {MANIFEST} lists no state files")
        for name, expected in sorted(files.items()):
            file = path / name
            if not file.is_file():
                raise ValueError(f"checkpoint {path}: {name} is missing")
            size, found = file.stat().st_size, sha256_file(file)
            if size != expected["size"]:
                raise ValueError(f"checkpoint {path}: {name} has {size} bytes (SHA-256 {found}), "
                                 f"the manifest recorded {expected['size']} bytes (SHA-256 "
                                 f"{expected['sha256']}): truncated or replaced?")
            if found != expected["sha256"]:
                raise ValueError(f"checkpoint {path}: {name} has SHA-256 {found}, the manifest "
                                 f"recorded {expected['sha256']} (damaged or replaced)")
        return CheckpointInfo(path, int(manifest["epoch"]), manifest.get("metadata") or {},
                              bool(manifest.get("has_optimizer", True)))

    def _check_signature(self, path: Path, manifest: dict) -> None:
        signature = manifest.pop(_SIGNATURE, None)
        mine = key_id(self._key)
        if not isinstance(signature, dict):
            raise UntrustedCheckpoint(
                f"refusing checkpoint {path}: its {MANIFEST} is not signed, and this run only "
                f"loads checkpoints signed with its key (key id {mine}). A run of dist_dl signs "
                "every checkpoint it writes, so it was written by something else (or by a "
                "version before signing); remove it, or train into another checkpoint_dir")
        if not signature_matches(self._key, manifest, signature.get("hmac")):
            theirs = signature.get("key_id")
            why = (f"it is signed with another key (key id {theirs}; this run has {mine}): set "
                   f"{KEY_ENV} to the key of the run that wrote it to resume from it"
                   if theirs != mine else
                   f"its signature does not match its content under this run's key (key id "
                   f"{mine}): the manifest was changed after it was written")
            raise UntrustedCheckpoint(f"refusing checkpoint {path}: {why}; or remove it, or "
                                      "train into another checkpoint_dir")

    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint that verifies, or None if there is none.

        Every newer checkpoint that fails verification is skipped with a
        `CorruptCheckpointWarning` (also logged) naming it and the reason.
        Temporary directories of unfinished writes are never considered.

        Raises:
            UntrustedCheckpoint: The newest one is not signed with the key.
        """
        for path, _ in reversed(self._published()):
            try:
                return self.verify(path)
            except UntrustedCheckpoint:
                raise
            except ValueError as exc:
                message = f"skipping corrupt checkpoint {path}: {exc}; falling back to an older one"
                _log.warning(message)
                warnings.warn(message, CorruptCheckpointWarning, stacklevel=2)
        return None

    def checkpoints(self) -> list[CheckpointInfo]:
        """Every published checkpoint that verifies, oldest first (skipping
        corrupt ones with a warning, as `latest()` does)."""
        result = []
        for path, _ in self._published():
            try:
                result.append(self.verify(path))
            except UntrustedCheckpoint:
                raise
            except ValueError as exc:
                message = f"skipping corrupt checkpoint {path}: {exc}"
                _log.warning(message)
                warnings.warn(message, CorruptCheckpointWarning, stacklevel=2)
        return result

    def restore(self, model, *, optimizer=None, checkpoint: CheckpointInfo | None = None,
                include_optimizer: bool = True) -> CheckpointInfo | None:
        """Restore ``model`` (and its optimizer) from a checkpoint.

        Args:
            model: A Keras model built like the one that was saved (same
                builder); compiled, if the optimizer is to be restored.
            optimizer: Default ``model.optimizer``.
            checkpoint: Which one; default `latest()`.
            include_optimizer: Restore the optimizer's state too (default True).
                The optimizer's variables are created first (``build``), so
                its slots and iteration count are restored now, not lazily.

        Returns:
            The checkpoint restored, or None (model untouched) if there is none.

        Raises:
            ValueError: The checkpoint does not match the model or optimizer.
                Some variables may have been overwritten by then: build the
                model again before using it.
        """
        info = checkpoint if checkpoint is not None else self.latest()
        if info is None:
            return None
        # Said first, also where TensorFlow is not installed.
        if (info.path / TORCH_STATE).is_file():
            raise ValueError(f"checkpoint {info.path} was written by the torch engine: resume "
                             "it with engine='torch', or train into another checkpoint_dir")
        import tensorflow as tf

        optimizer = optimizer_of(model, optimizer) if include_optimizer else None
        if optimizer is not None and not info.has_optimizer:
            raise ValueError(f"checkpoint {info.path} holds no optimizer state; "
                             "pass include_optimizer=False to restore the model only")
        if optimizer is not None:
            build_optimizer(optimizer, model)
        try:
            if (info.path / KERAS_STATE).is_file():
                _read_keras3_state(info.path / KERAS_STATE, model, optimizer)
            else:
                status = tf.train.Checkpoint(**_trackables(model, optimizer)).read(
                    str(info.path / _STATE_PREFIX))
                if optimizer is not None:
                    status.assert_consumed()
                else:
                    status.expect_partial().assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            # A variable of another shape fails in read(); a missing or extra
            # one in the assertion.
            raise ValueError(f"checkpoint {info.path} does not match this model/optimizer "
                             f"(built by a different builder or compiled with another optimizer?): "
                             f"{exc}") from None
        _log.info("restored checkpoint %s (epoch %d)", info.path, info.epoch)
        return info


def _checked(epoch, metadata) -> dict:
    """``metadata`` as a dict, once ``epoch`` and ``metadata`` are checked."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0 (epochs completed), got {epoch!r}")
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata)
    except TypeError as exc:
        raise ValueError(f"metadata must be JSON-serialisable: {exc}") from None
    return metadata


def write_state(folder: Path, model, optimizer) -> None:
    """The model's (and optimizer's) state into ``folder``: ``model.keras``
    for a Keras 3 model, else a ``tf.train.Checkpoint``'s files."""
    if compat.is_keras3_model(model):
        _keras3_optimizer(model, optimizer)
        model.save(str(folder / KERAS_STATE))
        return
    import tensorflow as tf

    tf.train.Checkpoint(**_trackables(model, optimizer)).write(str(folder / _STATE_PREFIX))


def _keras3_optimizer(model, optimizer) -> None:
    # model.save and load_weights handle the optimizer the model was compiled
    # with, and no other.
    if optimizer is not None and optimizer is not getattr(model, "optimizer", None):
        raise ValueError("a Keras 3 model's checkpoint (model.keras) holds the optimizer the "
                         "model was compiled with: compile it with this optimizer "
                         "(model.compile(optimizer=...)) instead of passing optimizer=")


def _read_keras3_state(path: Path, model, optimizer) -> None:
    """Restore a Keras 3 model (and the optimizer it was compiled with, if
    ``optimizer``) from a ``model.keras`` checkpoint."""
    if not compat.is_keras3_model(model):
        raise ValueError(f"{path} is a Keras 3 checkpoint and the model is not a Keras 3 model "
                         f"({type(model).__module__}.{type(model).__name__}): train with "
                         "keras=3, or resume into another checkpoint_dir")
    _keras3_optimizer(model, optimizer)
    if optimizer is None and getattr(model, "optimizer", None) is not None:
        raise ValueError("include_optimizer=False: restoring a Keras 3 checkpoint into a "
                         "compiled model also restores its optimizer; restore into the model "
                         "before compiling it")
    model.load_weights(str(path))


def optimizer_of(model, optimizer):
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError("the model has no optimizer: compile it first, pass optimizer=..., "
                         "or include_optimizer=False to save/restore the model only")
    return optimizer


def _trackables(model, optimizer) -> dict:
    return {"model": model} if optimizer is None else {"model": model, "optimizer": optimizer}


def build_optimizer(optimizer, model) -> None:
    """Create the optimizer's slot variables now (Keras creates them lazily at
    the first step), so that reading a checkpoint fills them at once and
    ``assert_consumed`` can check them."""
    if hasattr(optimizer, "_create_all_weights"):  # keras.optimizers.legacy.*
        optimizer._create_all_weights(model.trainable_variables)
    else:
        optimizer.build(model.trainable_variables)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes the directory entries (the files' names, the rename) durable. Not
    # every file system allows it (some FUSE mounts); the manifest check
    # still guards the reader there.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
