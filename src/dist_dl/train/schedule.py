"""The learning-rate rule for data-parallel training: scale by the number of
workers, reached by a gradual linear warmup (Goyal et al. 2017, "Accurate,
Large Minibatch SGD: Training ImageNet in 1 Hour", section 2.2).

With n workers the effective batch is n times larger, so the learning rate is
n times larger too; jumping straight to it destabilises the first epochs, so
it rises linearly, step by step, from the single-worker rate to the scaled one
over the first ``warmup_epochs``, then stays there, or (given the run's
length) decays along a half cosine to zero at its last step (Loshchilov and
Hutter 2017, "SGDR"), which settles the weights at the end of short runs.

Runs inside each worker. The schedule is driven by the optimizer's iteration
count, which checkpoints save and restore, so a resumed run continues on the
same curve. Importing this module does not import TensorFlow (a worker must
configure its threads first, see dist_dl.launch.core.worker): the class is created
on first access, and registered then as Keras-serialisable
("dist_dl>WarmupScaledSchedule").
"""
from __future__ import annotations

import math

from dist_dl.core import compat
from dist_dl.core.lazy import lazy_attributes

__all__ = ["WarmupScaledRates", "WarmupScaledSchedule"]


class WarmupScaledRates:
    """``base_lr`` at step 0, rising linearly to ``base_lr * num_workers`` at
    step ``warmup_epochs * steps_per_epoch``; then constant, or with
    ``total_epochs`` a half-cosine decay to 0 at ``total_epochs *
    steps_per_epoch``. In plain Python: ``rates(step)`` is the rate at
    ``step`` (the torch engine sets its optimizer's rate from it, step by
    step); `WarmupScaledSchedule` is the same curve as a Keras
    schedule, computed in its graph.

    Args:
        base_lr: The learning rate for one worker.
        num_workers: Number of data-parallel workers (``hvd.size()``).
        steps_per_epoch: Optimizer steps per epoch on each worker.
        warmup_epochs: Epochs of warmup (default 5, as in the paper; 0 starts
            at the scaled rate). May be fractional.
        total_epochs: The run's length, for the cosine decay; None (default):
            no decay.
    """

    def __init__(self, base_lr: float, num_workers: int, steps_per_epoch: int,
                 warmup_epochs: float = 5, total_epochs: float | None = None):
        if not isinstance(base_lr, (int, float)) or isinstance(base_lr, bool) or base_lr <= 0:
            raise ValueError(f"base_lr must be a positive number, got {base_lr!r}")
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        if not isinstance(steps_per_epoch, int) or isinstance(steps_per_epoch, bool) or steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be an int >= 1, got {steps_per_epoch!r}")
        if not isinstance(warmup_epochs, (int, float)) or isinstance(warmup_epochs, bool) or warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be a number >= 0, got {warmup_epochs!r}")
        if total_epochs is not None and (not isinstance(total_epochs, (int, float))
                                         or isinstance(total_epochs, bool)
                                         or total_epochs < warmup_epochs or total_epochs <= 0):
            raise ValueError(f"total_epochs must be None or a number > 0 and >= warmup_epochs "
                             f"({warmup_epochs}), got {total_epochs!r}")
        self.base_lr = float(base_lr)
        self.num_workers = num_workers
        self.steps_per_epoch = steps_per_epoch
        self.warmup_epochs = warmup_epochs
        self.total_epochs = total_epochs

    @property
    def scaled_lr(self) -> float:
        """The rate after warmup: ``base_lr * num_workers``."""
        return self.base_lr * self.num_workers

    @property
    def warmup_steps(self) -> int:
        """Steps until the scaled rate is reached."""
        return int(round(self.warmup_epochs * self.steps_per_epoch))

    @property
    def total_steps(self) -> int | None:
        """The step the decay reaches 0 at (None: no decay)."""
        if self.total_epochs is None:
            return None
        return max(self.warmup_steps, int(round(self.total_epochs * self.steps_per_epoch)))

    def value_at(self, step: int) -> float:
        """The rate at ``step``, in plain Python."""
        if step < self.warmup_steps:
            return self.base_lr + (self.scaled_lr - self.base_lr) * step / self.warmup_steps
        total = self.total_steps
        if total is None or total == self.warmup_steps:
            return self.scaled_lr
        done = min(1.0, (step - self.warmup_steps) / (total - self.warmup_steps))
        return self.scaled_lr * 0.5 * (1.0 + math.cos(math.pi * done))

    __call__ = value_at

    def get_config(self) -> dict:
        return {"base_lr": self.base_lr, "num_workers": self.num_workers,
                "steps_per_epoch": self.steps_per_epoch, "warmup_epochs": self.warmup_epochs,
                "total_epochs": self.total_epochs}


def _define_schedule():
    keras = compat.keras()  # says what to install where TensorFlow is missing
    import tensorflow as tf

    class WarmupScaledSchedule(keras.optimizers.schedules.LearningRateSchedule,
                               WarmupScaledRates):
        """`WarmupScaledRates` as a Keras learning-rate schedule: the
        same arguments and curve, computed in the optimizer's graph from its
        step."""

        def __init__(self, base_lr: float, num_workers: int, steps_per_epoch: int,
                     warmup_epochs: float = 5, total_epochs: float | None = None):
            keras.optimizers.schedules.LearningRateSchedule.__init__(self)
            WarmupScaledRates.__init__(self, base_lr, num_workers, steps_per_epoch,
                                       warmup_epochs, total_epochs)

        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            scaled = tf.constant(self.scaled_lr, tf.float32)
            rate = scaled
            total = self.total_steps
            if total is not None and total > self.warmup_steps:
                done = tf.minimum(1.0, (step - self.warmup_steps) / float(total - self.warmup_steps))
                rate = scaled * 0.5 * (1.0 + tf.cos(math.pi * done))
            if self.warmup_steps == 0:
                return rate
            fraction = step / float(self.warmup_steps)
            warm = self.base_lr + (self.scaled_lr - self.base_lr) * tf.minimum(fraction, 1.0)
            return tf.where(step < float(self.warmup_steps), warm, rate)

        get_config = WarmupScaledRates.get_config

    WarmupScaledSchedule.__module__ = __name__
    WarmupScaledSchedule.__qualname__ = "WarmupScaledSchedule"
    return keras.saving.register_keras_serializable(package="dist_dl")(WarmupScaledSchedule)


# WarmupScaledSchedule subclasses a Keras class: defined on first use (see dist_dl.core.lazy).
__getattr__ = lazy_attributes(globals(), WarmupScaledSchedule=_define_schedule)
