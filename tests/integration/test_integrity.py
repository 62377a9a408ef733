"""Nothing the library loads from shared storage runs unless the run that
wrote it recorded its digest: ensemble members swapped for a pickle that
would write a canary file are refused, and the canary is never written."""
from __future__ import annotations

import functools
import os
import pickle
import cloudpickle
import numpy as np
import pandas as pd
import pytest

import train_hooks
from dist_dl.core.integrity import IntegrityError, KEY_ENV, sha256_bytes


cloudpickle.register_pickle_by_value(train_hooks)


class _Canary:
    """Unpickling this writes ``path``: what a planted member would do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('unpickled')",))


def _evil_pickle(canary) -> bytes:
    blob = pickle.dumps(_Canary(canary))
    # The test can fail: this pickle does write the canary when loaded.
    control = f"{canary}-control"
    pickle.loads(pickle.dumps(_Canary(control)))
    assert os.path.exists(control)
    os.remove(control)
    return blob


def _members(tmp_path, count=2):
    from sklearn.tree import DecisionTreeClassifier

    x = np.arange(40, dtype=float).reshape(20, 2)
    members = []
    for i in range(count):
        blob = pickle.dumps(DecisionTreeClassifier(random_state=i).fit(x, np.arange(20) % 2))
        path = tmp_path / f"member-{i}-task-{i}.pkl"
        path.write_bytes(blob)
        members.append((str(path), sha256_bytes(blob)))
    return tuple(members)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_swapped_member_is_refused_on_the_executors(spark, tmp_path, scenario):
    from dist_dl.ensemble import task

    s = scenario("S12a local", "ensemble member swapped in the shared folder",
                 "two members written with their SHA-256 (as the training tasks record "
                 "them); one file replaced by a pickle that would write a canary file; "
                 "scoring tasks on the executors load the members",
                 "the executors refuse the file with an error naming it and both digests; "
                 "the canary is never written")

    members = _members(tmp_path)
    df = spark.createDataFrame([(float(i), float(i + 1), i % 2) for i in range(20)],
                               "a double, b double, label long")
    fn = functools.partial(task.score_partition, members=members, classes=[0, 1],
                           feature_cols=["a", "b"], label_col="label", method="vote")
    assert sum(r.rows for r in df.mapInPandas(fn, task.SCORE_SCHEMA).collect()) == 20

    canary = tmp_path / "canary"
    evil = _evil_pickle(canary)
    path, digest = members[1]
    with open(path, "wb") as f:  # someone with write access to the shared folder
        f.write(evil)
    fn = functools.partial(task.score_partition, members=members, classes=[0, 1],
                           feature_cols=["a", "b"], label_col="label", method="mean")
    with pytest.raises(Exception) as info:
        df.mapInPandas(fn, task.SCORE_SCHEMA).collect()
    message = str(info.value)
    assert (f"refusing to load ensemble member 1 {path}: its SHA-256 is {sha256_bytes(evil)}, "
            f"but the run that wrote it recorded {digest}") in message
    assert not canary.exists()
    s.figure("refused on the executor, naming the file and both digests; no canary")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_member_swapped_in_the_logged_model_is_refused(spark, tmp_path, scenario):
    from dist_dl.ensemble import train_ensemble

    s = scenario("S12b local", "ensemble member swapped in the logged MLflow model",
                 "train_ensemble(num_models=2); one member file inside the logged model "
                 "replaced by a pickle that would write a canary file; the model predicts",
                 "refused with an error naming the file and its digest (checked against "
                 "the digests the model records); the canary is never written")

    def tree(member):
        from sklearn.tree import DecisionTreeClassifier

        return DecisionTreeClassifier(max_depth=3, random_state=member)

    rng = np.random.default_rng(0)
    pdf = pd.DataFrame(rng.normal(size=(200, 2)), columns=["a", "b"])
    pdf["label"] = (pdf["a"] > 0).astype("int64")
    ens = train_ensemble(spark.createDataFrame(pdf), tree, num_models=2, feature_cols=["a", "b"],
                         label_col="label", output_dir=str(tmp_path / "out"),
                         tracking_uri=(tmp_path / "mlruns").as_uri())
    from pathlib import Path

    from mlflow.utils.file_utils import local_file_uri_to_path

    member_files = sorted(Path(local_file_uri_to_path(ens.model_uri)).rglob("member-*.pkl"))
    assert len(member_files) == 2
    target = str(member_files[0])
    canary = tmp_path / "canary"
    evil = _evil_pickle(canary)
    with open(target, "wb") as f:
        f.write(evil)
    with pytest.raises(IntegrityError, match=f"refusing to load ensemble member 0 {target}: "
                       f"its SHA-256 is {sha256_bytes(evil)}"):
        ens.predict(pdf)
    assert not canary.exists()
    s.figure("refused before unpickling, naming the file and its digest; no canary")


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.needs("tensorflow")
def test_train_distributed_refuses_a_rewritten_checkpoint_and_resumes_from_a_signed_one(
        tmp_path, monkeypatch, scenario):
    """End to end: a run's checkpoints are signed with the driver's key; a
    manifest rewritten in the shared folder stops the next run before any
    worker starts (its MLflow run marked FAILED); with that checkpoint gone,
    the next run resumes from the previous signed one."""
    import json
    import shutil

    from mlflow.tracking import MlflowClient

    from dist_dl import train_distributed
    from dist_dl.core.integrity import key_id, sha256_file
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.train.checkpoint import UntrustedCheckpoint

    s = scenario("S12c local", "checkpoint rewritten in the shared folder",
                 "train_distributed(epochs=2) signs its checkpoints with the driver's key; "
                 "the newest one's weights and manifest are rewritten to match each other; "
                 "a run with the same checkpoint_dir starts",
                 "that run is refused before any worker starts, naming the checkpoint, and "
                 "its MLflow run is FAILED; with the rewritten checkpoint removed, the next "
                 "run resumes from the previous signed one")
    key = os.urandom(16).hex()
    monkeypatch.setenv(KEY_ENV, key)
    shards, ckpt = str(tmp_path / "shards"), tmp_path / "ckpt"
    store = (tmp_path / "mlruns").as_uri()
    make_synthetic_images(shards, rows=16, image_size=16, classes=2, rows_per_row_group=4)
    common = dict(model=train_hooks.plain_cnn, num_workers=2, batch_size=4, image_size=16,
                  validation_fraction=0.0, backend="local", tracking_uri=store,
                  output_dir=str(tmp_path / "out"), checkpoint_dir=str(ckpt))
    first = train_distributed(shards, epochs=2, **common)
    tags = MlflowClient(store).get_run(first.run_id).data.tags
    assert tags["dist_dl.checkpoint_key_id"] == key_id(key.encode())
    assert key not in json.dumps(tags)
    newest = sorted(ckpt.glob("ckpt-000002-*"))[0]
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    data = next(newest.glob("state.data-*"))
    data.write_bytes(data.read_bytes()[::-1])  # other weights...
    manifest["files"][data.name]["sha256"] = sha256_file(data)  # ...and a manifest to match
    (newest / "MANIFEST.json").write_text(json.dumps(manifest))
    experiment = [MlflowClient(store).get_run(first.run_id).info.experiment_id]
    runs_before = len(MlflowClient(store).search_runs(experiment))
    with pytest.raises(UntrustedCheckpoint, match=f"refusing checkpoint {newest}: its signature "
                       "does not match its content"):
        train_distributed(shards, epochs=3, **common)
    failed = MlflowClient(store).search_runs(experiment, order_by=["attributes.start_time DESC"])
    assert len(failed) == runs_before + 1 and failed[0].info.status == "FAILED"

    shutil.rmtree(newest)
    resumed = train_distributed(shards, epochs=3, **common)
    assert resumed.initial_epoch == 1
    s.figure("refused naming the checkpoint, run FAILED; the next run resumed after epoch 1 "
             "from the signed checkpoint")


@pytest.mark.timeout(240)
@pytest.mark.needs("tensorflow")
def test_a_repaired_run_on_a_new_driver_resumes_with_the_key_from_the_environment(
        tmp_path, monkeypatch):
    """A repaired job run, or a retried task, starts on a new job cluster: a
    new driver whose home folder is empty. Without DIST_DL_CHECKPOINT_KEY it
    makes a new key there and refuses the checkpoints of the run before; with
    the key from the environment (a secret scope in jobs/*.json) it resumes."""
    from dist_dl import train_distributed
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.train.checkpoint import UntrustedCheckpoint

    shards = str(tmp_path / "shards")
    make_synthetic_images(shards, rows=8, image_size=16, classes=2, rows_per_row_group=4)
    common = dict(model=train_hooks.plain_cnn, num_workers=1, batch_size=4, image_size=16,
                  validation_fraction=0.0, backend="local", checkpoint_dir=str(tmp_path / "ckpt"),
                  tracking_uri=(tmp_path / "mlruns").as_uri(), output_dir=str(tmp_path / "out"))

    def new_driver(home: str) -> None:
        (tmp_path / home).mkdir()
        monkeypatch.setenv("HOME", str(tmp_path / home))

    key = os.urandom(16).hex()
    monkeypatch.setenv(KEY_ENV, key)
    new_driver("home-1")
    train_distributed(shards, epochs=1, **common)
    # The repaired run's cluster without the variable: refused before any worker starts.
    monkeypatch.delenv(KEY_ENV)
    new_driver("home-2")
    with pytest.raises(UntrustedCheckpoint, match=f"signed with another key .*set {KEY_ENV}"):
        train_distributed(shards, epochs=2, **common)
    assert (tmp_path / "home-2" / ".config" / "dist_dl" / "checkpoint.key").is_file()
    # With it (as the shipped jobs set it from the secret scope): resumed after epoch 1.
    monkeypatch.setenv(KEY_ENV, key)
    new_driver("home-3")
    resumed = train_distributed(shards, epochs=2, **common)
    assert resumed.initial_epoch == 1 and len(resumed.history["loss"]) == 1
    assert not (tmp_path / "home-3" / ".config").exists()
