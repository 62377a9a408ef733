"""Keras callbacks the training tests run inside the workers (shipped by
value: the workers cannot import the tests folder), and model builders."""
from __future__ import annotations

import os
import signal


class EpochLog:
    """Callback factory: every worker appends ``<pid> <rank> <epoch>`` to
    ``path`` when an epoch begins; optionally kills ``kill_rank`` with SIGKILL
    after batch ``kill_batch`` of epoch ``kill_epoch`` (0-based), once (a
    marker file remembers it), or stops training after ``stop_after`` epochs."""

    def __init__(self, path: str, kill_rank: int | None = None, kill_epoch: int = 1,
                 kill_batch: int = 2, stop_after: int | None = None):
        self.path = path
        self.kill_rank, self.kill_epoch, self.kill_batch = kill_rank, kill_epoch, kill_batch
        self.stop_after = stop_after

    def __call__(self):
        import tensorflow as tf

        from dist_dl.launch.device import process_rank

        spec = self

        class Hook(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self._epoch = epoch
                with open(spec.path, "a") as f:
                    f.write(f"{os.getpid()} {process_rank()} {epoch}\n")

            def on_train_batch_end(self, batch, logs=None):
                marker = spec.path + ".killed"
                if (process_rank() == spec.kill_rank and self._epoch == spec.kill_epoch
                        and batch == spec.kill_batch and not os.path.exists(marker)):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)

            def on_epoch_end(self, epoch, logs=None):
                if spec.stop_after is not None and epoch + 1 >= spec.stop_after:
                    self.model.stop_training = True

        return [Hook()]


def plain_cnn(input_shape, classes):
    """A small CNN without batch normalisation, whose update is the same for
    n workers at batch B/n and one worker at batch B."""
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(input_shape),
        layers.Conv2D(8, 3, activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(16, 3, activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(classes),
    ], name="plain_cnn")


def wide_mlp(input_shape, classes):
    """4.4 M parameters (17.6 MB of float32 gradients): a large model for
    the cycle-time default, cheap to build and step at 16 x 16 pixels."""
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(input_shape),
        layers.Flatten(),
        layers.Dense(5700, activation="relu"),
        layers.Dense(classes),
    ], name="wide_mlp")


class CountedBuilder:
    """A model builder that appends ``<pid> <HOROVOD_RANK>`` to ``path`` each
    time it builds (through a file: the workers are other processes; the
    rank from the environment: Horovod may not be initialised yet; a
    tf.distribute worker's from TF_CONFIG)."""

    def __init__(self, path: str, builder):
        self.path, self.builder = path, builder

    def __call__(self, input_shape, classes):
        with open(self.path, "a") as f:
            from dist_dl.launch.device import process_rank

            f.write(f"{os.getpid()} {process_rank()}\n")
        return self.builder(input_shape, classes)


def wrong_units(input_shape, classes):
    """A builder with the wrong number of outputs: a deterministic error."""
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
                                tf.keras.layers.Dense(classes + 1)])


class EnvProbe:
    """Callback factory: each worker writes whether environment variable
    ``name`` holds ``expected`` ("present" or "absent", never the value) to
    ``<prefix>-rank<r>``."""

    def __init__(self, prefix: str, name: str, expected: str):
        self.prefix, self.name, self.expected = prefix, name, expected

    def __call__(self):
        import tensorflow as tf

        from dist_dl.launch.device import process_rank

        seen = "present" if os.environ.get(self.name) == self.expected else "absent"
        with open(f"{self.prefix}-rank{process_rank()}", "w") as f:
            f.write(seen)
        return [tf.keras.callbacks.Callback()]


class RaiseAt:
    """Callback factory: every worker raises ``RuntimeError(message)`` when
    epoch ``epoch`` (0-based) begins, after the previous epoch's checkpoint."""

    def __init__(self, epoch: int, message: str):
        self.epoch, self.message = epoch, message

    def __call__(self):
        import tensorflow as tf

        spec = self

        class Hook(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == spec.epoch:
                    raise RuntimeError(spec.message)

        return [Hook()]
