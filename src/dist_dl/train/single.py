"""Training in one process, without Horovod: the single-node baseline, and the
body of each hyperparameter trial (which runs inside one Spark task).

The same reader, model registry and learning-rate schedule as the
data-parallel loop (``engines/horovod.py``), so a baseline and a distributed run of one
configuration differ only in the number of workers.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from dist_dl.core import compat
from dist_dl.core.optional import require
from dist_dl.train.config import TrainConfig

__all__ = ["train_single"]


def train_single(config: TrainConfig, data, validation=None, *, model=None,
                 report: Callable[[float], None] | None = None) -> dict:
    """Train ``config``'s model on shards in this process.

    Args:
        config: Training settings; ``num_workers`` and ``backend`` are ignored
            (one process), the learning rate is not scaled.
        data: Image shards (folder, Delta table or list of Parquet file URLs).
        validation: Validation shards, or None (no validation pass).
        model: A registry name or builder; default ``config.model``.
        report: Called with each epoch's validation accuracy (training
            accuracy without validation data); may raise to stop the run
            early (a search's stopping rule does).

    Returns:
        ``{"history": {metric: [per epoch]}, "val_accuracy": last or None,
        "images_per_second": training throughput (steps only, epochs after
        the first), 
        "model": the Keras model, uint8 pixels in (its first layer
        normalises them; see ``dist_dl.train.models.build_classifier``)}``.
    """
    tf = require("tensorflow", "train_single (a Keras model in one process)")
    keras = compat.keras()

    from dist_dl.read import make_dataset, plan_shards
    from dist_dl.train.models import build_classifier
    from dist_dl.train.schedule import WarmupScaledSchedule
    from dist_dl.train.timing import step_timer

    cfg = dataclasses.replace(config, num_workers=1)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(cfg.seed)
    classes = cfg.classes or _classes_of(data)
    plan = plan_shards(data, 1, cfg.batch_size, classes=classes)
    steps = min(plan.steps_per_epoch, cfg.max_steps_per_epoch or plan.steps_per_epoch)
    reader = cfg.reader_config()
    train_data = make_dataset(list(plan.files), 0, 1, cfg.batch_size, training=cfg.augment,
                              shuffle=cfg.shuffle, config=reader,
                              steps_per_epoch=plan.steps_per_epoch, seed=cfg.seed,
                              cache_dir=cfg.cache_dir, with_weights=True)
    keras_model = build_classifier(model if model is not None else cfg.model, reader, classes)
    schedule = WarmupScaledSchedule(
        cfg.learning_rate, 1, steps, min(cfg.warmup_epochs, cfg.epochs),
        total_epochs=cfg.epochs if cfg.lr_schedule == "cosine" else None)
    keras_model.compile(keras.optimizers.SGD(schedule, momentum=cfg.momentum),
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        weighted_metrics=["accuracy"])
    fit_kwargs = {}
    if validation is not None:
        val_plan = plan_shards(validation, 1, cfg.batch_size, classes=classes)
        fit_kwargs = dict(validation_data=make_dataset(
            list(val_plan.files), 0, 1, cfg.batch_size, training=False, config=reader,
            steps_per_epoch=val_plan.steps_per_epoch, with_weights=True),
            validation_steps=val_plan.steps_per_epoch)
    timer = step_timer(cfg.batch_size)
    callbacks = [timer]
    if report is not None:
        key = "val_accuracy" if validation is not None else "accuracy"
        callbacks.append(keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: report(float(logs[key]))))
    history = keras_model.fit(train_data, epochs=cfg.epochs, steps_per_epoch=steps,
                              callbacks=callbacks, verbose=0, **fit_kwargs).history
    history = {k: [float(v) for v in values] for k, values in history.items()}
    return {"history": history,
            "val_accuracy": history["val_accuracy"][-1] if "val_accuracy" in history else None,
            "images_per_second": _steady(timer.rates), "model": keras_model}


def _classes_of(data) -> int:
    from dist_dl.prepare import classes_of

    fix = ("set classes= in the train settings: the number of classes can only be read from "
           "a local dataset's label index")
    if not isinstance(data, str):
        raise ValueError(f"data is a list of files: {fix}")
    return classes_of(data, fix=fix)[0]


def _steady(rates: list) -> float | None:
    """The mean rate of every epoch but the first (graph tracing, caches
    warming up), or the first if it is alone."""
    known = [r for r in rates[1:] if r is not None] or [r for r in rates[:1] if r is not None]
    return sum(known) / len(known) if known else None
