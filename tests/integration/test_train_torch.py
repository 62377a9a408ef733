"""train_distributed(engine="torch") end to end: real torch.distributed
workers (Gloo, local processes), the torch reader over Parquet shards, signed
checkpoints, a real MLflow file store, the logged models loaded back (also
where dist_dl is not installed) and scoring on Spark."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra: "
                                    "profiles dbr-16.4-ml and dbr-17.3-ml)")

import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

import train_hooks  # noqa: E402
from dist_dl import TrainingFailed, train_distributed  # noqa: E402
from dist_dl.prepare.synthetic import write_image_shards  # noqa: E402
from imagedata import digit_images, encode  # noqa: E402
from no_tensorflow import env_without_tensorflow  # noqa: E402
from without_dist_dl import predict_without_dist_dl  # noqa: E402

cloudpickle.register_pickle_by_value(train_hooks)
pytestmark = [pytest.mark.profile_subset_164, pytest.mark.profile_dbr19]

# Settings under which a run is a pure function of its inputs.
EXACT = dict(augment=False, shuffle=False, deterministic=True, warmup_epochs=0,
             lr_schedule="constant", momentum=0.9, image_size=16, reader="arrow")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Digits as JPEG shards: 1,400 training and 397 validation images."""
    base = tmp_path_factory.mktemp("digits")
    images = digit_images(1797, size=16)
    for name, part in (("train", images[:1400]), ("val", images[1400:])):
        write_image_shards(str(base / name), (encode(img) for img, _ in part),
                           [label for _, label in part], 10, rows_per_row_group=100)
    return str(base / "train"), str(base / "val")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return (tmp_path_factory.mktemp("mlruns") / "store").as_uri()


@pytest.fixture(scope="module")
def trained_digits(digits, store, tmp_path_factory):
    train, val = digits
    return train_distributed(
        train, validation=val, engine="torch", backend="local", num_workers=2, epochs=10,
        batch_size=32, learning_rate=0.1, warmup_epochs=1, image_size=16, augment=False,
        tracking_uri=store, output_dir=str(tmp_path_factory.mktemp("out")))


# The tests that read trained_digits (ten epochs of two workers) run in one
# test process, which trains once: under xdist each process that runs a test
# of this module sets the module's fixtures up again.
SHARES_TRAINED_DIGITS = pytest.mark.xdist_group("torch_trained_digits")


def _state(trained) -> dict:
    return {k: v.detach().numpy() for k, v in trained.torch_model().state_dict().items()}


def _max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@SHARES_TRAINED_DIGITS
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_digits_learn_on_two_torch_workers_and_everything_is_in_the_run(trained_digits, store):
    trained = trained_digits
    print({k: [round(v, 4) for v in values] for k, values in trained.history.items()})
    assert trained.engine == "torch" and trained.num_workers == 2 and trained.attempts == 1
    assert trained.metrics["val_accuracy"] >= 0.95
    assert len(trained.history["val_accuracy"]) == 10
    run = MlflowClient(store).get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.engine"] == "torch"
    assert run.data.params["train.decode"] == "cpu"
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate",
            "train_images_per_second", "images_per_second"} <= set(run.data.metrics)
    assert all(0 <= f < 1 for f in trained.history["train_input_wait_fraction"])
    # Warm-up over epoch 1 to the scaled rate (2 x 0.1), then a half cosine to 0.
    rates = trained.history["learning_rate"]
    assert rates[0] == pytest.approx(0.2)
    assert rates[1] == pytest.approx(0.2 * 0.5 * (1 + np.cos(np.pi / 9)), rel=1e-6)
    assert rates[-1] == pytest.approx(0.0, abs=1e-12)
    checkpoints = sorted(os.listdir(trained.checkpoint_dir))
    assert len(checkpoints) == 3 and checkpoints[-1].startswith("ckpt-000010-")
    assert os.path.isfile(os.path.join(trained.checkpoint_dir, checkpoints[-1], "state.pt"))
    with pytest.raises(ValueError, match="engine 'torch': use torch_model"):
        trained.keras_model()


@SHARES_TRAINED_DIGITS
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_logged_model_scores_like_transform_also_where_dist_dl_is_not_installed(
        trained_digits, digits, spark, tmp_path):
    import mlflow
    import pyarrow.parquet as pq

    from dist_dl.tracking.target import mlflow_target

    rows = pq.read_table(digits[1]).slice(0, 40).to_pandas()
    df = spark.createDataFrame(rows[["image", "label"]])
    scored = trained_digits.transform(df, probabilities_col="probabilities").toPandas()
    accuracy = float(np.mean(scored["prediction"].to_numpy() == scored["label"].to_numpy()))
    assert accuracy >= 0.9
    with mlflow_target(trained_digits.tracking_uri):
        local = mlflow.artifacts.download_artifacts(trained_digits.model_uri,
                                                    dst_path=str(tmp_path / "model"))
    elsewhere = predict_without_dist_dl(local, list(rows["image"]), tmp_path)
    assert elsewhere["prediction"] == scored["prediction"].tolist()
    np.testing.assert_allclose(np.array(elsewhere["probabilities"]),
                               np.stack(scored["probabilities"]), rtol=1e-5, atol=1e-6)
    # The pytorch flavour's network gives the same classes on the same pixels.
    net = trained_digits.torch_model()
    assert isinstance(net, torch.nn.Module) and not net.training


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torch_workers_at_half_batch_take_the_same_steps_as_one(shards, store, tmp_path,
                                                                    capfd):
    common = dict(engine="torch", backend="local", model=train_hooks.plain_torch_cnn, epochs=2,
                  tracking_uri=store, output_dir=str(tmp_path), **EXACT)
    one = train_distributed(shards, num_workers=1, batch_size=8, learning_rate=0.1, **common)
    # One worker on two cores decodes in two processes, two workers (a core
    # each) in a thread each: the same images, so the same steps.
    if len(os.sched_getaffinity(0)) >= 2:
        assert "training images decoded in 2 processes a worker" in capfd.readouterr().out
    two = train_distributed(shards, num_workers=2, batch_size=4, learning_rate=0.05, **common)
    assert MlflowClient(store).get_run(two.run_id).data.params["steps_per_epoch"] == "3"
    difference = _max_difference(_state(one), _state(two))
    print(f"largest weight difference after 6 steps: {difference:.2e}")
    assert difference < 1e-5
    # The tolerance tells updates apart: unscaled, two workers step half as far.
    unscaled = train_distributed(shards, num_workers=2, batch_size=4, learning_rate=0.05,
                                 scale_learning_rate=False, **common)
    assert _max_difference(_state(one), _state(unscaled)) > 100 * max(difference, 1e-7)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_torch_worker_killed_mid_epoch_is_retried_from_the_last_checkpoint(
        shards, store, tmp_path, capfd):
    log = str(tmp_path / "steps.log")
    # 3 steps an epoch: step 4 of rank 1 is the second step of epoch 2.
    trained = train_distributed(
        shards, engine="torch", backend="local", model=train_hooks.TorchKiller(log, 1, 4),
        epochs=3, num_workers=2, batch_size=4, image_size=16, max_retries=1,
        tracking_uri=store, output_dir=str(tmp_path))
    assert os.path.exists(log + ".killed")
    assert trained.attempts == 2 and len(trained.history["loss"]) == 3
    tags = MlflowClient(store).get_run(trained.run_id).data.tags
    assert "SIGKILL" in tags["dist_dl.attempt_1_error"] and tags["dist_dl.attempts"] == "2"
    out = capfd.readouterr().out
    assert "resumes from checkpoint" in out and "(after epoch 1)" in out
    assert "attempt 2: 2 workers (torch, Gloo on CPU), resuming after epoch 1" in out
    # Attempt 1: rank 1 died in its fifth step (rank 0 was stopped in or
    # before its own); attempt 2's processes ran epochs 2 and 3: 6 steps each.
    steps = {}
    for line in open(log):
        pid, rank, step = map(int, line.split())
        steps.setdefault(pid, (rank, []))[1].append(step)
    runs = list(steps.values())
    assert [len(s) for r, s in runs if r == 1] == [5, 6]
    assert [len(s) for r, s in runs if r == 0][1] == 6
    assert [len(s) for r, s in runs if r == 0][0] in (4, 5)


@pytest.mark.timeout(120)
def test_settings_of_the_tensorflow_engines_are_refused_with_torch(shards, tmp_path):
    store = (tmp_path / "mlruns").as_uri()
    common = dict(engine="torch", backend="local", tracking_uri=store, output_dir=str(tmp_path))
    for settings, match in (
            ({"fp16_allreduce": True}, "fp16_allreduce=True: settings of the TensorFlow engines"),
            ({"reader": "petastorm"}, "reader='petastorm'"),
            ({"keras": 3}, "keras=3 with engine 'torch'"),
            ({"callbacks": lambda: []}, "callbacks are Keras callbacks")):
        with pytest.raises(ValueError, match=match):
            train_distributed(shards, **common, **settings)
    with pytest.raises(ValueError, match="decode='gpu' is the torch engine's"):
        train_distributed(shards, engine="tensorflow", decode="gpu", tracking_uri=store,
                          output_dir=str(tmp_path))
    # Refused before any run was opened.
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.timeout(180)
def test_a_builder_that_is_not_a_torch_module_fails_without_a_retry(shards, store, tmp_path):
    with pytest.raises(TrainingFailed, match="not retried.*engine='torch' trains a torch.nn"):
        train_distributed(shards, engine="torch", backend="local", num_workers=1,
                          model=lambda shape, classes: "not a module", image_size=16,
                          tracking_uri=store, output_dir=str(tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_auto_trains_with_torch_where_tensorflow_is_not_installed(shards, tmp_path):
    script = textwrap.dedent(f"""
        import sys
        import dist_dl
        trained = dist_dl.train_distributed({shards!r}, backend="local", num_workers=2,
                                            epochs=1, batch_size=4, image_size=16,
                                            tracking_uri={(tmp_path / "mlruns").as_uri()!r},
                                            output_dir={str(tmp_path / "out")!r})
        assert trained.engine == "torch", trained.engine
        # (MLflow imports pyspark where it is installed, mlflow/types/schema.py.)
        assert not any(m.startswith(("tensorflow", "keras", "tf_keras")) for m in sys.modules)
        print("trained with", trained.engine)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=280, env=env_without_tensorflow(str(tmp_path / "site")))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained with torch" in done.stdout


@pytest.mark.timeout(120)
def test_torch_checkpoints_are_signed_verified_and_kept_apart_from_keras_ones(tmp_path):
    from dist_dl.train.checkpoint import CheckpointManager, UntrustedCheckpoint

    key = b"k" * 32
    manager = CheckpointManager(tmp_path / "ckpt", key=key)
    net = torch.nn.Linear(3, 2)
    info = manager.save_torch({"model": net.state_dict(), "step": 7, "epoch": 1}, 1,
                              metadata={"run_id": "r"})
    state = manager.read_torch(manager.latest())
    assert state["step"] == 7 and torch.equal(state["model"]["weight"], net.weight)
    assert not info.has_optimizer
    # Damage after publishing: skipped for the previous one (none here).
    second = manager.save_torch({"model": net.state_dict(), "step": 9, "epoch": 2}, 2)
    data = bytearray((second.path / "state.pt").read_bytes())
    data[-100] ^= 0xFF
    (second.path / "state.pt").write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="skipping corrupt checkpoint"):
        assert manager.latest().epoch == 1
    # Another key's checkpoints are refused, not read.
    with pytest.raises(UntrustedCheckpoint):
        CheckpointManager(tmp_path / "ckpt", key=b"x" * 32).latest()
    # A Keras model cannot be restored from it.
    with pytest.raises(ValueError, match="written by the torch engine"):
        manager.restore(object(), include_optimizer=False, checkpoint=manager.verify(info.path))
