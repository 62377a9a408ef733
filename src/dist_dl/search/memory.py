"""How much memory one trial needs, and how many trials fit on a worker.

A back-of-the-envelope model, for choosing ``max_concurrent`` before a search:

- weights: parameters x bytes per parameter;
- with backpropagation (training): gradients (one per parameter), optimizer
  state (Adam keeps two values per parameter, momentum SGD one), and the
  forward activations of the whole batch, kept for the backward pass and met
  there by their gradients (counted twice);
- without it (inference): weights plus one batch of activations (an upper
  bound: a framework frees most of them as it goes);
- a fixed framework overhead (runtime, kernels, allocator slack).

Mixed precision keeps float32 master weights, gradients and optimizer state
and computes (activations) in 16 bits.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrialMemory", "estimate_trial_memory", "trials_per_worker", "keras_model_size"]

_PARAM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "mixed": 4, "float64": 8}
_ACTIVATION_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "mixed": 2, "float64": 8}
_OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "rmsprop": 1, "adagrad": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class TrialMemory:
    """Bytes, by what holds them."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer_state + self.activations
                + self.overhead)


def estimate_trial_memory(*, num_params: int, batch_size: int, activations_per_sample: int,
                          precision: str = "float32", optimizer: str = "adam",
                          backprop: bool = True,
                          overhead_bytes: int = 512 * 2**20) -> TrialMemory:
    """Estimate one trial's memory.

    Args:
        num_params: Trainable parameters (``model.count_params()``).
        batch_size: Samples per step.
        activations_per_sample: Values the forward pass produces per sample,
            summed over layers (see ``keras_model_size``).
        precision: ``float32``, ``float16``, ``bfloat16``, ``mixed`` or ``float64``.
        optimizer: ``sgd``, ``momentum``, ``rmsprop``, ``adagrad``, ``adam`` or ``adamw``.
        backprop: True for training, False for inference only.
        overhead_bytes: Fixed framework overhead. Default 512 MiB.
    """
    if precision not in _PARAM_BYTES:
        raise ValueError(f"precision={precision!r}: use one of {sorted(_PARAM_BYTES)}")
    if optimizer not in _OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer={optimizer!r}: use one of {sorted(_OPTIMIZER_SLOTS)}")
    for name, v in (("num_params", num_params), ("batch_size", batch_size),
                    ("activations_per_sample", activations_per_sample)):
        if v < 0 or (name == "batch_size" and v < 1):
            raise ValueError(f"{name}={v!r} must be positive")
    p, a = _PARAM_BYTES[precision], _ACTIVATION_BYTES[precision]
    acts = batch_size * activations_per_sample * a
    if not backprop:
        return TrialMemory(num_params * p, 0, 0, acts, overhead_bytes)
    return TrialMemory(weights=num_params * p, gradients=num_params * p,
                       optimizer_state=num_params * p * _OPTIMIZER_SLOTS[optimizer],
                       activations=2 * acts, overhead=overhead_bytes)


def trials_per_worker(trial_bytes: int, worker_memory_bytes: int, *,
                      reserved_fraction: float = 0.1) -> int:
    """How many trials of ``trial_bytes`` fit at once in a worker's memory,
    keeping ``reserved_fraction`` of it for the worker itself. 0 means none:
    shrink the batch or the model, or use a larger worker."""
    if trial_bytes <= 0 or worker_memory_bytes <= 0:
        raise ValueError("trial_bytes and worker_memory_bytes must be positive")
    if not 0 <= reserved_fraction < 1:
        raise ValueError(f"reserved_fraction={reserved_fraction!r}: give a value in [0, 1)")
    return int(worker_memory_bytes * (1 - reserved_fraction) // trial_bytes)


def keras_model_size(model) -> tuple[int, int]:
    """(trainable parameters, activation values per sample) of a built Keras
    model, for ``estimate_trial_memory``."""
    import numpy as np

    params = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    acts = 0
    for layer in model.layers:
        shapes = layer.output_shape if isinstance(layer.output_shape, list) else [
            layer.output_shape]
        for shape in shapes:
            acts += int(np.prod([d for d in shape[1:] if d is not None]))
    return params, acts
