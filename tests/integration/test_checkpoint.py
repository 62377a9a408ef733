"""Checkpoints: atomic publish, verification, fallback, and exact resume."""
from __future__ import annotations

import os
import sys
import warnings

import cloudpickle
import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="its tests train or load Keras models: "
                                  "TensorFlow is not installed (profile dbr-19-ml)")

from dist_dl.core import compat
from dist_dl.train.checkpoint import CheckpointManager, CorruptCheckpointWarning, UntrustedCheckpoint
from dist_dl.train.checkpoint_loop import CheckpointCallback, resume

from keras_models import tiny_classifier as _model
import keras_models


# Ship this module's worker functions (and the model they build) to Horovod
# workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(keras_models)


def _data(seed: int = 0, rows: int = 64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, rows).astype("int32")
    return x, y


def _fit(model, epochs, initial_epoch=0, callbacks=(), data_seed=0):
    x, y = _data(data_seed)
    model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=list(callbacks))


def _assert_same(a_list, b_list, **tol):
    assert len(a_list) == len(b_list)
    for a, b in zip(a_list, b_list):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol)


@pytest.mark.profile_subset_164
def test_round_trip_restores_weights_and_optimizer_slots(tmp_path):
    model = _model(seed=1)
    _fit(model, epochs=1)
    manager = CheckpointManager(tmp_path / "ckpt", keep=2)
    info = manager.save(model, epoch=1, metadata={"run_id": "abc"})
    assert info.epoch == 1 and (info.path / "MANIFEST.json").is_file()

    fresh = _model(seed=2)  # different initial weights, optimizer not built yet
    restored = manager.restore(fresh)
    assert restored.path == info.path and restored.epoch == 1
    assert restored.metadata == {"run_id": "abc"}
    _assert_same(model.get_weights(), fresh.get_weights(), rtol=0, atol=0)
    assert int(fresh.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 4
    _assert_same([v.numpy() for v in model.optimizer.variables],
                 [v.numpy() for v in fresh.optimizer.variables], rtol=0, atol=0)

    # Model only (for scoring or fine-tuning), into a model never compiled.
    keras = compat.keras()

    keras.utils.set_random_seed(5)
    bare = keras.models.clone_model(model)
    assert manager.restore(bare, include_optimizer=False).epoch == 1
    _assert_same(model.get_weights(), bare.get_weights(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="compile it first"):
        manager.restore(bare)


@pytest.mark.profile_subset_164
def test_keep_prunes_old_checkpoints_and_no_checkpoint_means_fresh_start(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    model = _model(seed=1)
    assert manager.latest() is None and manager.restore(model) is None
    assert resume(manager, model) == 0
    for epoch in (1, 2, 3):
        manager.save(model, epoch)
    assert [c.epoch for c in manager.checkpoints()] == [2, 3]
    assert manager.latest().epoch == 3


def _data_file(info):
    (name,) = [p for p in os.listdir(info.path) if p.startswith("state.data")]
    return info.path / name


def _two_epochs(manager):
    """Checkpoints of epochs 1 and 2 of one model, and epoch 1's weights."""
    model = _model(seed=1)
    _fit(model, epochs=1)
    first = manager.save(model, 1)
    expected = model.get_weights()
    _fit(model, epochs=1)
    return first, manager.save(model, 2), expected


@pytest.mark.profile_subset_164
def test_truncated_checkpoint_is_skipped_with_warning(tmp_path):
    manager = CheckpointManager(tmp_path, keep=5)
    first, second, expected = _two_epochs(manager)
    data = _data_file(second)
    with open(data, "r+b") as f:  # truncate on disk, as a crash or a full disk would
        f.truncate(data.stat().st_size // 2)

    with pytest.warns(CorruptCheckpointWarning, match=second.path.name) as caught:
        latest = manager.latest()
    assert latest.path == first.path
    assert "truncated" in str(caught[0].message)

    fresh = _model(seed=3)
    with pytest.warns(CorruptCheckpointWarning):
        assert resume(manager, fresh) == 1
    _assert_same(expected, fresh.get_weights(), rtol=0, atol=0)


@pytest.mark.profile_subset_164
def test_damaged_manifest_and_flipped_byte_are_skipped(tmp_path):
    manager = CheckpointManager(tmp_path, keep=5)
    model = _model(seed=1)
    first = manager.save(model, 1)
    second = manager.save(model, 2)
    third = manager.save(model, 3)
    (second.path / "MANIFEST.json").write_text('{"format": 1, "epo')
    data = _data_file(third)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, different content
    data.write_bytes(bytes(raw))
    with pytest.warns(CorruptCheckpointWarning) as caught:
        assert manager.latest().path == first.path
    messages = " | ".join(str(w.message) for w in caught)
    assert third.path.name in messages and "SHA-256" in messages
    assert second.path.name in messages and "unreadable" in messages


KEY = b"k" * 32


@pytest.mark.profile_subset_164
def test_signed_checkpoints_refuse_a_rewritten_manifest_and_skip_a_swapped_file(tmp_path):
    """Someone who can write the shared folder but has no key: a state file
    swapped under a signed manifest is skipped (named, with both digests)
    for the previous verified checkpoint; a manifest they rewrote to match
    their file, an unsigned one they planted, or one signed with another
    key is refused with an error (resume() raises it on every call)."""
    import json
    import shutil

    from dist_dl.core.integrity import key_id, sha256_file

    manager = CheckpointManager(tmp_path, keep=5, key=KEY)
    assert "kkkk" not in repr(manager)
    first, second, expected = _two_epochs(manager)
    manifest = json.loads((second.path / "MANIFEST.json").read_text())
    assert manifest["signature"]["key_id"] == key_id(KEY)
    assert manager.latest().path == second.path

    # A state file swapped for another run's (same format, other weights).
    other = CheckpointManager(tmp_path / "other", key=KEY).save(_model(seed=7), 2)
    planted, target = _data_file(other), _data_file(second)
    good_digest = sha256_file(target)
    target.write_bytes(planted.read_bytes())
    with pytest.warns(CorruptCheckpointWarning) as caught:
        fresh = _model(seed=3)
        assert resume(manager, fresh) == 1
    message = " | ".join(str(w.message) for w in caught
                         if issubclass(w.category, CorruptCheckpointWarning))
    assert target.name in message and good_digest in message and sha256_file(planted) in message
    _assert_same(expected, fresh.get_weights(), rtol=0, atol=0)

    # The same swap with the manifest's digests rewritten to match: refused.
    for name in manifest["files"]:
        manifest["files"][name] = {"size": (second.path / name).stat().st_size,
                                   "sha256": sha256_file(second.path / name)}
    (second.path / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(UntrustedCheckpoint, match=f"refusing checkpoint {second.path}: its "
                       "signature does not match its content"):
        resume(manager, _model(seed=3))
    shutil.rmtree(second.path)

    # A whole checkpoint planted by a writer without the key, or with another.
    for planter, why in ((CheckpointManager(tmp_path), "is not signed"),
                         (CheckpointManager(tmp_path, key=b"x" * 32),
                          f"signed with another key \\(key id {key_id(b'x' * 32)}; this run has "
                          f"{key_id(KEY)}\\): set DIST_DL_CHECKPOINT_KEY")):
        planted_ckpt = planter.save(_model(seed=7), 9)
        with pytest.raises(UntrustedCheckpoint, match=why):
            manager.latest()
        with pytest.raises(UntrustedCheckpoint, match=why):
            manager.checkpoints()
        shutil.rmtree(planted_ckpt.path)
    # A keyless reader (the library's own code always has the key) still
    # checks the digests.
    assert CheckpointManager(tmp_path).verify(first.path).epoch == 1


@pytest.mark.profile_subset_164
def test_signed_resume_after_a_crash_takes_the_latest_complete_checkpoint(tmp_path,
                                                                          monkeypatch):
    """A crashed write (a temporary folder left, or a published folder with
    no manifest, as a non-atomic rename on a FUSE mount can leave) does not
    stop a signed resume: the latest complete, verified checkpoint loads."""
    import shutil

    manager = CheckpointManager(tmp_path, key=KEY)
    model = _model(seed=1)
    _fit(model, epochs=1)
    manager.save(model, 1)
    expected = model.get_weights()
    (tmp_path / ".tmp-ckpt-000002-crashed").mkdir()
    half = manager.save(model, 2)
    (half.path / "MANIFEST.json").unlink()
    with pytest.warns(CorruptCheckpointWarning, match="no MANIFEST.json"):
        fresh = _model(seed=3)
        assert resume(manager, fresh) == 1
    _assert_same(expected, fresh.get_weights(), rtol=0, atol=0)
    shutil.rmtree(half.path)
    assert manager.save(model, 2).epoch == CheckpointManager(tmp_path, key=KEY).latest().epoch


@pytest.mark.profile_subset_164
def test_interrupted_write_is_ignored_and_cleaned_up(tmp_path, monkeypatch):
    import dist_dl.train.checkpoint as ckpt_module

    manager = CheckpointManager(tmp_path, keep=5)
    model = _model(seed=1)
    first = manager.save(model, 1)

    # What a SIGKILL'd writer leaves: a temporary directory, never renamed.
    leftover = tmp_path / ".tmp-ckpt-000002-deadbeef"
    leftover.mkdir()
    (leftover / "state.index").write_bytes(b"partial")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptCheckpointWarning)  # ignored, not "corrupt"
        assert manager.latest().path == first.path

    # A crash at the publishing rename: the save removes the stale temporary
    # first, then its own on the way out; the latest is still the first.
    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed during the rename")

    monkeypatch.setattr(ckpt_module.os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        manager.save(model, 2)
    monkeypatch.undo()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    assert manager.latest().path == first.path
    assert manager.save(model, 2).epoch == manager.latest().epoch == 2


@pytest.mark.profile_subset_164
def test_restore_into_a_different_model_names_the_problem(tmp_path):
    keras = compat.keras()

    manager = CheckpointManager(tmp_path)
    manager.save(_model(seed=1), 1)
    other = _model(seed=1)
    other.compile(keras.optimizers.SGD(0.1), "mse")  # other optimizer, other slots
    with pytest.raises(ValueError, match="does not match"):
        manager.restore(other)


def _keras3_model(seed: int, units: int = 3):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"), keras.layers.Flatten(), keras.layers.Dense(units)])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.profile_subset_164
@pytest.mark.skipif(compat.keras3_training_problem() is not None,
                    reason=str(compat.keras3_training_problem()))
def test_a_keras3_model_is_checkpointed_as_a_keras_file_and_resumes_exactly(tmp_path):
    # keras=3 training's checkpoints: model.keras (weights, BatchNormalization's
    # statistics, Adam's slots and step), published, signed and verified as
    # the tf.train.Checkpoint files are.
    key = b"k" * 32
    manager = CheckpointManager(tmp_path / "ckpt", keep=3, key=key)
    model = _keras3_model(seed=1)
    _fit(model, epochs=1)
    info = manager.save(model, 1, metadata={"run_id": "abc"})
    assert sorted(p.name for p in info.path.iterdir()) == ["MANIFEST.json", "model.keras"]
    assert compat.saved_keras_major(info.path / "model.keras") == 3

    fresh = _keras3_model(seed=2)
    assert resume(manager, fresh) == 1
    _assert_same(model.get_weights(), fresh.get_weights(), rtol=0, atol=0)
    assert int(fresh.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 4
    _assert_same([v.numpy() for v in model.optimizer.variables],
                 [v.numpy() for v in fresh.optimizer.variables], rtol=0, atol=0)
    _fit(model, epochs=2, initial_epoch=1, data_seed=1)
    _fit(fresh, epochs=2, initial_epoch=1, data_seed=1)
    _assert_same(model.get_weights(), fresh.get_weights(), rtol=0, atol=0)

    # A damaged file is skipped for the previous checkpoint, naming it.
    second = manager.save(model, 2)
    with open(second.path / "model.keras", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.warns(CorruptCheckpointWarning, match="model.keras has SHA-256"):
        assert manager.latest().path == info.path
    # Another architecture, or a Keras 2 model, is refused with the reason.
    with pytest.raises(ValueError, match="does not match"), warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptCheckpointWarning)
        manager.restore(_keras3_model(seed=1, units=5))
    with pytest.raises(ValueError, match="is a Keras 3 checkpoint.*keras=3"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptCheckpointWarning)
        manager.restore(_model(seed=1))


@pytest.mark.profile_subset_164
@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0}, "keep"),
    ({"directory": "dbfs:/tmp/x"}, "FUSE"),
])
def test_bad_arguments_name_the_parameter(tmp_path, kwargs, message):
    kwargs.setdefault("directory", tmp_path)
    with pytest.raises(ValueError, match=message):
        CheckpointManager(**kwargs)


@pytest.mark.profile_subset_164
def test_resume_equivalence_single_process(tmp_path):
    uninterrupted = _model(seed=1)
    _fit(uninterrupted, epochs=2)

    # Run 1: one epoch, checkpointed by the callback, then "stopped".
    manager = CheckpointManager(tmp_path / "run")
    first = _model(seed=1)
    callback = CheckpointCallback(manager, metadata={"attempt": 1})
    _fit(first, epochs=1, callbacks=[callback])
    assert callback.last_saved.epoch == 1
    assert "loss" in callback.last_saved.metadata["logs"]
    del first

    # Run 2: a new process would build a new model (other random init).
    resumed = _model(seed=99)
    initial_epoch = resume(manager, resumed)
    assert initial_epoch == 1
    _fit(resumed, epochs=2, initial_epoch=initial_epoch, callbacks=[CheckpointCallback(manager)])
    _assert_same(uninterrupted.get_weights(), resumed.get_weights(), rtol=1e-6, atol=1e-7)
    assert manager.latest().epoch == 2


# ----------------------------------------------------------- with Horovod

def _horovod_train(directory: str, epochs: int, seed: int, reference_epochs: int = 0):
    """Each rank trains on its own data, from its own initial weights;
    checkpoints by rank 0. Returns, gathered from every rank: the epoch it
    resumed at, its final weights, and (if ``reference_epochs``) the final
    weights of an uninterrupted, uncheckpointed run of that many epochs."""
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    keras = compat.keras()

    hvd.init()

    def train(epochs, manager=None):
        model = _model(seed=seed + hvd.rank())  # different initial weights per rank on purpose
        model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # resume() broadcasts rank 0's state before the first step, also
        # when there is no checkpoint (the reference run: an empty folder).
        initial_epoch = resume(manager or CheckpointManager(f"{directory}-empty"), model)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback()]
        if manager is not None:
            callbacks.append(CheckpointCallback(manager))
        _fit(model, epochs=epochs, initial_epoch=initial_epoch, data_seed=hvd.rank(),
             callbacks=callbacks)
        return initial_epoch, [w.tolist() for w in model.get_weights()]

    reference = train(reference_epochs)[1] if reference_epochs else None
    initial_epoch, weights = train(epochs, CheckpointManager(directory))
    return hvd_tf.allgather_object((initial_epoch, weights, reference))


@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_resume_equivalence_with_horovod(tmp_path):
    from dist_dl import HorovodRunner

    runner = HorovodRunner(np=-2)
    directory = str(tmp_path / "ckpt")
    # Job 1: the uninterrupted 2-epoch reference, then 1 epoch checkpointed ("stopped").
    first = runner.run(_horovod_train, directory=directory, epochs=1, seed=1, reference_epochs=2)
    # Job 2: new processes, new random weights, resumed from the checkpoint for epoch 2.
    resumed = runner.run(_horovod_train, directory=directory, epochs=2, seed=50)
    assert [e for e, _, _ in first] == [0, 0]
    assert [e for e, _, _ in resumed] == [1, 1]
    reference = first[0][2]
    # Every rank resumed identically and ended where the uninterrupted run did.
    for _, weights, _ in resumed:
        _assert_same(reference, weights, rtol=1e-6, atol=1e-7)
    assert CheckpointManager(directory).latest().epoch == 2
