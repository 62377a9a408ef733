"""Model parallelism: consecutive layer groups of a Keras model on different devices.

Runs inside the training process (a worker), not on the Spark driver.

``split_model(model, devices)`` returns a new Keras model with the same
weights whose layers are cut into ``len(devices)`` consecutive groups; group i
keeps its weights on ``devices[i]`` and runs there, forward and backward. The
activations at each cut are copied to the next device in the forward pass, and
their gradients copied back in the backward pass.

When it is worth it: only when the model does not fit one device, i.e. its
weights, gradients, optimizer state and activations for one batch (see
``dist_dl.search.estimate_trial_memory``) exceed one device's memory even at a
small batch. Then splitting is what makes training possible at all.

What it costs: this is plain (naive) model parallelism. The groups run one
after another, so with n devices each is idle about (n - 1)/n of the time: it
buys memory, not speed. Every step also copies the cut activations and their
gradients (2 x batch x cut width x bytes per cut), which on GPUs without a
fast link can dominate. If the model fits on one device, data parallelism
(Horovod) is faster; to keep the devices busy, split each batch into
micro-batches and pipeline them (GPipe-style), which this function does not do.

On a machine without GPUs, ``split_cpu(n)`` makes n logical CPU devices so the
same code runs (for tests and trying it out); it must run before TensorFlow
initialises its devices.
"""
from __future__ import annotations

from typing import Sequence

from dist_dl.core import compat

__all__ = ["split_model", "split_cpu"]


def split_cpu(n: int) -> list[str]:
    """Split the CPU into ``n`` logical devices; return their names.

    Raises:
        RuntimeError: TensorFlow has already initialised its devices (call this
            first thing in the process, before any TensorFlow op runs).
    """
    import tensorflow as tf

    if n < 1:
        raise ValueError(f"n={n!r}: give at least 1 logical device")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    except RuntimeError as exc:
        raise RuntimeError("split_cpu must run before TensorFlow initialises its devices (before "
                           "any op or model is created in this process); call it first, or "
                           "run in a fresh process") from exc
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def _chain(model) -> list:
    """The model's layers in order, checking they form a chain."""
    keras = compat.keras()

    if isinstance(model, keras.Sequential):
        return list(model.layers)
    if not getattr(model, "_is_graph_network", False):
        raise ValueError("split_model needs a Sequential or functional Keras model (a subclassed "
                         "model's call order is not visible); rebuild it as Sequential")
    layers = [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
    previous = model.inputs[0] if len(model.inputs) == 1 else None
    for layer in layers:
        if previous is None or layer.input is not previous:
            raise ValueError(f"split_model needs a chain of layers (one input, no branches); "
                             f"layer {layer.name!r} does not take the previous layer's output")
        previous = layer.output
    return layers


def _balanced_cuts(sizes: Sequence[int], groups: int) -> list[int]:
    """Start index of each group after the first, so that groups hold about
    the same number of parameters (and none is empty)."""
    total = sum(sizes) or 1
    cuts, running = [], 0
    for i, size in enumerate(sizes):
        running += size
        want = len(cuts) + 1
        remaining_layers = len(sizes) - (i + 1)
        remaining_groups = groups - want
        if want < groups and (running >= want * total / groups
                              or remaining_layers == remaining_groups):
            cuts.append(i + 1)
    return cuts


def split_model(model, devices: Sequence[str], *, cuts: Sequence[int] | None = None):
    """A copy of ``model`` with consecutive layer groups on ``devices``.

    Args:
        model: A built Keras Sequential model, or a functional one whose layers
            form a chain. Its weights are copied; it is not changed.
        devices: TensorFlow device names, one per group, e.g.
            ``["/GPU:0", "/GPU:1"]`` or the names ``split_cpu(2)`` returns.
        cuts: Index (into the model's layers, input layer excluded) where each
            group after the first starts; default: groups of about equal
            parameter counts.

    Returns:
        An uncompiled Keras model with the same outputs and gradients; compile
        and fit it as usual.
    """
    import tensorflow as tf

    if not model.built:
        raise ValueError("model is not built: call it on data or build(input_shape) first")
    if len(devices) < 1:
        raise ValueError("devices is empty: give one device per layer group")
    known = {(spec.device_type, spec.device_index): d.name
             for d in tf.config.list_logical_devices()
             for spec in [tf.DeviceSpec.from_string(d.name)]}
    for d in devices:
        spec = tf.DeviceSpec.from_string(d)
        if (spec.device_type, spec.device_index) not in known:
            raise ValueError(f"device {d!r} does not exist here; devices: "
                             f"{sorted(known.values())}")
    layers = _chain(model)
    if len(layers) < len(devices):
        raise ValueError(f"{len(layers)} layers cannot fill {len(devices)} devices; give fewer "
                         "devices")
    if cuts is None:
        cuts = _balanced_cuts([l.count_params() for l in layers], len(devices))
    cuts = list(cuts)
    if len(cuts) != len(devices) - 1 or cuts != sorted(set(cuts)) or not (
            0 < (cuts or [1])[0] and (cuts or [0])[-1] < len(layers)):
        raise ValueError(f"cuts={cuts}: give {len(devices) - 1} increasing layer indices "
                         f"between 1 and {len(layers) - 1}")
    bounds = [0, *cuts, len(layers)]

    groups = []
    for g, device in enumerate(devices):
        clones = []
        for layer in layers[bounds[g]:bounds[g + 1]]:
            clone = layer.__class__.from_config(layer.get_config())
            # Built under the device scope, so the variables live there.
            with tf.device(device):
                clone.build(layer.input_shape)
            clone.set_weights(layer.get_weights())
            clones.append(clone)
        groups.append(clones)
    split = _SplitModel(groups, list(devices), name=f"{model.name}_split")
    split.build(model.input_shape)
    return split


def _stage(layers, device, x, training):
    import tensorflow as tf

    @tf.custom_gradient
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            with tf.device(device):
                y = x
                for layer in layers:
                    y = layer(y, training=training)

        def grad(dy, variables=None):
            # Without this, the backward ops of the group would run wherever
            # the caller's tape puts them (eagerly: the default device), not
            # next to the group's weights and saved activations.
            variables = list(variables or [])
            with tf.device(device):
                grads = tape.gradient(y, [x, *variables], output_gradients=dy)
            return grads[0], grads[1:]

        return y, grad

    return run(x)


def _split_model_class():
    keras = compat.keras()

    class SplitModel(keras.Model):
        """Runs its layer groups in order, each on its device."""

        def __init__(self, groups, devices, **kwargs):
            super().__init__(**kwargs)
            self.groups = groups
            self.devices = devices

        def call(self, inputs, training=None):
            x = inputs
            for layers, device in zip(self.groups, self.devices):
                x = _stage(layers, device, x, training)
            return x

    return SplitModel


def _SplitModel(groups, devices, **kwargs):  # noqa: N802 - builds the class lazily
    # The class is made on first use so that importing this module does not
    # import TensorFlow (split_cpu must run before TensorFlow initialises).
    global _SPLIT_CLASS
    try:
        cls = _SPLIT_CLASS
    except NameError:
        cls = _SPLIT_CLASS = _split_model_class()
    return cls(groups, devices, **kwargs)
