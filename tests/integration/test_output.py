"""The command line prints the library's own lines, not its dependencies' noise."""
import os
import subprocess
import sys

import pytest

from dist_dl.core.quiet import QUIET_ENV

# TensorFlow's C++ start-up lines (in every process that loads it), MLflow's
# artifact download bar and the Spark driver JVM's start-up lines: what
# `make demo` printed before.
SPARK_NOISE = ("Setting default log level", "To adjust logging level use sc.setLogLevel",
               "NativeCodeLoader", "spark.local.dir will be overridden")
NOISE = ("tensorflow/core", "cpu_feature_guard", "This TensorFlow binary is optimized",
         "rebuild TensorFlow with the appropriate compiler flags",
         "Downloading artifacts") + SPARK_NOISE

# A driver program that starts the embedded session with a deprecated key,
# whose warning must still show: only the start-up noise goes.
_START = """
import sys
from dist_dl.core.session import get_spark
conf = {"spark.yarn.executor.memoryOverhead": "512m"}
if len(sys.argv) > 1:
    conf["spark.driver.extraJavaOptions"] = "-Dlog4j2.configurationFile=" + sys.argv[1]
spark = get_spark("local[1]", conf=conf)
print(spark.range(5).count())
print(spark.sparkContext.getConf().get("spark.driver.extraJavaOptions"))
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_embedded_session_starts_quietly_and_keeps_warnings(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    done = subprocess.run([sys.executable, "-c", _START], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=190)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "5"
    noisy = [line for line in done.stderr.splitlines() if any(n in line for n in SPARK_NOISE)]
    assert not noisy, "\n".join(noisy)
    assert "spark.yarn.executor.memoryOverhead' has been deprecated" in done.stderr, done.stderr

    # The caller's own log4j 2 configuration is used as it is (its layout
    # shows), start-up lines and all.
    own = tmp_path / "own-log4j2.properties"
    own.write_text("rootLogger.level = info\nrootLogger.appenderRef.e.ref = e\n"
                   "appender.e.type = Console\nappender.e.name = e\n"
                   "appender.e.target = SYSTEM_ERR\nappender.e.layout.type = PatternLayout\n"
                   "appender.e.layout.pattern = OWN %p %c{1}: %m%n\n")
    done = subprocess.run([sys.executable, "-c", _START, str(own)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=190)
    assert done.returncode == 0, done.stderr
    options = done.stdout.splitlines()[1]
    assert options.count("log4j2.configurationFile") == 1 and str(own) in options
    assert "OWN WARN SparkConf: The configuration key" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_scoring_from_the_command_line_shows_no_tensorflow_or_mlflow_noise(spark, tmp_path):
    import mlflow
    import yaml

    from dist_dl.app import pipeline
    from dist_dl.core import compat
    from dist_dl.app.config import PipelineConfig, load_config
    from dist_dl.tracking import ImagePreprocessing, log_keras_classifier

    settings = {"data": {"source": "synthetic", "synthetic_rows": 24, "image_size": 16,
                         "classes": 3, "validation_fraction": 0.25,
                         "output": str(tmp_path / "shards")},
                "tracking": {"tracking_uri": (tmp_path / "mlruns").as_uri()},
                "score": {"output": str(tmp_path / "scored")}}
    pipeline.prepare_data(load_config(PipelineConfig, None, settings), spark=spark)
    mlflow.set_tracking_uri(settings["tracking"]["tracking_uri"])  # the fixture restores it
    spec = ImagePreprocessing(image_size=16)
    keras = compat.keras()  # tf-keras where Keras 3 is the default (dbr-15.4-ml)
    model = keras.Sequential([keras.Input(spec.input_shape), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(3)])
    settings["score"]["model_uri"] = log_keras_classifier(model, spec).model_uri
    config = tmp_path / "score.yaml"
    config.write_text(yaml.safe_dump(settings))

    # Without the variables (this test process sets one in conftest.py): the
    # command must set them itself, for its executors too.
    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}
    done = subprocess.run([sys.executable, "-m", "dist_dl.cli", "score", "--config", str(config)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    assert "dist_dl score: " in done.stdout and "rows scored with runs:/" in done.stdout
    noisy = [line for line in done.stderr.splitlines() if any(n in line for n in NOISE)]
    assert not noisy, "\n".join(noisy)
