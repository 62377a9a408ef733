"""A small CNN trained data-parallel on synthetic images: the demo job's worker
function, and the quickest end-to-end check that a cluster's Horovod works.

Runs inside each worker (started by ``HorovodRunner``).
"""
from __future__ import annotations

import time
from dist_dl.core import compat

__all__ = ["train_small_cnn", "synthetic_images"]


def synthetic_images(rows: int, image_size: int, classes: int, seed: int):
    """Images whose class shows as a brighter horizontal band, plus noise, so
    that a small CNN can learn them (random labels could not show learning)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, rows)
    images = rng.normal(0.0, 0.3, size=(rows, image_size, image_size, 3)).astype("float32")
    band = max(1, image_size // classes)
    for i, label in enumerate(labels):
        images[i, label * band:(label + 1) * band, :, :] += 1.0
    return images, labels.astype("int32")


def train_small_cnn(epochs: int = 2, steps_per_epoch: int = 20, batch_size: int = 32,
                    image_size: int = 32, classes: int = 4, learning_rate: float = 0.01,
                    seed: int = 0) -> dict:
    """Train a small CNN with Horovod; each rank on its own synthetic shard.

    The learning rate is scaled by the number of workers (the effective batch
    grows with them), gradients are averaged with allreduce, and rank 0's
    initial weights are broadcast so that every rank starts identical.

    Returns (on every rank) the metrics history averaged over ranks, the
    throughput, and the worker count.
    """
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    keras = compat.keras()

    hvd.init()
    keras.utils.set_random_seed(seed)  # identical model on every rank (rank 0's is broadcast anyway)
    images, labels = synthetic_images(batch_size * steps_per_epoch, image_size, classes,
                                      seed=seed + 1 + hvd.rank())
    data = (tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(labels), seed=seed + hvd.rank()).batch(batch_size).repeat())
    model = keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(classes),
    ])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate * hvd.size(),
                                                                 momentum=0.9))
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    start = time.perf_counter()
    history = model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    seconds = time.perf_counter() - start
    images_per_second = epochs * steps_per_epoch * batch_size * hvd.size() / seconds
    return {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
            "images_per_second": images_per_second, "num_workers": hvd.size(),
            "seconds": seconds}
