"""MirroredStrategyRunner end to end, and what every tf.distribute runner
guarantees with it: real TensorFlow workers, real Spark (local[2]).

The cases of spark-tensorflow-distributor (its example, and its integration
tests that need no GPU) are written here in their shape, with only the import
and the data changed: no download, a small synthetic image set.
"""
from __future__ import annotations

import sys
import warnings

import cloudpickle
import numpy as np
import pytest

from dist_dl.core import compat
from dist_dl import MirroredStrategyRunner, NotEnoughSlots, TFDistributeRunner, WorkersDiverged
from shipped import ship_module

# Functions defined here reach the workers by value: a Spark task cannot import tests.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.needs("tensorflow")


def plain_keras_fit(steps: int = 4):
    """Single-worker Keras code, as written for spark-tensorflow-distributor's
    default (use_custom_strategy=False): no strategy in it. Each worker's
    seed differs, as an unseeded notebook's initialisation does. Returns the worker's
    weights and which Keras tf.keras is."""
    import json
    import os

    import numpy as np
    import tensorflow as tf

    tf.random.set_seed(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * steps, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile(tf.keras.optimizers.SGD(0.1),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return (np.concatenate([w.ravel() for w in model.get_weights()]),
            tf.keras.Model.__module__.split(".")[0])


@pytest.mark.profile_subset_164
@pytest.mark.timeout(300)
def test_a_runner_swap_alone_is_caught_and_mirrored_strategy_runner_trains_one_model():
    """The code of spark-tensorflow-distributor's default case, run by
    swapping only the runner call, trains one model per worker: the job
    fails naming the fix. MirroredStrategyRunner runs the same code in its
    strategy's scope: one model, with Keras 2 as tf.keras."""
    with pytest.raises(WorkersDiverged, match=r"(?s)TFDistributeRunner\(np=-2\): the 2 workers "
                       r"ended with different weights for Keras model .*outside a "
                       r"MultiWorkerMirroredStrategy's scope on rank\(s\) 0, 1.*strategy.scope"):
        TFDistributeRunner(np=-2).run(plain_keras_fit)
    weights, keras = MirroredStrategyRunner(num_slots=-2, use_gpu=False).run(plain_keras_fit)
    # Keras 2 (tf-keras) as tf.keras where Keras 3 is the default.
    assert keras == ("tf_keras" if compat.keras3_default() else "keras")
    assert np.abs(weights).sum() > 0


def distributor_example():
    """spark-tensorflow-distributor's example (a CNN fitted for 3 epochs of 5
    steps on a repeated, shuffled image set, auto-sharded by data), with a
    synthetic image set in place of the MNIST download."""
    import numpy as np
    import tensorflow as tf

    buffer_size, batch_size = 10000, 64

    def image_set():
        rng = np.random.default_rng(0)
        labels = rng.integers(0, 10, 512)
        images = rng.random((512, 28, 28)) * 0.2
        images[np.arange(512), labels * 2, :] += 0.8  # a brighter row, by label
        data = tf.data.Dataset.from_tensor_slices(
            (tf.cast(images[..., tf.newaxis], tf.float32), tf.cast(labels, tf.int64)))
        return data.repeat().shuffle(buffer_size).batch(batch_size)

    def compiled_cnn():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
                      metrics=["accuracy"])
        return model

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    model = compiled_cnn()
    model.fit(x=image_set().with_options(options), epochs=3, steps_per_epoch=5)


@pytest.mark.profile_subset_164
@pytest.mark.timeout(300)
def test_the_distributors_example_on_spark_tasks(spark, capsys):
    # The original's CPU form of MirroredStrategyRunner(num_slots=8).run(train):
    # two Spark tasks here. Its weights check passing means the workers ended alike.
    assert MirroredStrategyRunner(num_slots=2, use_gpu=False).run(distributor_example) is None
    out = capsys.readouterr().out
    assert "[0]<stdout>:" in out and "[1]<stdout>:" in out and "Epoch 3/3" in out


@pytest.mark.profile_subset_164
@pytest.mark.timeout(240)
def test_the_distributors_example_in_local_mode(capsys):
    assert MirroredStrategyRunner(num_slots=1, local_mode=True, use_gpu=False).run(
        distributor_example) is None
    assert "[0]<stdout>:" in capsys.readouterr().out


@pytest.mark.profile_subset_164
@pytest.mark.timeout(240)
def test_cpu_training_with_gpus(spark):
    """The original's test of the same name: CPU training sees no GPU, and
    the function can use its Spark task's BarrierTaskContext."""
    import os

    def train_fn():
        from pyspark import BarrierTaskContext
        context = BarrierTaskContext.get()
        cuda_state = os.environ["CUDA_VISIBLE_DEVICES"]
        if cuda_state:
            num_gpus = len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
        else:
            num_gpus = 0
        return [int(e) for e in context.allGather(str(num_gpus))]

    runner = MirroredStrategyRunner(num_slots=2, use_gpu=False)
    assert runner.get_num_tasks() == 2
    gpus_used_by_each_task = runner.run(train_fn)
    assert gpus_used_by_each_task == [0, 0]


@pytest.mark.profile_subset_164
@pytest.mark.timeout(120)
def test_zero_num_slots_and_tls_cluster(spark):
    """The original's test_zero_num_slots, test_run_on_ssl_cluster and (up to
    the job) test_run_on_ssl_cluster_override; GPU training without Spark's
    GPU scheduling is refused naming the setting."""
    with pytest.raises(ValueError):
        MirroredStrategyRunner(num_slots=0).run(lambda: None)
    with pytest.raises(ValueError, match=r"spark.task.resource.gpu.amount.*use_gpu=False"):
        MirroredStrategyRunner(num_slots=2, gpu_resource_name="gpu")
    conf = spark.sparkContext._jsc.sc().conf()
    conf.set("spark.ssl.enabled", "true")
    try:
        runner = MirroredStrategyRunner(num_slots=2, use_gpu=False)
        with pytest.raises(RuntimeError, match="tensorflow.spark.distributor.ignoreSsl"):
            runner.run(lambda: None)
        conf.set("tensorflow.spark.distributor.ignoreSsl", "true")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runner._check_encryption()
        assert any("not encrypted" in str(w.message) for w in caught)
    finally:
        conf.remove("spark.ssl.enabled")
        conf.remove("tensorflow.spark.distributor.ignoreSsl")


@pytest.mark.profile_subset_164
@pytest.mark.timeout(120)
def test_not_enough_slots_names_the_runner(spark):
    with pytest.raises(NotEnoughSlots, match=r"^MirroredStrategyRunner\(num_slots=3\) needs 3 .*num_slots <= 2 "):
        MirroredStrategyRunner(num_slots=3, use_gpu=False).run(lambda: None)


def import_shipped_module():
    import shipped_helper_for_dist_dl

    return shipped_helper_for_dist_dl.answer()


@pytest.mark.profile_subset_164
@pytest.mark.timeout(180)
def test_a_module_shipped_with_add_py_file_imports_in_the_workers(spark, tmp_path):
    """What a plain Spark task imports (here a module shipped with
    sc.addPyFile) imports in the workers, on Spark tasks and on the driver."""
    ship_module(spark, tmp_path, "shipped_helper_for_dist_dl", 42)
    for runner in (TFDistributeRunner(np=2, spark=spark), TFDistributeRunner(np=-2),
                   MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True)):
        assert runner.run(import_shipped_module) == 42, runner._label()


@pytest.mark.profile_subset_164
@pytest.mark.timeout(120)
def test_local_gpu_slots_are_the_drivers_gpus(monkeypatch):
    """Local mode reads the driver's GPUs through its Spark configuration first."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "10,11,12,13")
    runner = MirroredStrategyRunner(num_slots=3, local_mode=True)
    assert runner._backend.worker_gpus == [["10", "11", "12"]]  # one process, three GPUs
    runner = MirroredStrategyRunner(num_slots=-2)
    assert runner._backend.worker_gpus == [["10"], ["11"]]  # two processes, one GPU each
    with pytest.raises(ValueError, match="5 GPU slots requested .* has 4 GPU.*num_slots <= 4"):
        MirroredStrategyRunner(num_slots=5, local_mode=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="the driver has no GPU.*use_gpu=False"):
        MirroredStrategyRunner(num_slots=1, local_mode=True)
