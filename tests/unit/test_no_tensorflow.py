"""Where TensorFlow is not installed (Databricks Runtime 19 ML ships none),
each feature that needs it says so on the driver, before any worker or Spark
job starts: the package, the extra that installs it, and the PyTorch way
instead. TensorFlow is hidden here as if not installed (``None`` in
``sys.modules``); tests/integration/test_no_tensorflow.py runs the same
where it is really absent and torch is installed."""
import re
import sys

import pytest

from dist_dl.core.optional import PACKAGES, install_hint, require, require_installed

# What every such error says after what needs TensorFlow.
INSTALL = re.escape("needs tensorflow, which is not installed here: pip install "
                    "'dist_dl[tensorflow]' (or pip install 'tensorflow>=2.15'); Databricks "
                    "Runtime 19 ML and later ship no TensorFlow: train with PyTorch there "
                    "(train_distributed(engine='torch'), TorchDistributor)")


@pytest.fixture
def no_tensorflow(monkeypatch):
    for name in ("tensorflow", "horovod"):
        monkeypatch.setitem(sys.modules, name, None)


def _fail(*args, **kwargs):
    raise AssertionError("a worker started")


@pytest.mark.timeout(30)
def test_the_check_imports_nothing_and_names_the_extra(no_tensorflow, monkeypatch):
    with pytest.raises(ImportError, match="^the thing " + INSTALL + "$"):
        require_installed("tensorflow.keras", "the thing")
    with pytest.raises(ImportError, match=r"^the thing needs tensorflow, which cannot be "
                                          r"imported here \(.*\): pip install "
                                          r"'dist_dl\[tensorflow\]'"):
        require("tensorflow", "the thing")
    assert PACKAGES["tensorflow"] == ("tensorflow>=2.15", "tensorflow")
    assert install_hint("tensorflow").startswith("pip install 'dist_dl[tensorflow]'")
    # Installed: nothing is imported to say so.
    monkeypatch.delitem(sys.modules, "yaml", raising=False)
    require_installed("yaml", "the thing")
    assert "yaml" not in sys.modules


@pytest.mark.timeout(30)
def test_the_tensorflow_runners_refuse_before_any_worker_starts(no_tensorflow):
    from dist_dl import MirroredStrategyRunner, TFDistributeRunner

    runner = TFDistributeRunner(np=-2, backend=type("Never", (), {"run": _fail})())
    with pytest.raises(ImportError, match="^TFDistributeRunner " + INSTALL):
        runner.run(lambda: 1)
    for slots in (-2, 1):
        with pytest.raises(ImportError, match="^MirroredStrategyRunner " + INSTALL):
            MirroredStrategyRunner(num_slots=slots, local_mode=slots > 0,
                                   use_gpu=False).run(lambda: 1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("settings, what", [
    (dict(engine="tensorflow"), "engine='tensorflow'"),
    (dict(engine="horovod"), "engine='horovod'"),
    (dict(keras=3), "engine='auto' with keras=3"),
])
def test_the_tensorflow_engines_refuse_before_reading_the_data(no_tensorflow, settings, what):
    from dist_dl import train_distributed

    # The data is not looked at: the engine is checked first.
    with pytest.raises(ImportError, match="^" + re.escape(what) + " " + INSTALL):
        train_distributed("/no/such/shards", **settings)


@pytest.mark.timeout(30)
def test_the_keras_jobs_refuse_before_spark_starts(no_tensorflow):
    from dist_dl.app import pipeline
    from dist_dl.app.bench import run_benchmark
    from dist_dl.app.config import BenchConfig, PipelineConfig

    with pytest.raises(ImportError, match=r"^the search job \(each trial trains a Keras model, "
                                          r"dist_dl.train.single\) " + INSTALL):
        pipeline.search(PipelineConfig(), spark=object())
    with pytest.raises(ImportError, match=r"^the benchmark \(.*\) " + INSTALL):
        run_benchmark(BenchConfig(), workdir="/no/such/folder")


@pytest.mark.timeout(30)
def test_scoring_a_keras_model_refuses_and_a_torch_one_needs_torch(no_tensorflow, monkeypatch,
                                                                   tmp_path):
    """The driver reads which framework the executors will load the model
    with from its MLmodel file (a torch model scores where TensorFlow is
    missing: tests/integration/test_no_tensorflow.py)."""
    from mlflow.models import Model

    from dist_dl.score.dataframe import _model_image_col

    def logged(name, **metadata):
        model = Model(metadata={"image_col": "pixels", **metadata})
        model.add_flavor("python_function", loader_module="x")
        (tmp_path / name).mkdir()
        model.save(str(tmp_path / name / "MLmodel"))
        return str(tmp_path / name)

    keras_model = logged("keras", preprocessing={})
    with pytest.raises(ImportError, match="^scoring the Keras model 'runs:/r/model' " + INSTALL):
        _model_image_col(keras_model, "runs:/r/model")
    torch_model = logged("torch", engine="torch")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"^scoring the torch model 'm' needs torch, which is "
                                          r"not installed here: pip install 'dist_dl\[torch\]'"):
        _model_image_col(torch_model, "m")
