"""The benchmark's setups as training functions: plain Keras, Horovod's and
tf.distribute's own recipes, and the reader alone. They run in the workers
(or in a process of their own) that `dist_dl.app.bench.driver` starts."""
from __future__ import annotations

import os

from dist_dl.app.bench.measure import StepRecorder
from dist_dl.core import compat
from dist_dl.train.config import TrainConfig

__all__ = ["plain_fit", "peer_fit", "tf_peer_fit", "reader_rate"]


def _batches(files: list, config: TrainConfig, rank: int, size: int):
    """Shard ``rank`` of ``size``, batched as a training worker reads it."""
    from dist_dl.read import make_dataset

    return make_dataset(files, rank, size, config.batch_size, training=config.augment,
                        shuffle=config.shuffle, config=config.reader_config(), with_weights=True)


def _compiled(tf, config: TrainConfig, learning_rate: float, gpus: list, wrap=None):
    """The worker's model (float32 logits under mixed precision, as the
    library builds it), compiled with SGD at ``learning_rate``; ``wrap``
    turns the optimizer into a distributed one."""
    from dist_dl.train.models import build_classifier

    keras = compat.keras()
    mixed = config.mixed_precision == "on" or (config.mixed_precision == "auto" and bool(gpus))
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    model = build_classifier(config.model, config.reader_config(), 10, mixed=mixed)
    optimizer = keras.optimizers.SGD(learning_rate, momentum=config.momentum)
    if wrap is not None:
        optimizer = wrap(optimizer)
    if mixed:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    return model


def plain_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder) -> None:
    """One independent process: the worker's model, optimizer, loss and
    reader, without Horovod (the launcher shows it one GPU, if any)."""
    import tensorflow as tf

    keras = compat.keras()
    keras.utils.set_random_seed(config.seed)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    model = _compiled(tf, config, config.learning_rate, gpus)
    model.fit(_batches(files, config, 0, 1), epochs=1, steps_per_epoch=steps,
              callbacks=recorder(), verbose=0)


def peer_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder,
              threads: int) -> dict:
    """The peer: Horovod's Keras recipe as Horovod's documentation writes it,
    run in each Spark task by ``horovod.spark.run``. Only the model, the
    shards, the batch and the thread count are the library's, so that both
    sides do the same work on the same cores."""
    # Horovod 0.28's Keras integration needs Keras 2 (horovod#4290): where
    # Keras 3 is the default (TensorFlow 2.16, runtime 15.4), the task starts
    # with TF_USE_LEGACY_KERAS=1 (the env given to horovod.spark.run) and
    # Horovod's Keras modules get Keras 2's backend, as a user of that runtime
    # must do too; a no-op on TensorFlow lines with Keras 2.
    compat.patch_horovod_keras()
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    # The library's workers get these threads from their launcher (see
    # launch.core.device.plan_devices); set here so the compute is the same.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    hvd.init()
    # The recipe: one GPU per process, chosen by local rank.
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        gpus = [gpus[hvd.local_rank() % len(gpus)]]
        tf.config.set_visible_devices(gpus, "GPU")
    keras = compat.keras()
    keras.utils.set_random_seed(config.seed + hvd.rank())
    # The recipe: learning rate scaled by the number of workers, the
    # optimizer wrapped, initial weights broadcast from rank 0, metrics averaged.
    model = _compiled(tf, config, config.learning_rate * hvd.size(), gpus,
                      wrap=hvd.DistributedOptimizer)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()] + recorder()
    # verbose=0 where the recipe prints a progress bar on rank 0: printing is
    # not what is compared (the library's workers print none per step either).
    model.fit(_batches(files, config, hvd.rank(), hvd.size()), epochs=1, steps_per_epoch=steps,
              callbacks=callbacks, verbose=0)
    return {"cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"), "nccl": bool(hvd.nccl_built()),
            "size": hvd.size()}


def tf_peer_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder) -> None:
    """The tf.distribute peer: TensorFlow's multi-worker Keras recipe, in
    each worker ``TFDistributeRunner`` started (its ``TF_CONFIG`` set). Only
    the model, the shards, the batch and the threads are the library's."""
    import tensorflow as tf

    from dist_dl.launch.engines.tensorflow import multi_worker_strategy

    # The recipe: the strategy first (its collectives: RING on CPU, NCCL on GPUs).
    strategy = multi_worker_strategy()
    rank = strategy.cluster_resolver.task_id
    size = strategy.num_replicas_in_sync
    keras = compat.keras()
    keras.utils.set_random_seed(config.seed + rank)
    gpus = tf.config.list_physical_devices("GPU")
    # The recipe: model and optimizer under the scope, the rate scaled by workers.
    with strategy.scope():
        model = _compiled(tf, config, config.learning_rate * size, gpus)
    data = strategy.distribute_datasets_from_function(
        lambda context: _batches(files, config, context.input_pipeline_id,
                                 context.num_input_pipelines))
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=recorder(), verbose=0)


def reader_rate(files: list, config: TrainConfig, size: int, warmup: int, batches: int):
    """Images/s and CPU s per wall s of shard 0 of ``size`` read, decoded
    and batched as a training worker does, with no model: the input
    pipeline alone (runs in a launched worker, with a worker's threads)."""
    import time

    iterator = iter(_batches(files, config, 0, size))
    for _ in range(max(1, warmup)):
        next(iterator)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    wall = time.perf_counter() - wall0
    return batches * config.batch_size / wall, (time.process_time() - cpu0) / wall
