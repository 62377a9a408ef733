"""The training loop inside every worker of ``train_distributed(...,
keras=3)``: a Keras 3 model on the tf.distribute engine.

Keras 3's ``fit`` cannot train under MultiWorkerMirroredStrategy (it does
not sum the workers' gradients with Keras 3.2, and fails outright with 3.5:
keras-team/keras#19891, #20585), so this worker runs the steps itself, the
way TensorFlow's custom-training guide for the strategy writes them:
``strategy.run`` of a step with ``tf.GradientTape``, the loss averaged over
the global batch (``tf.nn.compute_average_loss``, so the all-reduced sum of
the workers' gradients is the gradient of the global batch), and
``optimizer.apply``, which all-reduces them. Everything around the steps is
the tf.distribute engine's (`dist_dl.train.engines.keras_common`): the plan, the
reader, the learning-rate schedule, resume, the exact validation pass, the
checkpoints, MLflow, TensorBoard and progress, as the same Keras callbacks,
called by a ``keras.callbacks.CallbackList`` at the points ``fit`` calls them
(the user's ``callbacks`` too). This process's Keras is Keras 3
(``DIST_DL_KERAS=3``, see `dist_dl.core.compat`), so the library's code
builds, checkpoints (``model.keras``) and logs Keras 3 models here.

Two things Keras 3 does differently under the strategy, on runtimes 16.4's
and 17.3's stacks (benchmarks/keras3_loop.py shows both; figures in
benchmarks/RESULTS.md):

- BatchNormalization's moving statistics are mirrored variables updated on
  each worker from its own batch, without aggregation, so they drift apart:
  every BatchNormalization layer is made ``synchronized`` (batch statistics
  over all workers' rows, as one process on the global batch computes them),
  which keeps every worker's statistics identical;
- mixed precision: Keras 3's LossScaleOptimizer checks the gradients for
  overflow *before* its inner optimizer all-reduces them
  (keras/src/optimizers/loss_scale_optimizer.py, ``_common_apply``; its
  ``_tf_apply`` comment assumes they are all-reduced already), and applies
  them (an all-reduce) only where they are finite. When one worker's local
  gradients overflow and another's do not, the first skips the all-reduce
  and the second waits for it forever: training hung in its first step
  (a model with BatchNormalization at the initial scale of 2**15: worker 0's
  check said "overflow", worker 1's "finite"; seen on TensorFlow 2.17 and
  2.19). Here the check is all-reduced (`agreeing_loss_scale_optimizer()`):
  a step is skipped on every worker when any worker overflows, as one
  process on the global batch would skip it. Related upstream:
  keras-team/keras#18666 (the same optimizer under MirroredStrategy).

The epoch's ``loss`` and ``accuracy`` are exact over the epoch's rows (sums
of the weighted loss, correct rows and weights, all-reduced once per epoch;
rows repeated to even out the shards have weight 0), where ``fit`` reports a
running mean of batch means.
"""
from __future__ import annotations

from dist_dl.core import compat
from dist_dl.train.config import TrainConfig
from dist_dl.train.engines.core import WorkerSpec
from dist_dl.train.engines.keras_common import (build_model, fit_and_log, keras_runner,
                                                start_tf_distribute, sum_over_workers,
                                                tf_distribute_data_and_callbacks)

__all__ = ["train", "runner", "synchronize_batch_norm", "agreeing_loss_scale_optimizer"]


def runner(cfg: TrainConfig, backend: str, spark):
    """`TFDistributeRunner` whose workers have Keras 3 as
    tf.keras and as the library's Keras (`dist_dl.core.compat`), not the
    launcher's default tf-keras."""
    from dist_dl.core.quiet import quiet_env
    from dist_dl.launch import TFDistributeRunner

    return keras_runner(TFDistributeRunner, cfg, backend, spark,
                        {**quiet_env(), compat.LEGACY_KERAS_ENV: "0", compat.NATIVE_KERAS_ENV: "3"})


def train(spec: WorkerSpec) -> dict | None:
    """One attempt of data-parallel training of a Keras 3 model on this
    tf.distribute worker.

    Returns, on rank 0: the logged model's URI and registered version, the
    epoch the attempt started at and the number of epochs; None elsewhere.
    """
    import tensorflow as tf

    if not compat.native_keras3():
        raise RuntimeError(f"train needs Keras 3 as this process's Keras: start it "
                           f"with {compat.NATIVE_KERAS_ENV}=3 (train_distributed(keras=3) does), "
                           "where the keras package is 3.x")
    keras = compat.keras()

    from dist_dl.train.checkpoint_loop import resume

    cfg = spec.config
    strategy, rank, size, mixed, reader, schedule, manager = start_tf_distribute(tf, spec)
    with strategy.scope():
        model = build_model(spec, mixed)
        synchronize_batch_norm(model)
        optimizer = keras.optimizers.SGD(schedule, momentum=cfg.momentum)
        if mixed:
            optimizer = agreeing_loss_scale_optimizer()(optimizer)
        # Compiled only to attach the optimizer: model.keras checkpoints carry
        # its state, and callbacks find it as model.optimizer.
        model.compile(optimizer=optimizer)
        optimizer.build(model.trainable_variables)
        initial_epoch = resume(manager, model, broadcast=False)
    train_data, callbacks = tf_distribute_data_and_callbacks(
        tf, spec, strategy, reader, schedule, manager, rank, size, initial_epoch, mixed,
        "tf.distribute, Keras 3")
    step = _train_step(tf, keras, strategy, model, optimizer, cfg.batch_size * size, mixed)

    def fit(all_callbacks):
        _run_epochs(tf, keras, strategy, model, step, train_data, all_callbacks,
                    initial_epoch, cfg.epochs, spec.train_steps)

    return fit_and_log(spec, model, train_data, callbacks, rank, initial_epoch, mixed=mixed,
                        weights_everywhere=True, fit=fit)


def synchronize_batch_norm(model) -> int:
    """Make every Keras 3 BatchNormalization layer of ``model`` (nested ones
    too) compute its batch statistics over all replicas; returns how many."""
    import keras

    layers = [layer for layer in model._flatten_layers(include_self=False, recursive=True)
              if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in layers:
        layer.synchronized = True
    return len(layers)


def agreeing_loss_scale_optimizer():
    """Keras 3's ``LossScaleOptimizer`` whose overflow check is the same on
    every replica (see the module's notes): a step is skipped everywhere
    when any replica's gradients overflow. For a training loop of one's own
    too (``TFDistributeRunner`` with ``env={"TF_USE_LEGACY_KERAS": "0"}``).
    (A subclass of the ``keras`` package's, made on first use.)"""
    global _AGREEING
    if _AGREEING is None:
        import keras
        import tensorflow as tf

        @keras.saving.register_keras_serializable(package="dist_dl")
        class AgreeingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
            def check_finite(self, grads):
                finite = super().check_finite(grads)
                context = tf.distribute.get_replica_context()
                if context is None or context.num_replicas_in_sync == 1:
                    return finite
                overflowed = context.all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
                return tf.equal(overflowed, 0.0)

        _AGREEING = AgreeingLossScaleOptimizer
    return _AGREEING


_AGREEING = None


def _train_step(tf, keras, strategy, model, optimizer, global_batch: int, mixed: bool):
    """A ``tf.function`` taking the distributed iterator: one step on every
    worker; returns this worker's sums (weighted loss, correct rows, weights)."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(images, labels, weights):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            per_row = loss_fn(labels, logits)
            loss = tf.nn.compute_average_loss(per_row, sample_weight=weights,
                                              global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if mixed else loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                                   tf.cast(labels, tf.int32)), tf.float32)
        weights = tf.cast(weights, tf.float32)
        return tf.stack([tf.reduce_sum(per_row * weights), tf.reduce_sum(correct * weights),
                         tf.reduce_sum(weights)])

    # Graph code already (its one branch is on a Python list): no AutoGraph
    # rewrite, as in dist_dl.read.dataset.make_dataset.
    @tf.function(autograph=False)
    def step(iterator):
        return strategy.experimental_local_results(
            strategy.run(replica_step, args=next(iterator)))[0]

    return step


def _run_epochs(tf, keras, strategy, model, step, train_data, callbacks: list,
                initial_epoch: int, epochs: int, steps: int) -> None:
    """What ``fit(initial_epoch=..., epochs=..., steps_per_epoch=...)`` does
    with its callbacks, around ``step``. Every worker runs the same steps and
    the same callbacks (the collective ones all-reduce in the same order)."""
    hooks = keras.callbacks.CallbackList(callbacks, model=model, epochs=epochs, steps=steps,
                                         verbose=0)
    iterator = iter(train_data)
    model.stop_training = False
    hooks.on_train_begin()
    logs = {}
    for epoch in range(initial_epoch, epochs):
        hooks.on_epoch_begin(epoch)
        totals = tf.zeros([3], tf.float32)
        for batch in range(steps):
            hooks.on_train_batch_begin(batch)
            totals += step(iterator)
            hooks.on_train_batch_end(batch)
        loss, correct, weight = sum_over_workers(tf, strategy, totals).numpy()
        logs = {"loss": float(loss / weight), "accuracy": float(correct / weight)} \
            if weight > 0 else {}
        hooks.on_epoch_end(epoch, logs)
        # The same on every worker: the callbacks that stop see the same
        # all-reduced metrics.
        if model.stop_training:
            break
    hooks.on_train_end(logs)
