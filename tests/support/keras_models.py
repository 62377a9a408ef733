"""A tiny Keras classifier for checkpoint tests: small enough to save many
times a second, with optimizer state (Adam's slots and iteration count) that
an exact resume must restore."""
from __future__ import annotations

from dist_dl.core import compat


def tiny_classifier(seed: int, learning_rate: float = 0.01):
    """A compiled 8x8x1 -> 3-class model, its weights from ``seed``."""
    keras = compat.keras()

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(3),
    ])
    # Adam: its slots and its iteration count (bias correction) must both be
    # restored for a resumed run to match.
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
