"""MLflow tracking: the logged classifier loads and predicts like the Keras
model it came from, on real JPEG bytes; registration; params and metrics."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

pytest.importorskip("tensorflow", reason="its tests train or load Keras models: "
                                  "TensorFlow is not installed (profile dbr-19-ml)")

from dist_dl.core import compat
from dist_dl.tracking import (ImagePreprocessing, KerasImageClassifier, MlflowEpochLogger,
                              decode_images, log_epoch_metrics, log_keras_classifier, log_params,
                              log_tensorboard)
from without_dist_dl import predict_without_dist_dl

pytestmark = [pytest.mark.profile_subset_164]

SPEC = ImagePreprocessing(image_size=(24, 24), channels=3, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


def digit_jpegs(count: int = 40):
    """Real JPEG bytes: sklearn's 8x8 digits scaled up to 32x32 RGB (so the
    pyfunc's resize to 24x24 is exercised too), and their labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    blobs = []
    for pixels in digits.images[:count]:
        img = Image.fromarray((pixels * 255 / 16).astype("uint8"), mode="L").convert("RGB")
        buffer = io.BytesIO()
        img.resize((32, 32), Image.NEAREST).save(buffer, format="JPEG", quality=90)
        blobs.append(buffer.getvalue())
    return blobs, digits.target[:count].astype("int32")


def small_classifier(softmax: bool = False, keras3: bool = False):
    # keras3: a model of the keras package (Keras 3 from TensorFlow 2.16 on).
    if keras3:
        import keras
    else:
        keras = compat.keras()

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input(SPEC.input_shape),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax" if softmax else None),
    ])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax))
    return model


@pytest.fixture(scope="module")
def trained():
    blobs, labels = digit_jpegs()
    model = small_classifier()
    model.fit(decode_images(blobs, SPEC), labels, epochs=3, batch_size=10, verbose=0)
    return model, blobs, labels


@pytest.fixture
def tracking(tmp_path):
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    yield tmp_path
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)
    mlflow.set_registry_uri(None)


def _expected(model, blobs):
    probs = tf_softmax(model.predict(decode_images(blobs, SPEC), verbose=0))
    return probs.argmax(axis=1), probs


def tf_softmax(logits):
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def test_preprocessing_decodes_resizes_and_normalises():
    from PIL import Image

    pixels = np.arange(16 * 16 * 3, dtype="uint8").reshape(16, 16, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buffer, format="PNG")  # lossless
    spec = ImagePreprocessing(16, mean=(0.5, 0.4, 0.3), std=0.5)
    (array,) = decode_images([buffer.getvalue()], spec)
    np.testing.assert_allclose(array, (pixels / 255.0 - [0.5, 0.4, 0.3]) / 0.5, rtol=1e-6, atol=1e-6)
    assert decode_images([buffer.getvalue()], ImagePreprocessing((8, 4), channels=1)).shape == (1, 8, 4, 1)

    # Central square crop: 20x30 image, half the short side -> rows 5:15, columns 10:20.
    wide = np.random.default_rng(0).integers(0, 255, (20, 30, 3)).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(wide, mode="RGB").save(buffer, format="PNG")
    (cropped,) = decode_images([buffer.getvalue()], ImagePreprocessing(10, crop_fraction=0.5))
    np.testing.assert_allclose(cropped, wide[5:15, 10:20] / 255.0, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="image 1 cannot be decoded"):
        decode_images([buffer.getvalue(), b"not an image"], spec)
    with pytest.raises(ValueError, match="image 0 is null"):
        decode_images([None], spec)


def test_preprocessing_matches_the_readers_eval_transform():
    """Serving must see the pixels validation saw: same crop window, same
    decoder, resize and rounding to whole pixel values as dist_dl.read's
    eval transform, normalised (the reader's default) or left as pixels for
    the model's first layer (normalize=False, what the engines train on)."""
    augment = pytest.importorskip("dist_dl.read.augment")
    import dataclasses

    import tensorflow as tf
    from PIL import Image

    config = augment.ReaderConfig(image_size=24, eval_crop_fraction=0.875)
    spec = ImagePreprocessing(24, mean=config.mean, std=config.std, crop_fraction=0.875,
                              integer_pixels=True)
    pixels_config = dataclasses.replace(config, normalize=False)
    pixels_spec = ImagePreprocessing(24, rescale=1.0, crop_fraction=0.875, integer_pixels=True)
    rng = np.random.default_rng(1)
    for height, width in ((40, 56), (57, 33), (24, 24)):
        smooth = rng.integers(0, 255, (height // 4 + 1, width // 4 + 1, 3)).astype("uint8")
        img = Image.fromarray(smooth, mode="RGB").resize((width, height), Image.BILINEAR)
        buffer = io.BytesIO()
        img.save(buffer, format="JPEG", quality=90)
        expected = augment.eval_transform(tf.constant(buffer.getvalue()), config).numpy()
        (actual,) = decode_images([buffer.getvalue()], spec)
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-4)
        pixels = augment.eval_transform(tf.constant(buffer.getvalue()), pixels_config).numpy()
        assert pixels.dtype == np.uint8
        (served,) = decode_images([buffer.getvalue()], pixels_spec)
        np.testing.assert_array_equal(served, pixels.astype("float32"))


@pytest.mark.parametrize("kwargs, message", [
    ({"image_size": 0}, "image_size"),
    ({"image_size": 8, "crop_fraction": 1.5}, "crop_fraction"),
    ({"image_size": 8, "channels": 2}, "channels"),
    ({"image_size": 8, "mean": (0.1, 0.2)}, "mean must be a number or 3 numbers"),
    ({"image_size": 8, "std": 0}, "std must not contain 0"),
])
def test_bad_preprocessing_names_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImagePreprocessing(**kwargs)


@pytest.mark.timeout(240)
def test_logged_model_predicts_like_the_keras_model(trained, tracking):
    model, blobs, labels = trained
    with mlflow.start_run() as run:
        logged = log_keras_classifier(model, SPEC, image_col="jpeg", class_names=list("0123456789"))
    assert logged.model_uri == f"runs:/{run.info.run_id}/model" and logged.registered_version is None

    loaded = mlflow.pyfunc.load_model(logged.model_uri)
    frame = pd.DataFrame({"jpeg": blobs, "other": range(len(blobs))}, index=range(100, 100 + len(blobs)))
    result = loaded.predict(frame)
    expected_pred, expected_probs = _expected(model, blobs)
    assert list(result.columns) == ["prediction", "probability", "probabilities"]
    assert list(result.index) == list(frame.index)
    assert result["prediction"].dtype == np.int64
    np.testing.assert_array_equal(result["prediction"].to_numpy(), expected_pred)
    np.testing.assert_allclose(np.stack(result["probabilities"]), expected_probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result["probability"], expected_probs.max(axis=1), rtol=1e-5, atol=1e-6)
    assert (result["prediction"].to_numpy() == labels).mean() > 0.3  # it did learn something

    with pytest.raises(Exception, match="jpeg"):
        loaded.predict(pd.DataFrame({"image": blobs[:2]}))


def test_softmax_output_is_detected_and_not_softmaxed_twice(tracking):
    model = small_classifier(softmax=True)
    blobs, _ = digit_jpegs(6)
    logged = log_keras_classifier(model, SPEC)  # no active run: one is started and ended
    assert mlflow.active_run() is None
    loaded = mlflow.pyfunc.load_model(logged.model_uri)
    assert loaded.metadata.metadata["from_logits"] is False
    result = loaded.predict(pd.DataFrame({"image": blobs}))
    probs = model.predict(decode_images(blobs, SPEC), verbose=0)
    np.testing.assert_allclose(np.stack(result["probabilities"]), probs, rtol=1e-5, atol=1e-6)


def test_shape_mismatch_names_the_fix():
    with pytest.raises(ValueError, match="image_size"):
        log_keras_classifier(small_classifier(), ImagePreprocessing(32))


def test_a_model_of_another_keras_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="must be a Keras Model of .*, got builtins.object"):
        log_keras_classifier(object(), SPEC)
    # dbr-15.4-ml: `keras` and plain tf.keras are Keras 3, and 3.2.1 is older
    # than the 3.5 keras=3 needs (from 3.5 on a Keras 3 model is logged:
    # test_a_keras3_model_is_logged_as_one_and_loads_where_dist_dl_is_not_installed).
    if compat.keras3_default() and compat.keras3_training_problem() is not None:
        import keras

        model = keras.Sequential([keras.Input(SPEC.input_shape), keras.layers.Flatten(),
                                  keras.layers.Dense(10)])
        with pytest.raises(ValueError, match=r"Keras 3 model \(keras\..*Sequential\).*"
                                             r"from Keras 3\.5 on \(this is 3\.2\.1\).*"
                                             r"dist_dl.core.compat.keras\(\).*TF_USE_LEGACY_KERAS=1"):
            log_keras_classifier(model, SPEC)


def _check_registration(model, blobs):
    first = log_keras_classifier(model, SPEC, registered_model_name="digits")
    second = log_keras_classifier(model, SPEC, registered_model_name="digits")
    assert (first.registered_version, second.registered_version) == (1, 2)
    assert second.registered_uri == "models:/digits/2"
    loaded = mlflow.pyfunc.load_model("models:/digits/1")
    result = loaded.predict(pd.DataFrame({"image": blobs[:5]}))
    np.testing.assert_array_equal(result["prediction"], _expected(model, blobs[:5])[0])


@pytest.mark.timeout(240)
def test_register_in_the_file_store_registry(trained, tracking):
    model, blobs, _ = trained
    # With a file tracking URI, MLflow 2.22's registry is the same file store.
    _check_registration(model, blobs)


@pytest.mark.timeout(240)
def test_register_in_a_sqlite_registry(trained, tracking):
    model, blobs, _ = trained
    mlflow.set_registry_uri(f"sqlite:///{tracking / 'registry.db'}")
    _check_registration(model, blobs)


def test_params_and_epoch_metrics(tracking):
    with mlflow.start_run() as run:
        log_params({"model": {"name": "small_cnn", "classes": 10}, "num_workers": 2})
        log_epoch_metrics({"loss": 1.5, "accuracy": np.float32(0.5)}, epoch=1)
        log_epoch_metrics({"loss": 1.0}, epoch=2)
        with pytest.raises(ValueError, match="'note'"):
            log_epoch_metrics({"note": "n/a"}, epoch=2)
    client = mlflow.tracking.MlflowClient()
    data = client.get_run(run.info.run_id).data
    assert data.params == {"model.name": "small_cnn", "model.classes": "10", "num_workers": "2"}
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.5), (2, 1.0)]


def test_epoch_logger_callback_logs_metrics_and_throughput(tracking):
    model = small_classifier()
    blobs, labels = digit_jpegs(20)
    with mlflow.start_run() as run:
        model.fit(decode_images(blobs, SPEC), labels, epochs=2, batch_size=10, verbose=0,
                  callbacks=[MlflowEpochLogger(images_per_epoch=20)])
    client = mlflow.tracking.MlflowClient()
    metrics = client.get_run(run.info.run_id).data.metrics
    assert {"loss", "epoch_seconds", "images_per_second"} <= set(metrics)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "images_per_second")] == [1, 2]


def test_tensorboard_logs_become_artifacts(tracking):
    model = small_classifier()
    blobs, labels = digit_jpegs(10)
    log_dir = tracking / "tb"
    keras = compat.keras()

    model.fit(decode_images(blobs, SPEC), labels, epochs=1, batch_size=10, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(str(log_dir))])
    with mlflow.start_run() as run:
        assert log_tensorboard(log_dir) >= 1
        with pytest.raises(ValueError, match="not a directory"):
            log_tensorboard(tracking / "missing")
    listed = mlflow.artifacts.list_artifacts(run_id=run.info.run_id, artifact_path="tensorboard")
    assert {a.path for a in listed} >= {"tensorboard/train"}


def test_pyfunc_rejects_bad_settings():
    with pytest.raises(ValueError, match="from_logits"):
        KerasImageClassifier(SPEC, from_logits="yes")
    with pytest.raises(ValueError, match="preprocessing"):
        KerasImageClassifier({"image_size": 8}, from_logits=True)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_logged_model_loads_where_dist_dl_is_not_installed(trained, tracking):
    model, blobs, _ = trained
    logged = log_keras_classifier(model, SPEC)
    local = mlflow.artifacts.download_artifacts(logged.model_uri, dst_path=str(tracking / "dl"))
    assert _predicted_without_dist_dl(local, blobs[:8], tracking) == \
        _expected(model, blobs[:8])[0].tolist()


def _predicted_without_dist_dl(local: str, blobs, tracking) -> list:
    """The logged model's predictions, loaded in a Python where dist_dl does not import."""
    return predict_without_dist_dl(local, blobs, tracking)["prediction"]


@pytest.mark.timeout(240)
@pytest.mark.skipif(compat.keras3_training_problem() is not None,
                    reason=str(compat.keras3_training_problem()))
def test_a_keras3_model_is_logged_as_one_and_loads_where_dist_dl_is_not_installed(tracking):
    # What train_distributed(keras=3) logs: a .keras file of Keras 3, loaded by
    # the pyfunc with Keras 3, its requirements pinning keras rather than tf-keras.
    from importlib.metadata import version

    blobs, labels = digit_jpegs()
    model = small_classifier(keras3=True)
    assert compat.is_keras3_model(model)
    model.fit(decode_images(blobs, SPEC), labels, epochs=3, batch_size=10, verbose=0)
    logged = log_keras_classifier(model, SPEC)
    local = mlflow.artifacts.download_artifacts(logged.model_uri, dst_path=str(tracking / "dl"))
    requirements = (Path(local) / "requirements.txt").read_text().split()
    assert f"keras=={version('keras')}" in requirements
    assert not any(r.startswith("tf-keras") for r in requirements)
    assert _predicted_without_dist_dl(local, blobs[:8], tracking) == \
        _expected(model, blobs[:8])[0].tolist()


def test_calls_from_threads_share_the_process_wide_tracking_uri(tmp_path):
    """MLflow's tracking URI is one per process: two library calls of one
    store at once both log there until the last one leaves (the first to
    leave used to put its caller's URI back under the other); a call of
    another store waits for them, then the caller's URI is back. Where
    MLflow's active run is one per process too (runtime 15.4's 2.13.1), a
    call of the same store waits as well."""
    import threading

    from dist_dl.tracking.target import mlflow_target, runs_per_thread

    caller = mlflow.get_tracking_uri()
    a, b = (tmp_path / "a").as_uri(), (tmp_path / "b").as_uri()
    seen, inside, release = {}, threading.Event(), threading.Event()

    def long_call():
        with mlflow_target(a):
            inside.set()
            release.wait(30)
            seen["long, at its end"] = mlflow.get_tracking_uri()

    def other_store():
        with mlflow_target(b):
            seen["other store, entered after the long call"] = release.is_set()
            seen["other store"] = mlflow.get_tracking_uri()

    def same_store():
        with mlflow_target(a):
            seen["same store, entered after the long call"] = release.is_set()

    first = threading.Thread(target=long_call)
    first.start()
    assert inside.wait(30)
    together = threading.Thread(target=same_store)
    together.start()
    together.join(0.5)
    assert together.is_alive() != runs_per_thread()   # waits only for per-process runs
    waiting = threading.Thread(target=other_store)
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()                   # it waits for the store a call uses
    release.set()
    for thread in (first, together, waiting):
        thread.join(30)
    assert seen == {"long, at its end": a, "other store, entered after the long call": True,
                    "other store": b,
                    "same store, entered after the long call": not runs_per_thread()}
    assert mlflow.get_tracking_uri() == caller


_RANK_0_WHOSE_FIT_FAILS = '''
import json, os, sys, types
import mlflow
from mlflow.tracking import MlflowClient
from dist_dl.train.engines.keras_common import fit_and_log

uri = sys.argv[1]
client = MlflowClient(uri)
run = client.create_run(client.create_experiment("training"))
meta = os.path.join(run.info.artifact_uri.replace("file://", "").rsplit("/", 1)[0], "meta.yaml")
before = os.stat(meta).st_mtime_ns
spec = types.SimpleNamespace(config=types.SimpleNamespace(epochs=2), callbacks=None,
                             tracking_uri=uri, registry_uri=None, run_id=run.info.run_id)

def fit(callbacks):
    mlflow.log_metric("loss", 0.5, step=0)
    raise RuntimeError("a peer left the allreduce")

try:
    fit_and_log(spec, None, None, [], 0, 0, fit=fit)
except RuntimeError as exc:
    failed = str(exc)
print(json.dumps({"meta": meta, "before": before, "failed": failed,
                  "active_after": mlflow.active_run() is not None}))
'''


@pytest.mark.timeout(120)
def test_a_training_worker_logs_into_the_drivers_run_and_never_writes_its_status(tmp_path):
    """Rank 0 logs into the run the driver created, whose status only the
    driver sets: MLflow's file store rewrites a run's meta.yaml in place to
    set a status, and a worker stopped during that rewrite (the launcher
    stops a failed attempt's workers) left it empty, the run unusable (the
    reliability suite's F1 in CI). A rank 0 whose fit fails, then exits
    (MLflow's atexit hook ends any run still active), leaves meta.yaml as the
    driver wrote it, the run RUNNING for the driver to retry or end, and the
    metric it logged in the run."""
    import json
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    done = subprocess.run([sys.executable, "-c", _RANK_0_WHOSE_FIT_FAILS, uri],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["failed"] == "a peer left the allreduce" and not seen["active_after"], seen
    assert os.stat(seen["meta"]).st_mtime_ns == seen["before"], "a worker rewrote meta.yaml"
    run_id = os.path.basename(os.path.dirname(seen["meta"]))
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.metrics == {"loss": 0.5}


_LOGGING_WHILE_PYSPARK_ML_IMPORTS = r'''
import importlib.abc, importlib.machinery, sys, threading, time
stalled = threading.Event()

class SlowLoader:
    """pyspark.ml.param, executed 3 s late: another thread's import of
    pyspark.ml (a Horovod job starting) caught half-way."""
    def __init__(self, real):
        self.real = real
    def create_module(self, spec):
        return self.real.create_module(spec)
    def exec_module(self, module):
        stalled.set()
        time.sleep(3)
        self.real.exec_module(module)

class Stall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "pyspark.ml.param" or stalled.is_set():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = SlowLoader(spec.loader)
        return spec

sys.meta_path.insert(0, Stall())
import mlflow
from mlflow.entities import Param
from dist_dl.tracking.target import mlflow_target

importer = threading.Thread(target=lambda: __import__("pyspark.ml"))
importer.start()
stalled.wait(60)
with mlflow_target(sys.argv[1], "params") as experiment_id:
    client = mlflow.tracking.MlflowClient()
    run = client.create_run(experiment_id)
    client.log_batch(run.info.run_id, params=[Param("epochs", "1")])
importer.join()
print("logged", client.get_run(run.info.run_id).data.params)
'''


@pytest.mark.timeout(120)
def test_parameters_log_while_another_thread_imports_pyspark_ml(tmp_path):
    """MLflow's Param() reads pyspark.ml.param.Param once "pyspark.ml" is in
    sys.modules; a driver thread that logs while another thread is half-way
    through importing pyspark.ml (Horovod's Spark runner starting) failed with
    "cannot access submodule 'ml' of module 'pyspark'". The logging waits for
    that import (dist_dl.core.imports)."""
    script = tmp_path / "race.py"
    script.write_text(_LOGGING_WHILE_PYSPARK_ML_IMPORTS)
    done = subprocess.run([sys.executable, str(script), (tmp_path / "mlruns").as_uri()],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "logged {'epochs': '1'}" in done.stdout, done.stdout[-2000:]


def test_a_metric_file_left_empty_is_removed_and_the_run_reads_again(tmp_path):
    """MLflow's file store creates a metric's file, then writes its line: a
    writer stopped between the two leaves a run no read survives
    (mlflow/mlflow#3052) until the empty file is gone."""
    from mlflow.tracking import MlflowClient

    from dist_dl.tracking.target import drop_unwritten_metrics

    uri = (tmp_path / "mlruns").as_uri()
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "loss", 0.5, step=1)
    metrics = tmp_path / "mlruns" / run.info.experiment_id / run.info.run_id / "metrics"
    (metrics / "learning_rate").touch()
    with pytest.raises(Exception, match="malformed"):
        client.get_run(run.info.run_id)
    assert drop_unwritten_metrics(uri, run.info.run_id) == ["learning_rate"]
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}
    assert drop_unwritten_metrics(uri, run.info.run_id) == []
    assert drop_unwritten_metrics("databricks", run.info.run_id) == []


@pytest.mark.timeout(300)
def test_an_attempt_that_left_an_empty_metric_file_is_retried_into_a_readable_run(tmp_path,
                                                                                   capsys):
    from mlflow.tracking import MlflowClient

    from dist_dl import train_distributed
    from dist_dl.prepare import make_synthetic_images

    import train_hooks

    shards = str(tmp_path / "shards")
    make_synthetic_images(shards, rows=16, image_size=16, classes=2, rows_per_row_group=4)
    uri = (tmp_path / "mlruns").as_uri()
    trained = train_distributed(shards, model=train_hooks.plain_cnn, epochs=2, num_workers=2,
                                batch_size=4, image_size=16, validation_fraction=0.0,
                                max_retries=1, backend="local", tracking_uri=uri,
                                output_dir=str(tmp_path / "out"),
                                callbacks=train_hooks.UnwrittenMetricAt(1, str(tmp_path / "once")))
    assert "unwritten of run" in capsys.readouterr().out
    run = MlflowClient(uri).get_run(trained.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["dist_dl.attempts"] == "2"
    assert "unwritten" not in run.data.metrics and run.data.metrics["loss"] > 0
