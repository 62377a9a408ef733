"""``train_distributed``: the driver side of synchronous data-parallel training.

Runs on the Spark driver (a notebook, a job, a pipeline). It checks the input
before any worker starts, turns a DataFrame into image shards once (reusing
them for the same data), plans the shards per worker, opens the MLflow run,
launches the workers (``HorovodRunner`` with
`dist_dl.train.engines.horovod.train()`, or ``TFDistributeRunner`` with
`dist_dl.train.engines.tf_distribute.train()`; locally or on Spark),
retries a failed attempt from the last checkpoint, and returns a
`TrainedModel`.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Callable

from dist_dl.core import compat
from dist_dl.core.deprecation import renamed_parameters
from dist_dl.core.integrity import checkpoint_key, key_id
from dist_dl.core.locations import local_path
from dist_dl.core.session import get_spark
from dist_dl.core.sessionkind import is_connect, session_master
from dist_dl.core.storage import check_shared
from dist_dl.launch.core.errors import JobCancelled
from dist_dl.score import score_dataframe
from dist_dl.tracking.target import absolute_tracking_uri, mlflow_target, store_folder
from dist_dl.train.attempts import TrainingFailed, resumable_epoch, run_attempts
from dist_dl.train.config import TrainConfig

__all__ = ["train_distributed", "TrainedModel", "TrainingFailed"]

@dataclass(frozen=True)
class TrainedModel:
    """What ``train_distributed`` returns.

    Attributes:
        run_id: The MLflow run with parameters, metrics, model and TensorBoard logs.
        model_uri: ``runs:/<run_id>/model``: ``mlflow.pyfunc.load_model(model_uri)``
            (with the run's tracking URI) scores a pandas DataFrame of encoded images.
        tracking_uri: The MLflow tracking URI the run is in.
        registered_model_name: The registered model's name, if registered.
        registered_version: Its version this run registered, if registered.
        history: Metric name -> one value per epoch this run trained, in
            order: epochs ``initial_epoch + 1`` to the last (training ``loss``
            and ``accuracy`` averaged over workers, ``val_loss`` and
            ``val_accuracy`` over all validation rows, ``learning_rate``,
            ``train_images_per_second`` (all workers, training steps only,
            the epoch's first step left out), ``train_cpu_per_second`` (rank
            0's CPU seconds per wall second over those steps),
            ``images_per_second`` and ``epoch_seconds`` (whole epochs, with
            validation and checkpointing); with the torch engine also
            ``train_input_wait_fraction``, the share of those steps' time
            rank 0 waited for its next batch: above 0.2 it says so once,
            with the levers, in its progress lines; and with ``decode="cpu"``
            ``train_region_decode_rejected``, the images of the epoch the
            region decoder refused and another decoded whole, all workers).
        initial_epoch: Epochs already done when this run started (resumed
            from a checkpoint in ``checkpoint_dir``; 0 for a fresh start).
        num_workers: Workers that trained it.
        classes: Number of classes.
        class_names: The classes' names, by index.
        checkpoint_dir: Its checkpoints (a new run pointed there resumes).
        attempts: Attempts it took (1 if nothing failed).
        image_col: The image column ``transform`` reads by default.
        engine: The engine that trained it (``"horovod"``, ``"tensorflow"``
            or ``"torch"``).
    """

    run_id: str
    model_uri: str
    tracking_uri: str
    registered_model_name: str | None
    registered_version: int | None
    history: dict = field(default_factory=dict)
    initial_epoch: int = 0
    num_workers: int = 1
    classes: int = 0
    class_names: tuple = ()
    checkpoint_dir: str = ""
    attempts: int = 1
    image_col: str = "image"
    engine: str = "horovod"

    @property
    def metrics(self) -> dict[str, float]:
        """The last epoch's value of every metric."""
        return {name: values[-1] for name, values in self.history.items() if values}

    def transform(self, df, *, image_col: str | None = None, prediction_col: str = "prediction",
                  probability_col: str = "probability", probabilities_col: str | None = None,
                  batch_size: int = 64, on_error: str = "raise", error_col: str = "score_error"):
        """Score a Spark DataFrame of encoded images on the executors (a
        pandas UDF per partition), adding the predicted class index and its
        probability (and, with ``probabilities_col``, every class's); see
        `dist_dl.score.score_dataframe()` for ``on_error``."""
        with mlflow_target(self.tracking_uri):
            return score_dataframe(df, self.model_uri, image_col=image_col or self.image_col,
                                   prediction_col=prediction_col, probability_col=probability_col,
                                   probabilities_col=probabilities_col, batch_size=batch_size,
                                   on_error=on_error, error_col=error_col)

    def torch_model(self):
        """The trained torch network (float32, eval mode, logits out; its
        input normalised as `Normalize`
        does), loaded from the run's ``pytorch_model`` (MLflow's pytorch
        flavour)."""
        if self.engine != "torch":
            raise ValueError(f"this model was trained by engine {self.engine!r}: use keras_model()")
        import mlflow.pytorch

        with mlflow_target(self.tracking_uri):
            return mlflow.pytorch.load_model(f"runs:/{self.run_id}/pytorch_model").eval()

    def keras_model(self):
        """The trained Keras model, loaded from the run: pixel values 0-255 in
        (its first layer normalises them, as in training), float32 logits out."""
        if self.engine == "torch":
            raise ValueError("this model was trained by engine 'torch': use torch_model()")
        import mlflow.artifacts


        with mlflow_target(self.tracking_uri):
            path = mlflow.artifacts.download_artifacts(f"{self.model_uri}/artifacts/model.keras")
        return compat.load_keras_file(path, compile=False)


@renamed_parameters({"experiment": "experiment_name"})
def train_distributed(data, *, config: TrainConfig | None = None, validation=None,
                      model: str | Callable | None = None, callbacks: Callable[[], list] | None = None,
                      spark=None, tracking_uri: str | None = None, experiment_name: str | None = None,
                      run_name: str | None = None, registered_model_name: str | None = None,
                      **settings) -> TrainedModel:
    """Train an image classifier on all workers, synchronously (Horovod's
    allreduce, tf.distribute's MultiWorkerMirroredStrategy where Horovod is
    missing, or PyTorch DistributedDataParallel: ``engine``).

    Args:
        data: A Spark DataFrame with an encoded-image column (bytes, or paths
            such as ``binaryFile``'s) and a label column (names or indexes),
            or the location of image shards written by
            `dist_dl.prepare.prepare_image_dataset()` (a Parquet folder or
            a Delta table), or with ``engine="torch"`` the folder of a
            Mosaic Streaming (MDS) dataset (as ``dataframe_to_mds`` writes
            it; ``image_col`` and ``label_col`` name its columns, and
            ``classes`` is needed; `dist_dl.read.mds`). A DataFrame is written to shards under
            ``<output_dir>/shards/<fingerprint>`` once: a later call with the
            same data (the same plan over the same input files: names, sizes,
            modification times) and settings reuses them. A DataFrame of
            in-memory data (``createDataFrame``) has nothing that identifies
            it across calls and is written each time.
        config: A `TrainConfig` (e.g. the ``train`` section of a
            ``conf/*.yaml`` file); ``settings`` override its fields.
        validation: Validation data, of the same kind as ``data``. Default:
            for a DataFrame, ``validation_fraction`` of its rows (0: no
            validation pass); for shards, no validation pass (the run's
            ``validation`` parameter is then empty).
        model: A registry name, or a builder ``(input_shape, classes) ->
            keras.Model`` returning logits (default ``config.model``); with
            ``engine="torch"`` a builder returning a ``torch.nn.Module``
            (float images ``[batch, 3, height, width]`` in, logits out).
        callbacks: Function returning extra Keras callbacks, called in every
            worker (it must be picklable); not with ``engine="torch"``.
        spark: SparkSession; default the DataFrame's, or the active one.
        tracking_uri: MLflow tracking URI (default: MLflow's current one).
        experiment_name: MLflow experiment name (default: the active one,
            else "Default"); the old name ``experiment`` is accepted with a
            warning for one release.
        run_name: Name of the MLflow run (default: the model's name).
        registered_model_name: Also register the model under this name.
        **settings: Any `TrainConfig` field, e.g. ``num_workers=4,
            epochs=10, batch_size=64, learning_rate=0.025, label_col="y",
            engine="tensorflow"``.

    Returns:
        The `TrainedModel`.

    Raises:
        ValueError: Bad settings or input, found on the driver before any
            worker starts (missing or mistyped columns, labels outside
            ``[0, classes)``, empty input, fewer row groups than workers,
            undecodable images...), naming the problem and the fix.
        NotEnoughSlots: ``backend="spark"`` and the cluster has fewer task
            slots than ``num_workers``.
        TrainingFailed: Every attempt failed; names the error and the last
            complete checkpoint.
        ImportError: The engine's framework is not installed here: TensorFlow
            for ``"horovod"`` and ``"tensorflow"`` (and ``keras=3``), torch
            for ``"torch"``.
    """
    cfg = _settings(config, settings)
    cfg = dataclasses.replace(cfg, engine=_engine(cfg))
    builder = model if model is not None else cfg.model
    if not (callable(builder) or isinstance(builder, str)):
        raise ValueError(f"model must be a registry name or a builder function, got {builder!r}")
    if isinstance(builder, str) and builder not in _model_names():
        kind = "torch.nn.Module" if cfg.engine == "torch" else "keras.Model"
        raise ValueError(f"unknown model {builder!r}: use one of {', '.join(_model_names())} or "
                         f"pass a builder function (input_shape, classes) -> {kind}")
    if isinstance(builder, str) and cfg.engine == "torch":
        from dist_dl.train.models_torch import check_registry_model

        check_registry_model(builder)
    if callbacks is not None and cfg.engine == "torch":
        raise ValueError("callbacks are Keras callbacks, and engine 'torch' trains a torch "
                         "module: drop callbacks (the run's metrics are in MLflow), or train a "
                         "Keras model with engine='horovod' or 'tensorflow'")
    if callbacks is not None and not callable(callbacks):
        raise ValueError("callbacks must be a function that returns a list of Keras callbacks "
                         "(it runs in every worker)")
    output_dir = local_path(cfg.output_dir, "output_dir")
    spark = spark or _session_of(data) or _session_of(validation)
    if spark is None and cfg.backend == "spark":
        spark = get_spark()
    if spark is not None and (_is_dataframe(data) or _backend(cfg.backend, spark) == "spark"):
        _check_shared(spark, data, validation, cfg, tracking_uri)

    train_url, val_url, rows, disposable = _resolve_inputs(data, validation, cfg, output_dir,
                                                           spark)
    try:
        return _train(train_url, val_url, rows, cfg, builder, callbacks, spark, output_dir,
                      tracking_uri, experiment_name, run_name, registered_model_name)
    finally:
        if disposable is not None:
            shutil.rmtree(disposable, ignore_errors=True)


def _check_shared(spark, data, validation, cfg: TrainConfig, tracking_uri: str | None) -> None:
    """Executors write a DataFrame's shards, and workers on Spark tasks read
    the shards, write checkpoints and log to MLflow: every such folder must
    be shared."""
    import mlflow


    outputs = {"output_dir": cfg.output_dir, "checkpoint_dir": cfg.checkpoint_dir or None,
               "MLflow tracking store": store_folder(tracking_uri or mlflow.get_tracking_uri())}
    inputs = {name: os.fspath(value) for name, value in (("data", data),
                                                          ("validation", validation))
              if isinstance(value, (str, os.PathLike))}
    check_shared(spark, outputs, inputs, "train_distributed")


def _train(train_url, val_url, rows, cfg, builder, callbacks, spark, output_dir, tracking_uri,
           experiment_name, run_name, registered_model_name) -> TrainedModel:
    """Plan, open the run, launch (with retries), collect the result."""
    backend = _backend(cfg.backend, spark)
    if backend == "spark" and spark is None:
        spark = get_spark()
    spec, client = open_run(train_url, val_url, rows, cfg, builder, callbacks, backend,
                            output_dir, tracking_uri, experiment_name, run_name,
                            registered_model_name)
    run_id = spec.run_id
    try:
        result, attempts = run_attempts(spec, cfg, backend, spark, client, run_id)
    except BaseException as exc:
        killed = isinstance(exc, (KeyboardInterrupt, JobCancelled))
        client.set_terminated(run_id, "KILLED" if killed else "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return trained_model(spec, result, client, attempts)


def trained_model(spec, result: dict, client, attempts: int) -> TrainedModel:
    """The `TrainedModel` of a finished run: ``spec``'s, with rank 0's ``result``."""
    return TrainedModel(
        run_id=spec.run_id, model_uri=result["model_uri"], tracking_uri=spec.tracking_uri,
        registered_model_name=spec.registered_model_name,
        registered_version=result.get("registered_version"), history=_history(client, spec.run_id),
        initial_epoch=spec.initial_epoch, num_workers=spec.config.num_workers,
        classes=spec.classes, class_names=spec.class_names, checkpoint_dir=spec.checkpoint_dir,
        attempts=attempts, image_col=spec.config.image_col, engine=spec.config.engine)


def open_run(train_url, val_url, rows, cfg, builder, callbacks, backend: str, output_dir,
             tracking_uri, experiment_name, run_name, registered_model_name):
    """Plan the attempt and open its MLflow run: ``(WorkerSpec, MlflowClient)``.

    What ``train_distributed`` does on the driver before it launches the
    workers, and what `dist_dl.train.torchrun.train_torch_rank()` does on
    rank 0 under a launcher of its own.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from dist_dl.prepare import classes_of

    classes, class_names = classes_of(train_url, cfg.classes,
                                      fix="pass classes=<number of classes>, or write the shards "
                                          "with dist_dl.prepare.prepare_image_dataset")
    plan = _plan(train_url, cfg, classes, "data")
    val_plan = _plan(val_url, cfg, classes, "validation") if val_url else None
    train_steps = min(plan.steps_per_epoch, cfg.max_steps_per_epoch or plan.steps_per_epoch)

    uri = absolute_tracking_uri(tracking_uri or mlflow.get_tracking_uri())
    with mlflow_target(uri, experiment_name) as experiment_id:
        client = MlflowClient(uri)
        name = run_name or (builder if isinstance(builder, str) else
                            getattr(builder, "__name__", "custom_model"))
        run = client.create_run(experiment_id, run_name=name,
                                tags={"dist_dl.entry": "train_distributed"})
    run_id = run.info.run_id
    checkpoint_dir = local_path(cfg.checkpoint_dir, "checkpoint_dir") if cfg.checkpoint_dir else \
        os.path.join(output_dir, "checkpoints", run_id)
    _log_params(client, run_id, cfg, builder, backend, train_url, val_url, plan, val_plan,
                train_steps, classes, rows, checkpoint_dir)
    # Signs this run's checkpoints; the same key lets a later run resume from
    # them. Only its public id goes to MLflow.
    key = checkpoint_key()
    client.set_tag(run_id, "dist_dl.checkpoint_key_id", key_id(key))
    try:
        initial_epoch = resumable_epoch(checkpoint_dir, cfg, key)
    except BaseException:  # e.g. an untrusted checkpoint: the run is not left running
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_tag(run_id, "dist_dl.initial_epoch", str(initial_epoch))

    from dist_dl.train.engines.core import WorkerSpec

    spec = WorkerSpec(config=cfg, model=builder, train_files=plan.files, train_steps=train_steps,
                      reader_steps=plan.steps_per_epoch,
                      val_files=val_plan.files if val_plan else (),
                      val_steps=val_plan.steps_per_epoch if val_plan else 0, classes=classes,
                      class_names=tuple(class_names), checkpoint_dir=checkpoint_dir,
                      tensorboard_dir=os.path.join(output_dir, "tensorboard", run_id),
                      tracking_uri=uri, run_id=run_id,
                      registered_model_name=registered_model_name,
                      registry_uri=_registry_uri() if registered_model_name else None,
                      callbacks=callbacks,
                      checkpoint_key=key, initial_epoch=initial_epoch)
    return spec, client


def _registry_uri() -> str | None:
    """The driver's model registry when it is not the tracking store's own (a
    notebook's ``mlflow.set_registry_uri``, ``"databricks-uc"``): rank 0
    registers there, where the driver will look for the model; a process's
    ``set_registry_uri`` does not reach the workers. None: the tracking
    store's registry, which rank 0 uses by default."""
    import mlflow

    registry = mlflow.get_registry_uri()
    return None if registry == mlflow.get_tracking_uri() else registry


# ----------------------------------------------------------------- settings

def _settings(config: TrainConfig | None, settings: dict) -> TrainConfig:
    if config is not None and not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig (the train section of a configuration), "
                         f"got {type(config).__name__}")
    valid = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(settings) - valid)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(valid), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"train_distributed got unknown setting {unknown[0]!r}{hint}; "
                         f"settings are the TrainConfig fields: {', '.join(sorted(valid))}")
    return dataclasses.replace(config or TrainConfig(), **settings)


def _engine(cfg: TrainConfig) -> str:
    """The engine ``cfg.engine`` names, checked on the driver: Horovod must
    import, and tf.distribute gets no setting only Horovod has."""
    from dist_dl.core.optional import require_installed, torch_only
    from dist_dl.launch import auto_engine
    from dist_dl.train.config import HOROVOD_ONLY

    # auto_engine() imports Horovod (and TensorFlow): at most once, and not
    # for an explicit engine="tensorflow".
    engine = cfg.engine
    if engine == "torch" or (engine == "auto" and cfg.keras == 2 and torch_only()):
        return _torch_engine(cfg)
    if cfg.decode != "cpu":
        raise ValueError(f"decode={cfg.decode!r} is the torch engine's (torchvision's GPU JPEG "
                         f"decoder); engine {engine!r} decodes on the CPU: use engine='torch', "
                         "or leave decode='cpu'")
    # Every other engine trains a Keras model: TensorFlow must be installed
    # (Databricks Runtime 19 ML ships none).
    require_installed("tensorflow", f"engine={engine!r}" + (f" with keras={cfg.keras}"
                                                            if cfg.keras != 2 else ""))
    if cfg.keras == 3:
        problem = compat.keras3_training_problem()
        if problem is not None:
            raise ValueError(problem)
        if engine == "horovod":
            raise ValueError(
                "keras=3 with engine='horovod': Horovod's Keras integration works with Keras 2 "
                "only (horovod#4290); use engine='tensorflow' (or 'auto') for a Keras 3 model, "
                "or keras=2 (tf-keras) with Horovod")
        engine = "tensorflow"
    if engine == "auto":
        engine = auto_engine()
    elif engine == "horovod" and auto_engine() != "horovod":
        raise ValueError(
            "engine='horovod' but horovod.tensorflow does not import here (Databricks Runtime "
            "16.0 ML and later ship no Horovod): use engine='tensorflow' or 'auto', or install "
            "Horovod built against this TensorFlow")
    if engine == "tensorflow":
        chosen = [f"{name}={getattr(cfg, name)!r}" for name, default in HOROVOD_ONLY.items()
                  if getattr(cfg, name) != default]
        if chosen:
            why = " (chosen by engine='auto': Horovod does not import here)" \
                if cfg.engine == "auto" else ""
            raise ValueError(
                f"{', '.join(chosen)}: Horovod's allreduce settings, which engine 'tensorflow'"
                f"{why} has no counterpart for: leave them at their defaults, or use "
                "engine='horovod'")
    return engine


def _torch_engine(cfg: TrainConfig) -> str:
    """``"torch"``, once torch imports and no setting of another engine is chosen."""
    from dist_dl.core.optional import install_hint
    from dist_dl.train.config import HOROVOD_ONLY

    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"engine='torch' needs PyTorch, which does not import here ({exc}): "
                          f"{install_hint('torch')}") from exc
    why = " (chosen by engine='auto': TensorFlow is not installed here)" \
        if cfg.engine == "auto" else ""
    if cfg.keras != 2:
        raise ValueError(f"keras={cfg.keras} with engine 'torch'{why}: keras chooses the Keras "
                         "version of the TensorFlow engines; leave it at 2 with engine='torch'")
    chosen = [f"{name}={getattr(cfg, name)!r}" for name, default in HOROVOD_ONLY.items()
              if getattr(cfg, name) != default]
    if cfg.reader == "petastorm":
        chosen.append("reader='petastorm'")
    if cfg.cache_dir is not None:
        chosen.append(f"cache_dir={cfg.cache_dir!r}")
    if chosen:
        raise ValueError(f"{', '.join(chosen)}: settings of the TensorFlow engines, which engine "
                         f"'torch'{why} has no counterpart for: leave them at their defaults "
                         "(the torch reader is the arrow one, and decodes every epoch)")
    return "torch"


def _model_names() -> tuple:
    from dist_dl.train.models import MODEL_NAMES

    return MODEL_NAMES


def _session_of(data):
    return getattr(data, "sparkSession", None)


def _is_dataframe(data) -> bool:
    return hasattr(data, "sparkSession") and hasattr(data, "schema")


def _backend(choice: str, spark) -> str:
    if choice != "auto":
        return choice
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is None:
        return "local"
    # A Spark Connect session's client may run anywhere (Databricks Connect:
    # a laptop): its workers run on the cluster's tasks.
    if is_connect(spark):
        return "spark"
    # Same machine either way on local[N]: processes start in a fraction of
    # a second, Spark tasks in several (benchmarks/RESULTS.md, launcher).
    if session_master(spark).startswith("local"):
        return "local"
    return "spark"


# --------------------------------------------------------------- the data

def _resolve_inputs(data, validation, cfg: TrainConfig, output_dir: str, spark):
    """(train shards URL, validation shards URL or None, rows written per
    split, a folder to delete after training or None)."""
    if data is None:
        raise ValueError("data is None: pass a Spark DataFrame of images and labels, or the "
                         "location of image shards")
    if not _is_dataframe(data):
        if not isinstance(data, (str, os.PathLike)):
            raise ValueError(f"data must be a Spark DataFrame or a shards location, "
                             f"got {type(data).__name__}")
        if cfg.max_side is not None:
            raise ValueError(f"max_side={cfg.max_side} sets the size a DataFrame's images are "
                             "stored at, but data is a shards location, read as written: drop "
                             "max_side, or write the shards with prepare_image_dataset(..., "
                             f"config=ShardConfig(max_side={cfg.max_side}))")
        val = validation
        if _is_dataframe(val):
            raise ValueError("validation is a DataFrame but data is a shards location: write "
                             "both with prepare_image_dataset (or pass both as DataFrames)")
        return os.fspath(data), (os.fspath(val) if val is not None else None), {}, None
    if validation is not None and not _is_dataframe(validation):
        raise ValueError("data is a DataFrame but validation is not: pass validation as a "
                         "DataFrame too (or None to hold out validation_fraction of data)")
    from dist_dl.prepare.materialise import materialise_dataframe

    return materialise_dataframe(data, validation, output_dir, image_col=cfg.image_col,
                                 label_col=cfg.label_col, classes=cfg.classes, seed=cfg.seed,
                                 num_workers=cfg.num_workers,
                                 validation_fraction=cfg.validation_fraction,
                                 max_side=cfg.max_side)


def _plan(url: str, cfg: TrainConfig, classes: int, what: str):
    from dist_dl.read import choose_reader, plan_shards

    from dist_dl.read.mds import is_mds, mds_shards

    if is_mds(url):
        if cfg.engine != "torch":
            raise ValueError(f"{what} {url} is a Mosaic Streaming (MDS) dataset, which engine "
                             "'torch' reads: use engine='torch', or write the data with "
                             "dist_dl.prepare.prepare_image_dataset")
        # Its columns are checked here, on the driver, and named where one is missing.
        files = mds_shards(url, image_col=cfg.image_col, label_col=cfg.label_col)
    else:
        files = url
        if cfg.reader == "petastorm":
            choose_reader(cfg.reader)  # missing here: say so before any worker starts
    try:
        return plan_shards(files, cfg.num_workers, cfg.batch_size, classes=classes)
    except ValueError as exc:
        raise ValueError(f"{what} {url}: {exc}") from None


# --------------------------------------------------------------- tracking

_URL_SECRET = re.compile(r"\?[^\s]*")


def _public(location: str | None) -> str:
    """A location as a parameter: query strings (SAS tokens, signed URLs)
    never reach MLflow."""
    return "" if location is None else _URL_SECRET.sub("?<redacted>", str(location))


def _log_params(client, run_id, cfg: TrainConfig, builder, backend, train_url, val_url, plan,
                val_plan, train_steps, classes, rows, checkpoint_dir) -> None:
    from mlflow.entities import Metric, Param

    params = {f"train.{k}": v for k, v in dataclasses.asdict(cfg).items()}
    params.update({
        "train.model": builder if isinstance(builder, str) else
        f"{getattr(builder, '__module__', '?')}.{getattr(builder, '__qualname__', repr(builder))}",
        "train.output_dir": _public(cfg.output_dir), "train.cache_dir": _public(cfg.cache_dir),
        "train.checkpoint_dir": _public(checkpoint_dir),
        "backend": backend, "data": _public(train_url), "validation": _public(val_url),
        "data_rows": plan.rows, "validation_rows": val_plan.rows if val_plan else 0,
        "row_groups": plan.row_groups, "steps_per_epoch": train_steps,
        "validation_steps": val_plan.steps_per_epoch if val_plan else 0, "classes": classes,
        "global_batch_size": cfg.batch_size * cfg.num_workers,
        "scaled_learning_rate": cfg.learning_rate * (cfg.num_workers if cfg.scale_learning_rate
                                                     else 1),
    })
    for split, counts in rows.items():
        params[f"materialised.{split}.rows_skipped"] = counts["skipped"]
    params.update(_encoding_params(train_url))
    client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(params.items())],
                     metrics=[Metric("num_workers", cfg.num_workers, _now_ms(), 0)])


def _encoding_params(train_url: str) -> dict:
    """``data.resize_short_side``, ``data.max_side``, ``data.jpeg_quality``:
    how the training shards' images were stored, from their summary (none
    for shards without one, or on storage not readable here)."""
    from dist_dl.prepare.writer import read_summary

    encoding = (read_summary(train_url) or {}).get("encoding")
    if not isinstance(encoding, dict):
        return {}
    return {f"data.{key}": value for key, value in encoding.items()}


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _history(client, run_id: str) -> dict[str, list[float]]:
    """Per-epoch metric values (the last one logged for each epoch)."""
    run = client.get_run(run_id)
    history = {}
    for key in sorted(run.data.metrics):
        if key == "num_workers":
            continue
        by_step = {}
        for metric in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
            by_step[metric.step] = metric.value
        history[key] = [by_step[s] for s in sorted(by_step)]
    return history
