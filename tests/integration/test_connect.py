"""The launchers from a Spark Connect session (``SparkSession.builder.remote``):
a real Connect server (Spark's own plugin, ``local[2]``) in a process of its
own (tests/support/connect_server.py), this test process its client.

What is checked is what a classic session guarantees: rank 0's value back,
the workers' output, the failing rank named with its traceback, the
timeout, the task slots checked before any stage, nothing left running,
``train_distributed`` retried from its checkpoint and its model's
``transform``; the tf.distribute runners, ``train_ensemble`` and its
``transform``, ``prepare_image_dataset`` and the search on the session's
executors, its early stopping through the MLflow tracking store. The client
and the server run the profile's packages, but for the client's overlay
where a profile has one (dbr-18-ml: tests/support/connect_server.py): the
executors import the server's, not the client's.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

import connect_server  # noqa: E402

connect_server.skip_without_a_client()

import cloudpickle  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

import train_hooks  # noqa: E402
from dist_dl import (JobTimeout, NotEnoughSlots, TorchDistributor, WorkerError,  # noqa: E402
                     train_distributed)
from dist_dl.core.sessionkind import is_connect  # noqa: E402
from waits import workers_left  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(train_hooks)
# One test process runs the module's tests one after another (its client
# session is the module's fixture, and a classic test between two of them
# would find the process in Connect mode). CI runs them on dbr-17.3-ml and
# dbr-18-ml (the Spark 4 profiles with TensorFlow and torch), and the
# notebooks from a Connect session on dbr-19-ml (without TensorFlow).
pytestmark = [pytest.mark.profile_subset_164, pytest.mark.xdist_group("connect")]


@pytest.fixture(scope="module")
def server():
    """The Connect server's process and port (ends with the module)."""
    with connect_server.serving() as running:
        yield running


@pytest.fixture(scope="module")
def connect(server):
    """The client session; the process is left as it was (a Connect client
    marks the whole process as one: pyspark's ``SPARK_CONNECT_MODE_ENABLED``).

    A Connect client's process holds no SparkContext (pyspark refuses to
    start a remote session beside one: ``SESSION_ALREADY_EXIST``), so an
    earlier test's local session in this test process is stopped first; the
    ``spark`` fixture starts another for the tests that come after."""
    from pyspark.sql import SparkSession

    classic = SparkSession.getActiveSession()
    if classic is not None:
        classic.stop()
    before = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{server[1]}").getOrCreate()
    assert is_connect(spark)
    try:
        yield spark
    finally:
        spark.stop()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _workers_left(server, within: float = 10.0) -> list[str]:
    """The Connect server's worker processes (of any job) still running ``within`` s from now."""
    return workers_left(server[0].pid, within)


def allreduce(scale):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {total.item()}")
        return total.item() * scale
    finally:
        dist.destroy_process_group()


# The first test of the module starts the server, its first Python workers
# and torch in them: seconds on an idle machine, minutes on a loaded one.
@pytest.mark.timeout(420)
def test_torch_distributor_runs_a_gloo_job_and_returns_rank_0s_value(connect, server, capsys):
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, spark=connect)
    assert distributor.run(allreduce, 10) == 30.0
    out = capsys.readouterr().out
    # Each task's output comes back in its rows, rank-prefixed.
    assert "[0]<stdout>:rank 0 of 2: 3.0" in out and "[1]<stdout>:rank 1 of 2: 3.0" in out
    assert _workers_left(server) == []


def fail_on_rank_1():
    import os
    import time

    if os.environ["RANK"] == "1":
        raise ValueError("rank one says no")
    time.sleep(300)  # rank 0 waits: the failure ends it


def sleep_long():
    import time

    time.sleep(120)


@pytest.mark.timeout(300)
def test_the_executors_run_the_servers_packages_and_the_client_its_own(connect):
    """The client and the cluster are two environments, as with Databricks
    Connect: the server's workers import the server's packages, never the
    client's overlay (dbr-18-ml: protobuf 6.33 in the client for pyspark
    4.1.0's client code, the runtime's 5.29 on the executors)."""
    import subprocess

    import google.protobuf

    def protobuf_versions(batches):
        """A task's protobuf: the version its Python worker imports. (Local:
        pyspark pickles it by value, as the executors cannot import this module.)"""
        import google.protobuf
        import pandas as pd

        for _ in batches:
            yield pd.DataFrame({"protobuf": [google.protobuf.__version__]})

    server_side = subprocess.run(
        [sys.executable, "-c", "import google.protobuf; print(google.protobuf.__version__)"],
        env=connect_server.server_env(), capture_output=True, text=True, check=True,
        timeout=120).stdout.strip()
    rows = connect.range(2, numPartitions=2).mapInPandas(protobuf_versions,
                                                        "protobuf string").collect()
    assert {r.protobuf for r in rows} == {server_side}
    client = google.protobuf.__version__
    if connect_server.overlay_in_use():
        assert google.protobuf.__file__.startswith(str(connect_server.CLIENT_OVERLAY)), (
            google.protobuf.__file__)
        major = (int(client.split(".")[0]), int(server_side.split(".")[0]))
        assert major[0] > major[1], f"the client's protobuf {client}, the executors' {server_side}"
    else:
        assert client == server_side


@pytest.mark.timeout(420)
def test_a_failing_rank_is_named_and_a_timeout_stops_every_process(connect, server):
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         spark=connect).run(fail_on_rank_1)
    error = caught.value
    assert (error.rank, error.worker_type, error.worker_message) == (1, "ValueError",
                                                                      "rank one says no")
    assert error.host and "rank one says no" in error.worker_traceback
    assert str(error).startswith("TorchDistributor(num_processes=2, local_mode=False): worker "
                                 f"rank 1 on host {error.host} failed: ValueError"), error
    assert time.monotonic() - started < 240  # not rank 0's 300 s sleep
    assert _workers_left(server) == []

    started = time.monotonic()
    with pytest.raises(JobTimeout, match="timeout of 3 s"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, timeout=3,
                         spark=connect).run(sleep_long)
    assert time.monotonic() - started < 100  # not the 120 s sleep
    assert _workers_left(server) == []


@pytest.mark.timeout(120)
def test_slots_and_arguments_are_checked_before_any_work(connect):
    with pytest.raises(NotEnoughSlots, match=r"^TorchDistributor\(num_processes=3, local_mode="
                       r"False\) needs 3 Spark tasks .*Connect session's cluster \(local\[2\]\) "
                       r"has 2 task slot"):
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=False,
                         spark=connect).run(sleep_long)
    with pytest.raises(ValueError, match=r"spark.task.resource.gpu.amount is unset.*use_gpu=False"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True, spark=connect)


def quadratic(params, reporter):
    """A trial: three reports on the way to (x - 0.3)^2."""
    for step in range(3):
        reporter.report((params["x"] - 0.3) ** 2 + (2 - step), step)
    return (params["x"] - 0.3) ** 2


@pytest.mark.timeout(420)
def test_the_search_runs_on_the_connect_sessions_tasks_without_early_stopping(connect,
                                                                               tmp_path):
    """Trials as one-task jobs of the Connect session, two at a time; each
    trial's reports come back with its outcome and are its MLflow metric
    history, as a classic session logs them while it runs."""
    from dist_dl.search import Uniform, search

    store = (tmp_path / "mlruns").as_uri()
    result = search(quadratic, {"x": Uniform(0, 1)}, max_trials=4, max_concurrent=2,
                    early_stopping=None, seed=3, spark=connect, tracking_uri=store)
    assert [t.status for t in result.trials] == ["completed"] * 4
    assert result.best_value == min(t.value for t in result.trials)
    assert abs(result.best_value - (result.best_params["x"] - 0.3) ** 2) < 1e-12
    client = MlflowClient(store)
    for trial in result.trials:
        history = sorted((m.step, m.value) for m in client.get_metric_history(trial.run_id,
                                                                            "objective"))
        x = trial.params["x"]
        assert [step for step, _ in history] == [0, 1, 2, 3], history
        assert history[0][1] == pytest.approx((x - 0.3) ** 2 + 2)
        assert trial.steps == 3


def far_off_is_hopeless(params, reporter):
    """A trial: eight reports, 0.4 s apart; x above 1 is hopeless from the first."""
    import time

    for step in range(8):
        time.sleep(0.4)
        reporter.report(1 / (step + 1) + (100 if params["x"] > 1 else 0), step)
    return (params["x"] - 0.3) ** 2


@pytest.mark.timeout(420)
def test_early_stopping_on_connect_stops_hopeless_trials_through_the_tracking_store(connect,
                                                                                   tmp_path):
    """With a stopping rule on a Connect session the trials log their reports
    to their MLflow runs, the driver reads them there and stops a hopeless
    trial with a tag of its run, which the trial's next report reads."""
    from dist_dl.search import search

    store = (tmp_path / "mlruns").as_uri()
    # In grid order: the hopeless trials start when a good one has finished,
    # which the median rule (one startup trial) compares them with.
    result = search(far_off_is_hopeless, {"x": [0.3, 0.5, 5.0, 6.0]}, max_trials=4,
                    max_concurrent=2, algorithm="grid", early_stopping="median",
                    early_stopping_startup_trials=1, spark=connect, tracking_uri=store)
    trials = {t.params["x"]: t for t in result.trials}
    assert [trials[x].status for x in (0.3, 0.5, 5.0, 6.0)] == ["completed", "completed",
                                                                "pruned", "pruned"], trials
    assert result.best_params == {"x": 0.3} and result.best_value == 0
    assert trials[0.3].steps == trials[0.5].steps == 8
    assert all(trials[x].steps < 8 for x in (5.0, 6.0)), trials
    client = MlflowClient(store)
    for trial in result.trials:
        run = client.get_run(trial.run_id)
        steps = [m.step for m in client.get_metric_history(trial.run_id, "objective")]
        if trial.status == "pruned":
            assert run.info.status == "KILLED" and run.data.tags["dist_dl.prune"] == "true"
            # Each report once, the one that learned of the stop included.
            assert sorted(steps) == list(range(trial.steps)), steps
        else:
            assert run.info.status == "FINISHED" and "dist_dl.prune" not in run.data.tags
            assert sorted(steps) == list(range(9)), steps  # and the final value at step 8


@pytest.mark.timeout(420)
def test_train_distributed_runs_on_spark_tasks_and_retries_from_its_checkpoint(
        connect, server, shards, tmp_path, capfd):
    store = (tmp_path / "mlruns").as_uri()
    log = str(tmp_path / "steps.log")
    # 3 steps an epoch: rank 1 dies in the second step of epoch 2; the retry
    # resumes after epoch 1 from its checkpoint.
    trained = train_distributed(
        shards, engine="torch", model=train_hooks.TorchKiller(log, 1, 4), epochs=2,
        num_workers=2, batch_size=4, image_size=16, max_retries=1, spark=connect,
        tracking_uri=store, output_dir=str(tmp_path / "out"))
    assert os.path.exists(log + ".killed")
    assert trained.attempts == 2 and len(trained.history["loss"]) == 2
    run = MlflowClient(store).get_run(trained.run_id)
    assert run.data.params["backend"] == "spark"  # the Connect session's tasks, not this host
    assert "SIGKILL" in run.data.tags["dist_dl.attempt_1_error"]
    out = capfd.readouterr().out
    assert "(after epoch 1)" in out and "resuming after epoch 1" in out
    assert _workers_left(server) == []

    # TrainedModel.transform scores a DataFrame of the Connect session on its
    # executors, as the logged model predicts here.
    import mlflow
    import numpy as np
    import pyarrow.parquet as pq

    from dist_dl.tracking.target import mlflow_target

    rows = pq.read_table(shards).to_pandas()[["image", "label"]].reset_index(drop=True)
    rows.insert(0, "id", range(len(rows)))
    scored = trained.transform(connect.createDataFrame(rows).repartition(2)).drop(
        "image").toPandas().sort_values("id")
    assert len(scored) == len(rows)  # nothing dropped
    with mlflow_target(store):
        expected = mlflow.pyfunc.load_model(trained.model_uri).predict(rows[["image"]])
    np.testing.assert_array_equal(scored["prediction"].to_numpy(),
                                  expected["prediction"].to_numpy())
    np.testing.assert_allclose(scored["probability"], expected["probability"], rtol=1e-5,
                               atol=1e-6)


forest = train_hooks.random_forest(n_estimators=10)


@pytest.mark.timeout(420)
def test_train_ensemble_and_its_transform_run_on_the_connect_sessions_executors(connect,
                                                                                tmp_path):
    import mlflow
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    from dist_dl.ensemble import train_ensemble

    data = load_digits()
    cols = [f"f{i}" for i in range(data.data.shape[1])]
    pdf = pd.DataFrame(data.data, columns=cols)
    pdf["label"] = data.target.astype("int64")
    train, test = pdf.iloc[:1400].reset_index(drop=True), pdf.iloc[1400:].reset_index(drop=True)
    ens = train_ensemble(connect.createDataFrame(train), forest, num_models=3, feature_cols=cols,
                         label_col="label", combine="vote", output_dir=str(tmp_path / "out"),
                         tracking_uri=(tmp_path / "mlruns").as_uri())
    assert len(ens.member_scores) == 3 and sum(ens.member_rows) > 0.7 * len(train)
    y = test["label"].to_numpy()
    assert float((ens.predict(test) == y).mean()) >= 0.85
    scored = ens.transform(connect.createDataFrame(test)).toPandas()
    loaded = mlflow.pyfunc.load_model(ens.model_uri)
    np.testing.assert_array_equal(scored["prediction"].to_numpy(),
                                  np.asarray(loaded.predict(test[cols])))
    np.testing.assert_array_equal(scored["label"].to_numpy(), y)  # rows kept, in order


@pytest.mark.timeout(420)
def test_prepare_image_dataset_writes_shards_from_a_folder_and_a_dataframe(connect, tmp_path,
                                                                           capsys):
    from dist_dl.prepare import load_label_index, prepare_image_dataset
    from imagedata import WNIDS, digit_images, encode, write_imagenet_tree

    written = write_imagenet_tree(str(tmp_path / "train"), per_class=2, variety=False)
    (tmp_path / "train" / WNIDS[0] / "notes.JPEG").write_bytes(b"hello")
    with pytest.raises(ValueError, match=r"1 of 7 images.*notes\.JPEG.*on_bad_image='skip'"):
        prepare_image_dataset(str(tmp_path / "tree"), image_dir=str(tmp_path / "train"),
                              spark=connect)
    summary = prepare_image_dataset(str(tmp_path / "tree"), image_dir=str(tmp_path / "train"),
                                    on_bad_image="skip", spark=connect, progress_every=0.1)
    assert (summary.rows_in, summary.rows_written, summary.rows_skipped) == (7, 6, 1)
    assert "prepare-data " + str(tmp_path / "tree") + ": 7 images decoded" in capsys.readouterr().out
    assert load_label_index(str(tmp_path / "tree")) == {w: i for i, w in enumerate(WNIDS)}
    import pyarrow.parquet as pq

    rows = pq.read_table(str(tmp_path / "tree")).to_pylist()
    assert sorted(r["source_id"] for r in rows) == sorted(written)

    # A DataFrame of the Connect session (its rows built in the client).
    images = digit_images(5, size=16)
    frame = connect.createDataFrame([(encode(img), int(label) % 2, f"d{i}")
                                     for i, (img, label) in enumerate(images)],
                                    "jpeg binary, y long, id string")
    summary = prepare_image_dataset(str(tmp_path / "frame"), dataframe=frame, image_col="jpeg",
                                    label_col="y", source_id_col="id", classes=2, spark=connect,
                                    progress_every=0)
    assert (summary.rows_in, summary.rows_written) == (5, 5)
    rows = pq.read_table(str(tmp_path / "frame")).to_pylist()
    assert sorted((r["source_id"], r["label"]) for r in rows) == sorted(
        (f"d{i}", int(label) % 2) for i, (_, label) in enumerate(images))


def keras_fit_in_a_strategy(steps: int = 4):
    """A tf.distribute worker's Keras training, its model built in the
    strategy's scope (seeded per worker: the strategy makes them one).
    Returns the worker's weights."""
    import json
    import os

    import numpy as np
    import tensorflow as tf

    from dist_dl.core import compat

    keras = compat.keras()
    tf.random.set_seed(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * steps, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    print(f"worker {os.environ.get('RANK', '?')} trained")
    return np.concatenate([w.ravel() for w in model.get_weights()])


def keras_fit_without_a_strategy():
    """Single-worker Keras code (no strategy), as spark-tensorflow-distributor's
    default case runs it; MirroredStrategyRunner gives it one."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(tf.keras.optimizers.SGD(0.1),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return np.concatenate([w.ravel() for w in model.get_weights()])


@pytest.mark.timeout(420)
def test_the_tf_distribute_runners_train_one_model_on_the_connect_sessions_tasks(connect,
                                                                                  server):
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed in this profile")
    import numpy as np

    from dist_dl import MirroredStrategyRunner, TFDistributeRunner

    weights = TFDistributeRunner(np=2, spark=connect).run(keras_fit_in_a_strategy)
    assert np.abs(weights).sum() > 0
    assert _workers_left(server) == []
    weights = MirroredStrategyRunner(num_slots=2, use_gpu=False, spark=connect).run(
        keras_fit_without_a_strategy)
    assert np.abs(weights).sum() > 0
    assert _workers_left(server) == []


@pytest.mark.timeout(600)
def test_the_readmes_pipeline_from_a_connect_dataframe(connect, server, tmp_path):
    """The README's examples (images read with binaryFile, train_distributed
    on the DataFrame, TrainedModel.transform, score_dataframe), on the torch
    engine, from a Connect session's DataFrame: written once as shards by the
    session's executors, trained on, scored there."""
    from pyspark.sql import functions as F

    from dist_dl.prepare import write_digits_tree
    from dist_dl.score import score_dataframe
    from dist_dl.tracking.target import mlflow_target

    train_dir, _ = write_digits_tree(str(tmp_path / "digits"), image_size=16)
    images = (connect.read.format("binaryFile").option("recursiveFileLookup", "true")
              .load(train_dir)
              .withColumn("digit", F.regexp_extract("path", r"/(\d)/[^/]+$", 1)))
    rows = images.count()
    trained = train_distributed(images, image_col="content", label_col="digit", engine="torch",
                                model="small_cnn", image_size=16, num_workers=2, epochs=1,
                                batch_size=32, spark=connect, output_dir=str(tmp_path / "out"),
                                tracking_uri=(tmp_path / "mlruns").as_uri())
    assert len(trained.history["loss"]) == 1
    run = MlflowClient(trained.tracking_uri).get_run(trained.run_id)
    # Every row went to training or validation, once.
    assert int(run.data.params["data_rows"]) + int(run.data.params["validation_rows"]) == rows
    scored = trained.transform(images).select("path", "digit", "prediction", "probability")
    assert scored.count() == rows and scored.filter("prediction IS NULL").count() == 0
    with mlflow_target(trained.tracking_uri):
        counts = score_dataframe(images, trained.model_uri, image_col="content").groupBy(
            "prediction").count().collect()
    assert sum(r["count"] for r in counts) == rows
    assert _workers_left(server) == []


# The notebooks a user may open on serverless compute or a standard-access
# cluster (Spark Connect both): preparing data, train_distributed on a
# DataFrame, ensembles and the search, batch scoring, TorchDistributor. Each
# runs end to end from the Connect session (its get_spark() returns the active
# session), with its local widget defaults. The others need the classic SparkContext
# (HorovodRunner, the benchmark's Horovod jobs) or no Spark at all
# (the single-node baseline).
CONNECT_NOTEBOOKS = ("01_prepare_data", "04_train_distributed_dataframe",
                     # its ensembles and search train Keras models
                     pytest.param("05_ensembles_and_search", marks=pytest.mark.needs("tensorflow")),
                     "07_batch_scoring", "08_torch_distributor")


@pytest.mark.slow
@pytest.mark.profile_dbr19
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", CONNECT_NOTEBOOKS)
def test_the_notebooks_run_from_a_connect_session(name, connect, server, tmp_path, monkeypatch):
    import runpy
    from pathlib import Path

    monkeypatch.chdir(tmp_path)  # the notebooks write under ./runs
    notebook = Path(__file__).parents[2] / "notebooks" / f"{name}.py"
    namespace = runpy.run_path(str(notebook), run_name="__main__")
    assert namespace.get("result") is not None, f"{name} must leave its outcome in `result`"
    session = namespace.get("spark")
    assert session is None or is_connect(session), f"{name} ran on {session!r}"
    assert _workers_left(server) == []
