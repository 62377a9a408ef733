"""Keras callbacks for training code run by ``HorovodRunner``, as Databricks'
``sparkdl.horovod.tensorflow.keras`` offers them (code written for it needs
only its import changed).

Runs inside the workers. The classes subclass Keras' ``Callback``, so they are
defined on first use (see ``dist_dl.core.lazy``), with the Keras of
``dist_dl.core.compat.keras()``: ``tf.keras`` in a worker.
"""
from __future__ import annotations

import numbers

from dist_dl.core import compat
from dist_dl.core.lazy import lazy_attributes

__all__ = ["LogCallback"]


def _format_logs(logs) -> str:
    parts = []
    for name, value in sorted((logs or {}).items()):
        if isinstance(value, numbers.Real):
            parts.append(f"{name}: {float(value):.4g}")
        else:
            try:
                parts.append(f"{name}: {float(value):.4g}")  # a 0-d tensor or array
            except (TypeError, ValueError):
                parts.append(f"{name}: {value}")
    return ", ".join(parts) or "(no logs)"


def _define_log_callback():
    keras = compat.keras()

    from dist_dl.launch.core.worker import _rank, log_to_driver

    class LogCallback(keras.callbacks.Callback):
        """Sends Keras' logs (loss and metrics) of each epoch, and with
        ``per_batch_log`` of each batch, to the driver's output through
        ``log_to_driver``, from rank 0 (whose logs, with Horovod's
        ``MetricAverageCallback`` before this one, are every rank's average).

        Args:
            per_batch_log: Also send each batch's logs (default False).
        """

        def __init__(self, per_batch_log: bool = False):
            super().__init__()
            self.per_batch_log = per_batch_log
            self._epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.per_batch_log and _rank() == 0:
                log_to_driver(f"epoch {self._epoch + 1} batch {batch + 1}: {_format_logs(logs)}")

        def on_epoch_end(self, epoch, logs=None):
            if _rank() == 0:
                log_to_driver(f"epoch {epoch + 1}: {_format_logs(logs)}")

    LogCallback.__module__ = __name__
    LogCallback.__qualname__ = "LogCallback"
    return LogCallback


# LogCallback subclasses a Keras class: defined on first use (see dist_dl.core.lazy).
__getattr__ = lazy_attributes(globals(), LogCallback=_define_log_callback)
