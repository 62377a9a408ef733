"""Keras callbacks the training tests run inside the workers (shipped by
value: the workers cannot import the tests folder), and model builders."""
from __future__ import annotations

import os
import signal


def log_epoch_begun(path: str, rank: int, epoch: int) -> None:
    """One line ``<pid> <rank> <epoch>`` of the file epochs_begun reads."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {rank} {epoch}\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def epochs_begun(path: str) -> list[list[int]]:
    """The epochs rank 0 began, a list per worker process in the order they
    ran, from the file EpochLog or KillPlan writes."""
    out = {}
    with open(path) as f:
        for line in f:
            pid, rank, epoch = map(int, line.split())
            if rank == 0:
                out.setdefault(pid, []).append(epoch)
    return list(out.values())


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

        from dist_dl.core.placement import process_rank

        spec = self

        class Hook(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self._epoch = epoch
                log_epoch_begun(spec.path, process_rank(), epoch)

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


def pooled_linear(input_shape, classes):
    """Average pooling and one linear layer: a step costs next to nothing, so
    its workers wait for their input (the input-bound warning)."""
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(input_shape),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(classes),
    ], name="pooled_linear")


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
            from dist_dl.core.placement import process_rank

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

        from dist_dl.core.placement import process_rank

        seen = "present" if os.environ.get(self.name) == self.expected else "absent"
        with open(f"{self.prefix}-rank{process_rank()}", "w") as f:
            f.write(seen)
        return [tf.keras.callbacks.Callback()]


class ModulesProbe:
    """Callback factory: at the end of training each worker writes which of
    the top-level modules ``names`` it has loaded (comma-separated, in the
    order given) to ``<prefix>-rank<r>``."""

    def __init__(self, prefix: str, names: tuple[str, ...]):
        self.prefix, self.names = prefix, names

    def __call__(self):
        import sys

        from dist_dl.core import compat
        from dist_dl.core.placement import process_rank

        path, names = f"{self.prefix}-rank{process_rank()}", self.names

        class Probe(compat.keras().callbacks.Callback):
            def on_train_end(self, logs=None):
                with open(path, "w") as f:
                    f.write(",".join(n for n in names if n in sys.modules))

        return [Probe()]


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


class UnwrittenMetricAt:
    """Callback factory: once (while ``marker`` does not exist), when epoch
    ``epoch`` (0-based) begins, rank 0 (the worker with an active MLflow run)
    leaves what a worker stopped while MLflow's file store logs a metric
    leaves, the metric's file created and its line not written, and raises."""

    def __init__(self, epoch: int, marker: str):
        self.epoch, self.marker = epoch, marker

    def __call__(self):
        import glob

        import mlflow
        import tensorflow as tf

        from dist_dl.core.locations import local_path

        spec = self

        class Hook(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                run = mlflow.active_run()
                if epoch != spec.epoch or run is None or os.path.exists(spec.marker):
                    return
                open(spec.marker, "w").close()
                [metrics] = glob.glob(os.path.join(local_path(mlflow.get_tracking_uri()), "*",
                                                   run.info.run_id, "metrics"))
                open(os.path.join(metrics, "unwritten"), "w").close()
                raise RuntimeError("stopped while logging")

        return [Hook()]


class HoldAt:
    """Callback factory: every worker waits, when epoch ``epoch`` (0-based)
    begins, until the file ``marker`` exists (at most ``seconds``; then it
    goes on). A test injects its fault (a host cut off, the driver killed)
    while the workers wait, then writes ``marker``: the fault lands inside
    the training at that point whatever the machine's pace, and an attempt
    begun after the marker exists does not wait."""

    def __init__(self, epoch: int, marker: str, seconds: float = 300.0):
        self.epoch, self.marker, self.seconds = epoch, marker, seconds

    def __call__(self):
        import time

        import tensorflow as tf

        spec = self

        class Hook(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                deadline = time.monotonic() + spec.seconds
                while (epoch == spec.epoch and not os.path.exists(spec.marker)
                       and time.monotonic() < deadline):
                    time.sleep(0.05)

        return [Hook()]


# Where KillPlan can kill a worker (the reliability issue's five points).
KILL_POINTS = ("before the first step", "mid-epoch", "during the allreduce",
               "during rank 0's checkpoint write", "during validation")

# Armed by KillPlan's callback, read by KillGate's gradient in the same worker
# process: "<epoch> <marker path>" (an environment variable, because the
# callback and the model builder reach the worker as separate pickles).
_KILL_IN_STEP = "DIST_DL_TEST_KILL_IN_STEP"


def _kill_self(marker: str, landed: str) -> None:
    """Write where the kill landed to ``marker``, then SIGKILL this process."""
    with open(marker, "w") as f:
        f.write(landed)
    os.kill(os.getpid(), signal.SIGKILL)


def gated_cnn(input_shape, classes):
    """plain_cnn with a KillGate after its first convolution: the gate's
    gradient runs inside the compiled training step, after the later layers'
    gradients (whose allreduces are then under way) and before the first
    convolution's, so a kill there lands in the middle of the step's
    collectives whatever the machine's pace."""
    import tensorflow as tf

    layers = tf.keras.layers

    class KillGate(layers.Layer):
        """The identity; its gradient kills this process while armed (see
        _KILL_IN_STEP): from inside the step, so it cannot miss the step."""

        def call(self, x):
            @tf.custom_gradient
            def gate(value):
                def grad(upstream):
                    out = tf.py_function(_gate_gradient, [upstream], upstream.dtype)
                    out.set_shape(upstream.shape)
                    return out
                return tf.identity(value), grad
            return gate(x)

    return tf.keras.Sequential([
        tf.keras.Input(input_shape),
        layers.Conv2D(8, 3, activation="relu"),
        KillGate(name="kill_gate"),
        layers.MaxPooling2D(),
        layers.Conv2D(16, 3, activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(classes),
    ], name="gated_cnn")


def _gate_gradient(upstream):
    armed = os.environ.pop(_KILL_IN_STEP, None)
    if armed:
        _, marker = armed.split(" ", 1)
        _kill_self(marker, "inside the training step, in the gradients' pass")
    return upstream


class KillPlan:
    """Callback factory: in epoch ``e`` of ``plan`` ({e: (point, rank)}), the
    worker of that rank kills itself with SIGKILL at that point, once (the
    marker ``<path>.<e>`` says where the kill landed). Every worker appends
    ``<pid> <rank> <epoch>`` to ``path`` when an epoch begins, as EpochLog.

    Each kill is made by the worker's own code at the point, so it lands
    whatever the machine's pace (nothing samples the worker in time):

    - before the epoch's first step, once a worker of another rank has begun
      the epoch too (it then waits in the first step's allreduce);
    - after the epoch's second step;
    - inside the second step, during its allreduces: the model must be
      ``gated_cnn``, whose KillGate kills from its gradient once armed;
    - inside rank 0's checkpoint write, when the state's files are written
      into the temporary folder and the manifest is not (a profile hook on
      the training thread sees ``write_state`` return);
    - inside the exact validation pass at the epoch's end, as its second
      step is called (the same profile hook).

    Nothing of the library is patched. Needs at least 3 steps per epoch and
    3 validation steps per rank."""

    def __init__(self, path: str, plan: dict, checkpoint_dir: str):
        assert all(point in KILL_POINTS for point, _ in plan.values()), plan
        self.path, self.plan, self.checkpoint_dir = path, dict(plan), checkpoint_dir

    def __call__(self):
        import sys
        import time

        import tensorflow as tf

        from dist_dl.core.placement import process_rank

        spec = self
        saving = os.path.join("dist_dl", "train", "checkpoint.py")

        def others_begun(epoch, seconds=60.0):
            # Until a live worker of another rank has begun this epoch too (it
            # then waits in the first step's allreduce): else the run's epoch
            # log would depend on which worker the driver stopped first.
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                with open(spec.path) as f:
                    for line in f:
                        pid, rank, begun = map(int, line.split())
                        if rank != process_rank() and begun == epoch and _alive(pid):
                            return
                time.sleep(0.01)

        def checkpoint_written(marker):
            # Profile hook of the training thread: fires as write_state returns
            # inside CheckpointManager.save (the temporary folder holds the
            # state, not yet the manifest).
            def hook(frame, event, arg):
                if (event == "return" and frame.f_code.co_name == "write_state"
                        and frame.f_code.co_filename.endswith(saving)):
                    partial = [n for n in os.listdir(spec.checkpoint_dir)
                               if n.startswith(".tmp-ckpt-")]
                    _kill_self(marker, "inside CheckpointManager.save, "
                                       f"{partial[0] if partial else 'no temporary folder'}"
                                       " being written")
            return hook

        def validating(marker):
            # Profile hook of the training thread: once the validation pass
            # (DistributedValidation.on_epoch_end) has begun, fires as it calls
            # its compiled step (a tf.function) the second time.
            state = {"begun": False, "steps": 0}

            def hook(frame, event, arg):
                if event != "call":
                    return
                code = frame.f_code
                if code.co_qualname.endswith("DistributedValidation.on_epoch_end"):
                    state["begun"] = True
                elif (state["begun"] and code.co_name == "__call__"
                      and "polymorphic_function" in code.co_filename):
                    state["steps"] += 1
                    if state["steps"] == 2:
                        _kill_self(marker, "inside the validation pass, at its second step")
            return hook

        class Hook(tf.keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch
                log_epoch_begun(spec.path, process_rank(), epoch)
                point, rank = spec.plan.get(epoch, (None, None))
                self._marker = f"{spec.path}.{epoch}"
                self._point = point if (rank == process_rank() and not
                                        os.path.exists(self._marker)) else None
                if self._point == "during rank 0's checkpoint write":
                    sys.setprofile(checkpoint_written(self._marker))
                elif self._point == "during validation":
                    sys.setprofile(validating(self._marker))
                else:
                    sys.setprofile(None)

            def on_train_batch_begin(self, batch, logs=None):
                if self._point == "before the first step" and batch == 0:
                    others_begun(self.epoch)
                    _kill_self(self._marker, "before the epoch's first step")
                if self._point == "during the allreduce" and batch == 1:
                    os.environ[_KILL_IN_STEP] = f"{self.epoch} {self._marker}"

            def on_train_batch_end(self, batch, logs=None):
                if self._point == "mid-epoch" and batch == 1:
                    _kill_self(self._marker, "after the epoch's second step")

        return [Hook()]


# ------------------------------------------------------------ torch engine

def plain_torch_cnn(input_shape, classes):
    """plain_cnn in torch: no batch normalisation, so n workers at batch B/n
    take the same step as one worker at batch B."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(input_shape[-1], 8, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, classes))


def _small_cnn_calling(on_step, input_shape, classes):
    """The torch engine's ``small_cnn``, calling ``on_step(step)`` before each
    training step's forward pass (``step`` counted from 0 in this process)."""
    import torch

    from dist_dl.train.models_torch import build_torch_model

    net = build_torch_model("small_cnn", input_shape, classes)

    class StepHooked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.steps = 0

        def forward(self, images):
            if self.training:
                on_step(self.steps)
                self.steps += 1
            return self.net(images)

    return StepHooked()


class TorchKiller:
    """Builder of the torch engine's ``small_cnn`` whose forward pass kills
    its own process with SIGKILL on rank ``kill_rank`` at training step
    ``kill_step`` (counted from 0 across epochs, in this process), once: a
    marker file ``<path>.killed`` remembers it. Every training step appends
    ``<pid> <rank> <step>`` to ``path``."""

    def __init__(self, path: str, kill_rank: int = 1, kill_step: int = 4):
        self.path, self.kill_rank, self.kill_step = path, kill_rank, kill_step

    def __call__(self, input_shape, classes):
        return _small_cnn_calling(self.on_step, input_shape, classes)

    def on_step(self, step: int) -> None:
        rank = int(os.environ["RANK"])
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {rank} {step}\n")
        marker = self.path + ".killed"
        if rank == self.kill_rank and step == self.kill_step and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class TorchHoldAt:
    """Builder of the torch engine's ``small_cnn`` whose every worker waits,
    at training step ``step`` (counted from 0 in this process), until the
    file ``marker`` exists (at most ``seconds``), having written
    ``<marker>.rank<N>`` to say it waits there: a test injects its fault (the
    client killed) while the workers wait, whatever the machine's pace."""

    def __init__(self, marker: str, step: int, seconds: float = 300.0):
        self.marker, self.step, self.seconds = marker, step, seconds

    def __call__(self, input_shape, classes):
        return _small_cnn_calling(self.on_step, input_shape, classes)

    def on_step(self, step: int) -> None:
        import time

        if step != self.step or os.path.exists(self.marker):
            return
        open(f"{self.marker}.rank{os.environ['RANK']}", "w").close()
        deadline = time.monotonic() + self.seconds
        while not os.path.exists(self.marker) and time.monotonic() < deadline:
            time.sleep(0.05)


def random_forest(n_estimators: int = 25, max_depth: int = 6):
    """An ensemble's member factory: ``member -> RandomForestClassifier``
    seeded by the member's index. A closure, so that any pickler ships it by
    value (pyspark's own cloudpickle, on a Connect session, knows nothing of
    this module's registration, and the tests folder is not importable in
    Spark's Python workers)."""

    def forest(member):
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(n_estimators=n_estimators, max_depth=max_depth,
                                      random_state=member, n_jobs=1)

    return forest
