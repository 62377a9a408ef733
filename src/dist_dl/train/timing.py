"""Step timing inside a training process: training throughput and CPU use.

Throughput is measured between training steps' ends, so an epoch's first
step (graph tracing, filling the input pipeline) and its end-of-epoch work
(validation, checkpoints, logging) are left out: the steady-state rate of
the training loop itself. CPU seconds per wall second over the same steps
show idle time (a worker waiting on input or on its peers uses less than
its threads could).
"""
from __future__ import annotations

import time
from dist_dl.core import compat

__all__ = ["StepTimes", "step_timer", "input_levers", "input_bound_message", "input_wait_fraction",
           "InputBoundWarning", "INPUT_BOUND"]

# Share of the training steps' time spent waiting for the next batch above
# which a worker is input-bound.
INPUT_BOUND = 0.2


def input_levers(*, gpu_decode: bool = True) -> list[str]:
    """What to change when training waits for its input, for the advice of
    the benchmark and of the workers; ``gpu_decode``: decoding on the GPU is
    one of them (the torch engine on GPUs, decoding on the CPU now)."""
    levers = ["decode on the GPU (train_distributed(engine='torch', decode='gpu'): "
              "torchvision's CUDA decoder)"] if gpu_decode else []
    return levers + [
        "shards stored smaller (ShardConfig(max_side=320) for prepare_image_dataset, or "
        "train_distributed(df, max_side=320)): decoding scales with pixels",
        "more cores per device (threads_per_worker; fewer workers per node, or a node type "
        "with more cores per GPU)"]


def input_bound_message(fraction: float, *, gpu_decode: bool, decode: str | None = None) -> str:
    """What a worker says when it waited for its input for ``fraction`` of
    the training steps' time (above `INPUT_BOUND`), with the levers
    (``gpu_decode``: as for `input_levers()`; ``decode``: the torch
    engine's setting, named in the message)."""
    setting = f" (decode={decode!r})" if decode is not None else ""
    return (f"input-bound: rank 0 waited for its next batch {fraction:.0%} of the training "
            f"steps' time{setting}; the device was idle meanwhile. Levers: "
            + "; ".join(input_levers(gpu_decode=gpu_decode)))


class InputBoundWarning:
    """Calls ``warn(fraction)`` the first time an epoch's input-wait fraction
    is above `INPUT_BOUND`: once per attempt (one per training loop)."""

    def __init__(self, warn):
        self._warn = warn
        self.warned = False

    def __call__(self, fraction: float) -> None:
        if fraction > INPUT_BOUND and not self.warned:
            self.warned = True
            self._warn(fraction)


def input_wait_fraction(waits, times: "StepTimes") -> float | None:
    """The share of the timed steps' time (see `StepTimes.rate()`: from
    the first step's end) spent waiting for batches, from ``waits`` (an
    `InputWaits`); None without timed steps."""
    if times.rate(1) is None:
        return None
    start, end = times.wall[0], times.wall[-1]
    return waits.between(start, end) / (end - start)


class StepTimes:
    """Ends of training steps: wall-clock and CPU seconds (this process's,
    or what ``cpu_clock`` counts: with the loader's decoding processes)."""

    def __init__(self, cpu_clock=time.process_time):
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._cpu_clock = cpu_clock

    def record(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(self._cpu_clock())

    def clear(self) -> None:
        self.wall.clear()
        self.cpu.clear()

    def _window(self, skip: int) -> tuple[int, float] | None:
        """(steps timed, seconds) for the steps after the first ``skip``: the
        end of step ``skip - 1`` starts the clock."""
        if not isinstance(skip, int) or skip < 1:
            raise ValueError(f"skip must be an int >= 1 (the end of a step starts the clock), "
                             f"got {skip!r}")
        steps = len(self.wall) - skip
        seconds = self.wall[-1] - self.wall[skip - 1] if steps >= 1 else 0.0
        return (steps, seconds) if steps >= 1 and seconds > 0 else None

    def rate(self, images_per_step: int, skip: int = 1) -> float | None:
        """Images per second over the steps after the first ``skip`` (None if
        there are none)."""
        window = self._window(skip)
        return None if window is None else window[0] * images_per_step / window[1]

    def cpu_per_second(self, skip: int = 1) -> float | None:
        """CPU seconds per wall second over the same steps."""
        window = self._window(skip)
        if window is None:
            return None
        return (self.cpu[-1] - self.cpu[skip - 1]) / window[1]

    def to_dict(self) -> dict:
        return {"wall": list(self.wall), "cpu": list(self.cpu)}


def step_timer(images_per_step: int, logs_prefix: str | None = "train_", *, waits=None,
               warn=None):
    """A Keras callback that times every epoch's training steps.

    At each epoch's end it appends the epoch's `StepTimes.rate()` and
    `StepTimes.cpu_per_second()` to ``.rates`` and ``.cpu``, and (unless
    ``logs_prefix`` is None) puts them in the epoch's logs as
    ``<prefix>images_per_second`` and ``<prefix>cpu_per_second``. ``.times``
    holds the current epoch's step ends.

    With ``waits`` (the `InputWaits` of the
    training data) it also logs ``<prefix>input_wait_fraction``, the share of
    the same steps' time spent waiting for the next batch, and the first
    epoch where that is above `INPUT_BOUND` calls ``warn`` (if given)
    with it.
    """
    keras = compat.keras()

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = StepTimes()
            self.rates: list[float | None] = []
            self.cpu: list[float | None] = []
            self.input_bound = InputBoundWarning(warn) if warn is not None else None

        def on_epoch_begin(self, epoch, logs=None):
            self.times.clear()
            if waits is not None:
                waits.clear()

        def on_train_batch_end(self, batch, logs=None):
            self.times.record()

        def on_epoch_end(self, epoch, logs=None):
            rate, cpu = self.times.rate(images_per_step), self.times.cpu_per_second()
            self.rates.append(rate)
            self.cpu.append(cpu)
            if logs is not None and logs_prefix is not None:
                if rate is not None:
                    logs[f"{logs_prefix}images_per_second"] = rate
                if cpu is not None:
                    logs[f"{logs_prefix}cpu_per_second"] = cpu
            fraction = None if waits is None else input_wait_fraction(waits, self.times)
            if fraction is not None:
                if logs is not None and logs_prefix is not None:
                    logs[f"{logs_prefix}input_wait_fraction"] = fraction
                if self.input_bound is not None:
                    self.input_bound(fraction)

    return StepTimer()
