"""train_distributed end to end: real Horovod workers and real tf.distribute
workers (local processes and Spark tasks), real Petastorm and arrow readers
over Parquet shards, a real MLflow file store. Tests of what both engines
promise are parametrized by engine."""
from __future__ import annotations

import os

import cloudpickle
import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

import train_hooks
import workers
from dist_dl import TrainConfig, TrainingFailed, train_distributed
from dist_dl.core import compat
from dist_dl.prepare import make_synthetic_images, write_digits_tree
from dist_dl.tracking.target import mlflow_target

cloudpickle.register_pickle_by_value(train_hooks)
cloudpickle.register_pickle_by_value(workers)

# Both engines; the horovod cases skip where Horovod does not import (the
# profiles of Databricks Runtime 16.0 ML and later: conftest.py's `needs`).
# "keras3" is the tf.distribute engine with a Keras 3 model (keras=3, its own
# training loop); it skips where keras=3 cannot train (conftest.py): Keras 3.2.1
# (the default profile, dbr-15.4-ml) and Keras 2 (TensorFlow 2.15 and older).
ENGINES = ["horovod", "tensorflow"]
WITH_KERAS3 = [*ENGINES, "keras3"]


def by_engine(engine: str) -> dict:
    """The train_distributed settings of an engine case."""
    return {"engine": "tensorflow", "keras": 3} if engine == "keras3" else {"engine": engine}

# Settings under which a run is a pure function of its inputs.
EXACT = dict(augment=False, shuffle=False, deterministic=True, warmup_epochs=0,
             lr_schedule="constant", momentum=0.9, validation_fraction=0.0, image_size=16)


@pytest.fixture
def store(tmp_path):
    return (tmp_path / "mlruns").as_uri()


def _weights(trained):
    return trained.keras_model().get_weights()


def _max_difference(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def _probed(prefix) -> list[str]:
    """What each rank's EnvProbe saw, in rank order."""
    return [open(f"{prefix}-rank{rank}").read() for rank in (0, 1)]


@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", WITH_KERAS3)
def test_two_workers_at_half_batch_take_the_same_steps_as_one_worker(shards, store, tmp_path,
                                                                      engine):
    common = dict(model=train_hooks.plain_cnn, epochs=1, tracking_uri=store,
                  output_dir=str(tmp_path), backend="local", **by_engine(engine), **EXACT)
    one = train_distributed(shards, num_workers=1, batch_size=8, learning_rate=0.1, **common)
    # Learning rate 0.05 per worker, scaled by 2 workers: the same 0.1.
    loaded = str(tmp_path / "modules")
    two = train_distributed(shards, num_workers=2, batch_size=4, learning_rate=0.05,
                            callbacks=train_hooks.ModulesProbe(loaded, ("mlflow",)), **common)
    # Only rank 0 logs: the other worker never loads MLflow (imports of about
    # 1.6 CPU-seconds in every worker start).
    assert _probed(loaded) == ["mlflow", ""]
    assert one.num_workers == 1 and two.num_workers == 2
    params = MlflowClient(store).get_run(two.run_id).data.params
    assert params["steps_per_epoch"] == "3"
    assert params["train.engine"] == by_engine(engine)["engine"]
    assert params["train.keras"] == ("3" if engine == "keras3" else "2")
    difference = _max_difference(_weights(one), _weights(two))
    print(f"largest weight difference after 3 steps: {difference:.2e}")
    assert difference < 1e-5
    # The tolerance tells updates apart: unscaled, two workers step half as far.
    # (With Horovod, the cycle time a user chose reaches every worker's Horovod.)
    probe = str(tmp_path / "cycle_time")
    horovod_only = dict(cycle_time_ms=2.5, callbacks=train_hooks.EnvProbe(
        probe, "HOROVOD_CYCLE_TIME", "2.5")) if engine == "horovod" else {}
    unscaled = train_distributed(shards, num_workers=2, batch_size=4, learning_rate=0.05,
                                 scale_learning_rate=False, **horovod_only, **common)
    assert _max_difference(_weights(one), _weights(unscaled)) > 100 * max(difference, 1e-7)
    if engine != "horovod":
        return
    assert _probed(probe) == ["present", "present"]
    # All gradients in one explicit allreduce group, and the arrow reader (no
    # Petastorm) feeding each rank the same rows in the same order: the same
    # update (one training checks both; either one wrong breaks the match).
    grouped_arrow = train_distributed(shards, num_workers=2, batch_size=4, learning_rate=0.05,
                                      allreduce_groups=1, reader="arrow", **common)
    assert _max_difference(_weights(one), _weights(grouped_arrow)) < 1e-5


@pytest.mark.profile_subset_164
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["keras3"])
def test_keras3_workers_agree_to_skip_a_step_whose_gradients_overflow_on_one(engine):
    # Keras 3's LossScaleOptimizer checks each worker's own gradients and
    # all-reduces them only where they are finite: when worker 1 overflows
    # and worker 0 does not, worker 0 waits for an all-reduce worker 1 never
    # joins (mixed precision hung in its first step: engines/keras3.py's notes).
    # Here worker 1 goes on to the next all-reduce, which TensorFlow finds
    # mismatched ("expected ... data_type 2 but got ... data_type 1").
    from dist_dl.launch import JobTimeout, TFDistributeRunner, WorkerError

    keras3 = {compat.LEGACY_KERAS_ENV: "0", compat.NATIVE_KERAS_ENV: "3"}
    with pytest.raises((JobTimeout, WorkerError), match=r"[Cc]ollective|timed out|timeout"):
        TFDistributeRunner(np=-2, env=keras3, timeout=20).run(
            workers.keras3_overflow_on_one_worker, agree=False)
    # The library's scaler all-reduces the check: both skip the step and halve the scale.
    rows = TFDistributeRunner(np=-2, env=keras3, timeout=90).run(
        workers.keras3_overflow_on_one_worker)
    assert rows == [[1.0, 1.0, 1.0, 2.0 ** 14]] * 2


@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_a_model_faster_than_its_input_is_told_so_once_with_the_levers(tmp_path, store, capsys):
    """A model whose step costs next to nothing on 224-pixel crops of
    1024-pixel JPEGs: its worker waits for every batch, the epochs log that
    share, and the driver hears it once (not once per epoch), with what to do.
    (From 512-pixel JPEGs, decoding cost not much more than the step: beside
    two other trainings the epochs waited 3 to 23 % of the time, and one run
    under 20 % failed.)"""
    path = str(tmp_path / "shards")
    make_synthetic_images(path, rows=192, image_size=1024, classes=3, rows_per_row_group=32)
    trained = train_distributed(path, model=train_hooks.pooled_linear, image_size=224,
                                num_workers=1, backend="local", engine="tensorflow", epochs=3,
                                batch_size=32, validation_fraction=0.0, tracking_uri=store,
                                output_dir=str(tmp_path / "out"))
    out = capsys.readouterr().out
    fractions = trained.history["train_input_wait_fraction"]
    print("input wait fractions by epoch:", [round(f, 2) for f in fractions])
    assert len(fractions) == 3 and max(fractions) > 0.2, fractions
    assert out.count("input-bound: rank 0 waited for its next batch") == 1, out
    assert "shards stored smaller" in out and "more cores per device" in out


@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("engine", WITH_KERAS3)
def test_digits_learn_on_two_spark_workers_and_transform_matches_the_mlflow_model(
        spark, store, tmp_path, capsys, engine):
    from pyspark.sql import functions as F

    train_dir, val_dir = write_digits_tree(str(tmp_path / "digits"), image_size=16)

    def frame(folder):
        # Spark's binaryFile source: image bytes in `content`, the label from the path.
        return (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
                .load(folder)
                .withColumn("digit", F.regexp_extract("path", r"/(\d)/[^/]+$", 1)))

    config = TrainConfig(model="small_cnn", image_size=16, image_col="content", label_col="digit",
                         num_workers=2, backend="spark", epochs=6, batch_size=32,
                         learning_rate=0.1, warmup_epochs=1, augment=False,
                         eval_crop_fraction=1.0, output_dir=str(tmp_path / "out"),
                         **by_engine(engine))
    trained = train_distributed(frame(train_dir), validation=frame(val_dir), config=config,
                                tracking_uri=store, registered_model_name="digits")
    out = capsys.readouterr().out
    assert "epoch 6/6" in out and "images/s" in out  # progress reached the driver

    history = trained.history
    assert len(history["loss"]) == 6 and len(history["val_accuracy"]) == 6
    assert all(0 <= f < 1 for f in history["train_input_wait_fraction"])
    assert history["loss"][-1] < history["loss"][0]
    print("validation accuracy by epoch:", [round(a, 3) for a in history["val_accuracy"]])
    assert trained.metrics["val_accuracy"] >= 0.9
    assert trained.registered_version == 1
    # A Keras 3 model stays one (the logged file, the checkpoints, the pyfunc's requirements).
    keras_model = trained.keras_model()
    assert type(keras_model).__module__.split(".")[0] == ("keras" if engine == "keras3"
                                                          else compat.keras().__name__.split(".")[0])
    if engine == "keras3":
        (latest,) = [p for p in os.listdir(trained.checkpoint_dir) if p.startswith("ckpt-000006")]
        assert "model.keras" in os.listdir(os.path.join(trained.checkpoint_dir, latest))

    # The executors' predictions equal the MLflow-loaded model's, on held-out images.
    held_out = frame(val_dir).select("content", "digit")
    scored = trained.transform(held_out, probabilities_col="probabilities").toPandas()
    accuracy = float((scored["prediction"].astype(str) == scored["digit"]).mean())
    print(f"held-out accuracy through transform(df): {accuracy:.3f} on {len(scored)} images")
    assert accuracy >= 0.9
    with mlflow_target(store):
        loaded = mlflow.pyfunc.load_model(trained.model_uri)
    expected = loaded.predict(scored[["content"]].rename(columns={"content": "image"}))
    np.testing.assert_array_equal(scored["prediction"].to_numpy(), expected["prediction"].to_numpy())
    np.testing.assert_allclose(np.stack(scored["probabilities"]),
                               np.stack(expected["probabilities"]), rtol=1e-5, atol=1e-6)

    run = MlflowClient(store).get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.num_workers"] == "2" and run.data.params["backend"] == "spark"
    assert run.data.metrics["num_workers"] == 2 and run.data.metrics["images_per_second"] > 0
    artifacts = {a.path for a in MlflowClient(store).list_artifacts(trained.run_id)}
    assert "tensorboard" in artifacts
    # The model: in the run's artifacts before MLflow 3, a logged model of its own from
    # MLflow 3 on (runtime 17.3's), which the run's runs:/ URI still names.
    with mlflow_target(store):
        model_files = mlflow.artifacts.list_artifacts(artifact_uri=trained.model_uri)
    assert {"MLmodel", "artifacts"} <= {os.path.basename(a.path) for a in model_files}

    # The same DataFrame again: its shards are reused, not rewritten.
    from dist_dl.prepare.materialise import materialise_dataframe

    root = os.path.join(config.output_dir, "shards")
    (fingerprint,) = os.listdir(root)
    labels = os.path.join(root, fingerprint, "train", "_labels.json")
    before = os.stat(labels).st_mtime_ns
    materialise_dataframe(frame(train_dir), frame(val_dir), os.path.abspath(config.output_dir),
                          image_col=config.image_col, label_col=config.label_col,
                          classes=config.classes, seed=config.seed,
                          num_workers=config.num_workers,
                          validation_fraction=config.validation_fraction)
    assert os.listdir(root) == [fingerprint] and os.stat(labels).st_mtime_ns == before


@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", WITH_KERAS3)
def test_a_run_stopped_after_epoch_1_and_resumed_ends_like_an_uninterrupted_one(
        shards, store, tmp_path, engine):
    common = dict(model="small_cnn", epochs=2, num_workers=2, batch_size=4, learning_rate=0.05,
                  tracking_uri=store, output_dir=str(tmp_path), backend="local",
                  **by_engine(engine), **EXACT)
    uninterrupted = train_distributed(shards, checkpoint_dir=str(tmp_path / "a"), **common)
    log = str(tmp_path / "epochs.log")
    stopped = train_distributed(shards, checkpoint_dir=str(tmp_path / "b"),
                                callbacks=train_hooks.EpochLog(log, stop_after=1), **common)
    assert len(stopped.history["loss"]) == 1
    resumed = train_distributed(shards, checkpoint_dir=str(tmp_path / "b"),
                                callbacks=train_hooks.EpochLog(log), **common)
    assert resumed.initial_epoch == 1 and len(resumed.history["loss"]) == 1
    assert train_hooks.epochs_begun(log) == [[0], [1]]  # the resumed run trained epoch 2 only
    # Batch normalisation's moving statistics and the optimizer's momentum
    # are restored too, or this would not hold.
    assert _max_difference(_weights(uninterrupted), _weights(resumed)) < 1e-6


# Horovod's case is the reliability suite's F1 (test_reliability.py): a
# worker killed at five points of an epoch, three times each, in one run.
@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ["tensorflow", "keras3"])
def test_a_worker_killed_mid_epoch_is_retried_and_only_that_epoch_runs_again(
        shards, store, tmp_path, engine):
    log = str(tmp_path / "epochs.log")
    trained = train_distributed(
        shards, model="small_cnn", epochs=3, num_workers=2, batch_size=4, image_size=16,
        validation_fraction=0.0, max_retries=1, backend="local", tracking_uri=store,
        **by_engine(engine), output_dir=str(tmp_path), callbacks=train_hooks.EpochLog(log, kill_rank=1, kill_epoch=1,
                                                                 kill_batch=1))
    assert os.path.exists(log + ".killed")
    assert trained.attempts == 2
    # Attempt 1 began epochs 1 and 2 (0-based 0, 1) and died in epoch 2;
    # attempt 2 resumed after epoch 1: epoch 1 was not lost.
    assert train_hooks.epochs_begun(log) == [[0, 1], [1, 2]]
    assert len(trained.history["loss"]) == 3  # every epoch logged once
    tags = MlflowClient(store).get_run(trained.run_id).data.tags
    assert "SIGKILL" in tags["dist_dl.attempt_1_error"] and tags["dist_dl.attempts"] == "2"


@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", WITH_KERAS3)
def test_an_error_of_the_code_is_not_retried_and_names_the_checkpoint(shards, store, tmp_path,
                                                                       engine):
    with pytest.raises(TrainingFailed, match="not retried.*Last complete checkpoint: none yet") \
            as info:
        train_distributed(shards, model=train_hooks.wrong_units, num_workers=2, batch_size=4,
                          image_size=16, validation_fraction=0.0, max_retries=2, backend="local",
                          tracking_uri=store, output_dir=str(tmp_path), **by_engine(engine))
    assert info.value.attempts == 1 and info.value.checkpoint is None
    assert "classes" in str(info.value)  # the worker's own message: the output units
    assert MlflowClient(store).get_run(info.value.run_id).info.status == "FAILED"


@pytest.mark.profile_subset_164
@pytest.mark.timeout(240)
def test_the_model_is_registered_in_the_drivers_registry(shards, store, tmp_path, monkeypatch):
    # A notebook's mlflow.set_registry_uri (Unity Catalog's "databricks-uc")
    # is the driver's alone: rank 0 must register there too, where the driver
    # (and the pipeline's evaluate and score) will look for the model. MLflow
    # (2.22) also exports it as MLFLOW_REGISTRY_URI for child processes, which
    # executors started before it was set do not see: taken out here, so the
    # local workers are in the executors' place.
    registry = f"sqlite:///{tmp_path / 'registry.db'}"
    mlflow.set_registry_uri(registry)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)  # older MLflow: never set
    trained = train_distributed(shards, model="small_cnn", epochs=1, num_workers=2, batch_size=4,
                                image_size=16, validation_fraction=0.0, backend="local",
                                tracking_uri=store, output_dir=str(tmp_path),
                                registered_model_name="in_the_drivers_registry")
    assert trained.registered_version is not None
    versions = MlflowClient(store, registry_uri=registry).search_model_versions(
        "name='in_the_drivers_registry'")
    assert [v.run_id for v in versions] == [trained.run_id]
    assert not MlflowClient(store, registry_uri=store).search_registered_models()


@pytest.mark.profile_subset_164
@pytest.mark.timeout(60)
def test_a_retry_waits_for_task_slots_and_fails_naming_the_wait_and_checkpoint(
        spark, tmp_path, capsys):
    # Before a retry on Spark tasks the driver waits (retry_wait) for the
    # slots a lost host took with it; local[2] has 2 slots, ever.
    from types import SimpleNamespace

    from dist_dl.train.attempts import wait_for_capacity

    spec = SimpleNamespace(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_key=b"k" * 32)
    wait_for_capacity(spark, TrainConfig(num_workers=2, retry_wait=0.0), spec, 1, "x", "run")
    with pytest.raises(TrainingFailed) as info:
        wait_for_capacity(spark, TrainConfig(num_workers=3, retry_wait=1.2), spec, 1,
                           "WorkerError: worker rank 1 on host worker2 failed", "run")
    text = str(info.value)
    assert "retry_wait=1.2 s" in text and "has 2 task slot(s) now" in text, text
    assert "on host worker2" in text and "none yet in " + spec.checkpoint_dir in text, text
    assert info.value.attempts == 1 and info.value.checkpoint is None
    assert "waiting for 3 task slots, the cluster (local[2]) has 2" in capsys.readouterr().out


@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", WITH_KERAS3)
def test_mixed_precision_and_fp16_gradients_run_on_cpu_and_log_a_float32_model(
        shards, store, tmp_path, engine):
    probe = str(tmp_path / "cycle_time")
    # fp16 gradients are Horovod's compression; tf.distribute has none (refused: see
    # test_bad_input_fails_on_the_driver_before_any_worker_or_run).
    fp16 = engine == "horovod"
    # With Keras 3 this hung in the first step before the workers agreed on
    # skipping a step whose gradients overflow on one of them (engines/keras3.py).
    trained = train_distributed(shards, model="small_cnn", epochs=1, num_workers=2, batch_size=4,
                                image_size=16, validation_fraction=0.0, mixed_precision="on",
                                fp16_allreduce=fp16, backend="local", tracking_uri=store,
                                output_dir=str(tmp_path), **by_engine(engine),
                                callbacks=train_hooks.EnvProbe(probe, "HOROVOD_CYCLE_TIME", "5.0"))
    assert np.isfinite(trained.metrics["loss"])
    model = trained.keras_model()
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    params = MlflowClient(store).get_run(trained.run_id).data.params
    assert params["train.mixed_precision"] == "on"
    assert params["train.fp16_allreduce"] == str(fp16)
    if not fp16:
        return
    # No GPU and no cycle time given: CPU workers run Horovod at 5 ms, not its 1 ms.
    assert _probed(probe) == ["present", "present"]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.needs("horovod.tensorflow")
def test_cpu_workers_of_a_large_model_get_the_long_cycle_time(shards, store, tmp_path):
    # Horovod's cycle time: a setting of Horovod's allreduce only.
    common = dict(epochs=1, num_workers=2, batch_size=4, image_size=16, validation_fraction=0.0,
                  backend="local", tracking_uri=store, output_dir=str(tmp_path), engine="horovod")
    probe, builds = str(tmp_path / "cycle_time"), str(tmp_path / "builds")
    trained = train_distributed(shards, model=train_hooks.CountedBuilder(builds,
                                                                         train_hooks.wide_mlp),
                                callbacks=train_hooks.EnvProbe(probe, "HOROVOD_CYCLE_TIME",
                                                               "20.0"), **common)
    assert trained.keras_model().count_params() > 4 * 2 ** 20
    # 17.6 MB of gradients, no GPU, no cycle time given: 20 ms on both workers
    # (the small CNN's 0.4 MB get 5 ms: the mixed-precision test above).
    assert _probed(probe) == ["present", "present"]
    # Counted on the model each worker trains: built once per worker, with
    # its rank's seed, before hvd.init().
    with open(builds) as f:
        built = [line.split() for line in f]
    assert sorted(rank for _, rank in built) == ["0", "1"]
    assert len({pid for pid, _ in built}) == 2
    # A cycle time the user chose (in the driver's environment, which the
    # workers inherit) is never raised: tests/unit/test_device.py's
    # test_a_cycle_time_someone_chose_is_never_replaced, on the same function.


@pytest.mark.profile_subset_164
@pytest.mark.timeout(180)
@pytest.mark.needs("tensorflow")
def test_bad_input_fails_on_the_driver_before_any_worker_or_run(spark, shards, store, tmp_path):
    def runs():
        return len(MlflowClient(store).search_runs(
            [e.experiment_id for e in MlflowClient(store).search_experiments()]))

    with pytest.raises(ValueError, match="unknown setting 'epoch'.*did you mean 'epochs'"):
        train_distributed(shards, epoch=3, tracking_uri=store)
    with pytest.raises(ValueError, match="TrainConfig.batch_size must be a positive int"):
        train_distributed(shards, batch_size=0, tracking_uri=store)
    with pytest.raises(ValueError, match="unknown model 'resnet5'"):
        train_distributed(shards, model="resnet5", tracking_uri=store)
    with pytest.raises(ValueError, match=r"6 row groups but there are 8 workers"):
        train_distributed(shards, num_workers=8, tracking_uri=store, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="classes=5 but the label index.*has 3 labels"):
        train_distributed(shards, classes=5, tracking_uri=store, output_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_distributed(str(tmp_path / "nowhere"), tracking_uri=store)
    frame = spark.createDataFrame([(b"not an image", "cat")], "image binary, name string")
    with pytest.raises(ValueError, match=r"column 'label' \(label_col\) is not in the DataFrame"):
        train_distributed(frame, tracking_uri=store, output_dir=str(tmp_path))
    # Horovod's allreduce settings have no tf.distribute counterpart: refused, not ignored.
    with pytest.raises(ValueError, match=r"fp16_allreduce=True, cycle_time_ms=2\.0: Horovod's "
                                         r"allreduce settings.*engine='horovod'"):
        train_distributed(shards, engine="tensorflow", fp16_allreduce=True, cycle_time_ms=2.0,
                          tracking_uri=store)
    with pytest.raises(ValueError, match=r"TrainConfig.engine must be one of"):
        train_distributed(shards, engine="mpi", tracking_uri=store)
    # Keras 3: only where it is installed, and not on Horovod (Keras 2 only).
    with pytest.raises(ValueError, match=r"TrainConfig.keras must be one of"):
        train_distributed(shards, keras="3", tracking_uri=store)
    from importlib.metadata import version

    keras_version = version("keras")
    if not compat.keras3_default():
        with pytest.raises(ValueError, match=r"keras=3 but the keras package here is 2\..*"
                                             r"TensorFlow 2\.16 and later.*keras=2"):
            train_distributed(shards, keras=3, engine="tensorflow", tracking_uri=store)
    elif compat.keras3_training_problem() is not None:  # runtime 15.4's Keras 3.2.1
        with pytest.raises(ValueError, match=rf"needs Keras 3\.5 or later, and this is Keras "
                                             rf"{keras_version}.*keras-team/keras#19891"):
            train_distributed(shards, keras=3, engine="tensorflow", tracking_uri=store)
    else:
        with pytest.raises(ValueError, match=r"keras=3 with engine='horovod'.*horovod#4290.*"
                                             r"engine='tensorflow'"):
            train_distributed(shards, keras=3, engine="horovod", tracking_uri=store)
    assert runs() == 0
