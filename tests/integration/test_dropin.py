"""HorovodRunner as a drop-in for Databricks' sparkdl.HorovodRunner: its
documented examples run unchanged apart from the import, and its documented
behaviours hold (output of local workers, LogCallback, log size, busy slots,
progress bars). Real Horovod workers, real Spark, real Petastorm."""
from __future__ import annotations

import re
import threading
import time

import cloudpickle
import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="its tests train or load Keras models: "
                                  "TensorFlow is not installed (profile dbr-19-ml)")

import dbx_examples
import workers
from dist_dl import HorovodRunner
from dist_dl.core import compat

cloudpickle.register_pickle_by_value(workers)
cloudpickle.register_pickle_by_value(dbx_examples)


@pytest.mark.slow
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(240)
def test_databricks_mnist_example_trains_with_horovod_callbacks(tmp_path, capsys):
    checkpoint = str(tmp_path / "checkpoint-{epoch}.weights.h5")
    history = HorovodRunner(np=-2).run(dbx_examples.train_hvd, checkpoint_path=checkpoint,
                                       learning_rate=1.0)
    out = capsys.readouterr().out
    # It learns (3 short epochs at the example's learning rate: well above chance, 0.1).
    assert history["loss"][-1] < history["loss"][0] and history["val_accuracy"][-1] > 0.5, history
    # LogCallback: each epoch's logs reach the driver, from rank 0 only.
    epochs = re.findall(r"^\[0\] epoch (\d): .*val_accuracy: ", out, re.M)
    assert epochs == ["1", "2", "3"], out[-3000:]
    assert not re.search(r"^\[1\] epoch", out, re.M)
    # np < 0 streams the workers' own output (Keras' verbose=2 lines) by default.
    assert re.search(r"^\[1\]<stdout>:.*loss", out, re.M), out[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"checkpoint-{e}.weights.h5" for e in (1, 2, 3)]


# Spark tasks, Petastorm and two Horovod workers: 210-300 s at load 10-20.
@pytest.mark.slow
@pytest.mark.needs("petastorm")
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(480)
def test_databricks_petastorm_converter_example_on_spark_tasks(spark, tmp_path):
    from petastorm.spark import SparkDatasetConverter, make_spark_converter
    from pyspark.sql import functions as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = [(row.astype("float32").tolist(), int(label))
            for row, label in zip(digits.data / 16.0, digits.target)]
    df = spark.createDataFrame(rows, "features array<float>, label long")
    df_train, df_val = df.randomSplit([0.8, 0.2], seed=1)
    # randomSplit sorts each partition by every column (Spark's way of making
    # the split repeatable): by pixel values here, which orders the rows
    # nearly by label, and petastorm's reader keeps that order, so the
    # batches would hold one or two digits each. The rows in random order,
    # as a real table's arrive.
    df_train = df_train.orderBy(F.rand(seed=2)).repartition(2)  # a row group per worker
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{tmp_path}/cache")
    dbx_examples.converter_train = make_spark_converter(df_train)
    dbx_examples.converter_val = make_spark_converter(df_val)
    try:
        val_loss, val_accuracy = HorovodRunner(np=2, spark=spark).run(
            dbx_examples.train_and_evaluate_hvd, lr=0.1)
    finally:
        for converter in (dbx_examples.converter_train, dbx_examples.converter_val):
            converter.delete()
        dbx_examples.converter_train = dbx_examples.converter_val = None
    print(f"validation loss {val_loss:.3f}, accuracy {val_accuracy:.3f}")
    # It learns (chance is 0.1): 3 epochs of about 22 steps from an unseeded
    # start end at 0.94 to 0.98 (six runs).
    assert np.isfinite(val_loss) and val_accuracy > 0.8, (val_loss, val_accuracy)


_NOTEBOOK_TOP = """
import sys, cloudpickle
from tensorflow import keras          # a notebook's first cell: a lazy module
from dist_dl.core import compat

def get_model():                      # captures it, as the example's functions do
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

compat.pickle_tensorflow_lazy_modules_by_name()
sys.stdout.buffer.write(cloudpickle.dumps(get_model))
"""

_WORKER = """
import sys, pickle
model = pickle.loads(sys.stdin.buffer.read())()
print(type(model).__module__.split(".")[0])
"""


# Two processes import TensorFlow, one after the other (each up to a minute on
# a loaded 2-core machine).
@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensorflow_lazy_modules_pickle_by_name(tmp_path):
    """A captured ``from tensorflow import keras`` reaches a worker by name
    and is that worker's tf.keras (Keras 2 there where Keras 3 is the default)."""
    import os
    import subprocess
    import sys

    shipped = subprocess.run([sys.executable, "-c", _NOTEBOOK_TOP], capture_output=True,
                             timeout=140, check=True).stdout
    env = dict(os.environ, **compat.worker_env())
    worker = subprocess.run([sys.executable, "-c", _WORKER], input=shipped, capture_output=True,
                            timeout=140, env=env)
    assert worker.returncode == 0, worker.stderr.decode()[-3000:]
    expected = "tf_keras" if compat.keras3_default() else "keras"
    assert worker.stdout.decode().split()[-1] == expected


_LIBRARY_KERAS = """
from dist_dl.core import compat
keras = compat.keras()
from tensorflow.python.autograph.impl import conversion
print(keras.__name__, conversion.is_allowlisted(keras.Model.train_step))
"""


@pytest.mark.profile_subset_164
@pytest.mark.timeout(180)
def test_autograph_leaves_the_library_keras_alone():
    """The Keras the library trains with is not converted by AutoGraph, tf-keras
    included (TensorFlow 2.16 converts it: compat.skip_autograph_of_tf_keras)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _LIBRARY_KERAS], capture_output=True, timeout=150)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    name, allowlisted = run.stdout.decode().split()[-2:]
    assert (name, allowlisted) == (compat.keras().__name__, "True")


@pytest.mark.profile_subset_164
def test_missing_tf_keras_is_named_with_its_install(monkeypatch):
    monkeypatch.setattr(compat, "keras3_default", lambda: True)
    monkeypatch.setattr(compat, "_tf_keras_installed", lambda: False)
    tf_version = compat._version("tensorflow-cpu") or compat._version("tensorflow")
    wanted = ".".join(tf_version.split(".")[:2])
    with pytest.raises(ImportError, match=re.escape(f"pip install 'tf-keras=={wanted}.*'")):
        compat.keras()
    assert compat.worker_env() == {}


@pytest.mark.slow
@pytest.mark.needs("horovod.tensorflow")
def test_workers_get_keras_2_where_keras_3_is_the_default():
    env = HorovodRunner(np=-1).run(workers.keras_in_worker)
    if compat.keras3_default():
        assert env[:2] == ("1", "tf_keras")
    else:
        assert env[1] != "tf_keras"
    # AutoGraph converts none of Keras's own functions, tf-keras's included
    # (TensorFlow 2.16's rules name only `keras`: compat.skip_autograph_of_tf_keras),
    # nor Horovod's (no TensorFlow's rules name it: compat.skip_autograph_of_horovod).
    assert env[2] is True
    assert env[3] == [True, True, True]
    # A training step rewrites Keras's own train_function (a tf.function of
    # Keras's, which AutoGraph converts as a user's) and none of the functions
    # Horovod makes tf.functions of: the gradients' allreduce, broadcast_variables's group.
    assert env[4] == ["train_function"], env[4]


@pytest.mark.profile_subset_164
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(120)
def test_np_below_zero_streams_output_unless_told_otherwise(capsys):
    HorovodRunner(np=-2).run(workers.talk, message="hello")
    out = capsys.readouterr().out
    assert "[0]<stdout>:plain stdout line from 0" in out and "[1] hello from rank 1" in out
    HorovodRunner(np=-2, driver_log_verbosity="log_callback_only").run(workers.talk, message="hi")
    out = capsys.readouterr().out
    assert "[1] hi from rank 1" in out and "plain stdout line" not in out


@pytest.mark.profile_subset_164
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(120)
def test_log_to_driver_cuts_messages_at_4000_characters(capsys):
    HorovodRunner(np=-1).run(workers.long_message, length=10_000)
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("[0] x"))
    assert line == "[0] " + "x" * 4000


@pytest.mark.profile_subset_164
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(120)
def test_progress_bar_redraws_keep_the_rank_prefix(capsys):
    HorovodRunner(np=-2).run(workers.progress_bar, steps=3)
    out = capsys.readouterr().out
    for rank in (0, 1):
        line = next(l for l in out.split("\n") if f"of rank {rank}" in l)  # not splitlines: it splits at \r
        assert line.split("\r") == [f"[{rank}]<stdout>:"] + [
            f"[{rank}]<stdout>:step {i}/3 of rank {rank}" for i in (1, 2, 3)]


@pytest.mark.slow
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(240)
def test_busy_slots_are_waited_for_with_progress(spark, capsys):
    sc = spark.sparkContext
    started = threading.Event()

    def hold_one_slot():
        sc.setJobGroup("dist_dl-test-busy", "holds one of the two slots")
        started.set()
        sc.parallelize([0], 1).foreach(lambda _: time.sleep(25))

    holder = threading.Thread(target=hold_one_slot, daemon=True)
    holder.start()
    started.wait(10)
    tracker, deadline = sc.statusTracker(), time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            getattr(tracker.getStageInfo(s), "numActiveTasks", 0) for s in tracker.getActiveStageIds()):
        time.sleep(0.2)  # until the holding task runs
    begin = time.monotonic()
    result = HorovodRunner(np=2, spark=spark).run(workers.allreduce_known)
    assert sorted(r for r, _, _ in result) == [0, 1]
    assert time.monotonic() - begin > 10  # it did wait for the slot
    out = capsys.readouterr().out
    assert "HorovodRunner(np=2): waiting for 2 free task slots: 1 of 2 free" in out
    holder.join(30)


_DATABRICKS_PATH = '''
import os, sys
sys.path.insert(0, sys.argv[1])
from dist_dl import HorovodRunner

def spark_modules():
    return sorted(m for m in sys.modules if m.startswith("horovod.spark"))

delegated = HorovodRunner(np=2).run(spark_modules)   # sparkdl (the stand-in) runs it here
local = HorovodRunner(np=-1).run(spark_modules)      # a worker process on the driver
print(delegated, local, spark_modules())
'''

_SPARKDL = '''
class HorovodRunner:
    def __init__(self, *, np, driver_log_verbosity="log_callback_only"):
        pass

    def run(self, main, **kwargs):
        import os
        os.environ.setdefault("HOROVOD_RANK", "0")
        return main(**kwargs)
'''


@pytest.mark.profile_subset_164
@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(120)
def test_the_databricks_path_imports_no_horovod_spark(tmp_path):
    """horovod.spark needs pyarrow<11, which Databricks Runtime 15.4 does not
    have: neither np > 0 through sparkdl nor np < 0 may import it."""
    import subprocess
    import sys

    (tmp_path / "sparkdl").mkdir()
    (tmp_path / "sparkdl" / "__init__.py").write_text(_SPARKDL)
    (tmp_path / "sparkdl" / "horovod.py").write_text("def log_to_driver(message):\n    pass\n")
    done = subprocess.run([sys.executable, "-c", _DATABRICKS_PATH, str(tmp_path)],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[] [] []", done.stdout[-2000:]
