"""The library where TensorFlow is not installed and torch is (Databricks
Runtime 19 ML, profile dbr-19-ml): every module imports without it, the
engine "auto" is torch, a runner that needs what is missing says so before
any worker starts, and the demo pipeline (`make demo PROFILE=dbr-19-ml`:
`dist-dl pipeline --config demo-torch`) prepares, trains, registers,
evaluates and scores on the torch engine. Each runs in a Python whose
finder leaves TensorFlow and Keras out (tests/support/no_tensorflow.py), so
that it proves the same in an environment that has them."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra)")

from no_tensorflow import env_without_tensorflow  # noqa: E402

pytestmark = pytest.mark.profile_dbr19

_IMPORT_EVERYTHING = """
import importlib, pkgutil, sys
import dist_dl

def job():
    return 1

try:
    import tensorflow
except ImportError:
    pass
else:
    raise SystemExit("tensorflow imports here")
# Left out: entry points run as `python -m`, and the one of Horovod's Spark
# workers (it imports Horovod: it runs only where HorovodRunner started it).
modules = [m.name for m in pkgutil.walk_packages(dist_dl.__path__, "dist_dl.")
           if not m.name.endswith("__main__")
           and m.name != "dist_dl.launch.horovod._spark_worker_main"]
for name in modules:
    importlib.import_module(name)
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "keras", "tf_keras",
                                                          "horovod"})
print("imported", len(modules), "modules; loaded", loaded)

from dist_dl.launch import auto_engine
print("auto_engine", auto_engine())

from dist_dl import HorovodRunner, TFDistributeRunner
for runner in (HorovodRunner(np=-2), TFDistributeRunner(np=-2)):
    try:
        runner.run(job)
    except ImportError as exc:
        print("refused:", exc)
"""


@pytest.mark.timeout(120)
def test_every_module_imports_without_tensorflow_and_auto_is_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", _IMPORT_EVERYTHING], capture_output=True,
                          text=True, timeout=100, env=env_without_tensorflow(tmp_path / "site"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert "loaded []" in out and int(out.split("imported ")[1].split()[0]) > 100
    assert "auto_engine torch" in out
    refusals = [line for line in out.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2, out
    assert ("HorovodRunner needs Horovod, which is not installed here (Databricks Runtime 16.0 "
            "ML and later ship none): run a PyTorch function with TorchDistributor"
            ) in refusals[0]
    assert ("TFDistributeRunner needs tensorflow, which is not installed here: pip install "
            "'dist_dl[tensorflow]'") in refusals[1]


@pytest.mark.slow  # the whole demo: 2.4 min on this 2-core machine, shared with other work
@pytest.mark.timeout(600)
def test_the_torch_demo_prepares_trains_registers_evaluates_and_scores(tmp_path):
    import pyarrow.parquet as pq
    from mlflow.tracking import MlflowClient

    done = subprocess.run([sys.executable, "-m", "dist_dl.cli", "pipeline", "--config",
                           "demo-torch"], capture_output=True, text=True, timeout=570,
                          cwd=tmp_path, env=env_without_tensorflow(tmp_path / "site"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "dist_dl pipeline: done" in done.stdout

    client = MlflowClient((tmp_path / "runs" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("dist_dl-demo-torch")
                                 .experiment_id])
    params, metrics = run.data.params, run.data.metrics
    assert params["train.engine"] == "torch" and params["backend"] == "spark"
    assert metrics["num_workers"] == 2
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == 5 and losses[-1] < losses[0]  # it learns
    assert metrics["val_accuracy"] >= 0.9 and metrics["eval_accuracy"] >= 0.9
    # The evaluate step promoted the registered model; score used it.
    version = client.get_model_version_by_alias("digits_small_cnn_torch", "champion")
    assert version.run_id == run.info.run_id
    scored = pq.read_table(str(tmp_path / "runs" / "scored-torch")).to_pandas()
    assert len(scored) == 363 and {"prediction", "probability", "label"} <= set(scored.columns)
    assert (scored["prediction"] == scored["label"]).mean() >= 0.9


@pytest.mark.timeout(60)
def test_resnet50_without_torchvision_is_refused_before_any_worker_starts(monkeypatch):
    from dist_dl import train_distributed

    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if not installed
    with pytest.raises(ImportError, match=r"^model 'resnet50' of the torch engine is "
                                          r"torchvision's ResNet50, and torchvision is not "
                                          r"installed here: pip install torchvision"):
        train_distributed("/no/such/shards", engine="torch", model="resnet50")
