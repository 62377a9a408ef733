"""The steps of a job, each from one `PipelineConfig`.

Driver side. The command line (``dist-dl <step> --config ...``), the job
definitions in ``jobs/`` and the notebooks all call these functions, so a
step behaves the same wherever it runs:

- `prepare_data()`: the ``data`` section's source to shards in
  ``<data.output>/train`` and ``<data.output>/validation``;
- `train()`: ``train_distributed`` on those shards, logged per ``tracking``;
- `evaluate()`: the registered model's accuracy on the validation
  shards (scored on the executors); promote it (registry alias) if it passes;
- `score()`: batch scoring with the promoted model;
- `bench()`, `ensemble()`, `search()`: the other jobs;
- `run_pipeline()`: prepare, train, evaluate, score in one go (``make demo``).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from typing import Any

from dist_dl.app.config import PipelineConfig
from dist_dl.core.locations import local_path, spark_path
from dist_dl.core.optional import require
from dist_dl.core.storage import check_shared

__all__ = ["prepare_data", "train", "evaluate", "score", "bench", "ensemble", "search",
           "run_pipeline", "GateFailed", "model_versions", "registered_or_trained"]


class GateFailed(RuntimeError):
    """The trained model did not reach ``evaluate.min_accuracy``: not promoted."""


def _spark(master: str | None, spark=None):
    if spark is not None:
        return spark
    from dist_dl.core.session import get_spark

    return get_spark(master)


def _tracking_uri(config: PipelineConfig) -> str | None:
    from dist_dl.tracking.target import absolute_tracking_uri

    return absolute_tracking_uri(config.tracking.tracking_uri)


def _has_shards(location: str) -> bool:
    from dist_dl.read.resolve import resolve_files

    try:
        resolve_files(location)
    except (FileNotFoundError, ValueError):
        return False
    return True


# ------------------------------------------------------------------- data

def prepare_data(config: PipelineConfig, *, master: str | None = None, spark=None) -> dict:
    """Write the ``data`` section's source as train and validation shards.

    Returns:
        ``{"train": summary, "validation": summary or None}`` (the summaries
        also stand in each output's ``_summary.json``).
    """
    from dist_dl.prepare import make_synthetic_images, prepare_image_dataset, write_digits_tree

    d = config.data
    summaries: dict[str, Any] = {"validation": None}
    common = dict(format=d.format, mode=d.mode)
    if d.source == "synthetic":
        held_out = int(round(d.synthetic_rows * d.validation_fraction))
        summaries["train"] = make_synthetic_images(
            d.train_output, rows=d.synthetic_rows - held_out, image_size=d.image_size,
            classes=d.classes, seed=d.seed, rows_per_row_group=d.rows_per_row_group,
            jpeg_quality=d.jpeg_quality, **common)
        if held_out:
            summaries["validation"] = make_synthetic_images(
                d.validation_output, rows=held_out, image_size=d.image_size, classes=d.classes,
                seed=d.seed + 1, rows_per_row_group=d.rows_per_row_group,
                jpeg_quality=d.jpeg_quality, **common)
    else:
        spark = _spark(master, spark)
        common.update(on_bad_image=d.on_bad_image, config=d.shard_config(), spark=spark)
        if d.source == "sklearn_digits":
            # The executors read the images, so they go under data.output
            # (which must be shared storage), never a driver-local temp folder.
            scratch = os.path.join(local_path(d.output, "data.output"),
                                   f"_digits-{uuid.uuid4().hex[:12]}")
            try:
                train_dir, val_dir = write_digits_tree(
                    scratch, image_size=d.image_size, validation_fraction=d.validation_fraction,
                    seed=d.seed)
                summaries.update(_prepare_folders(prepare_image_dataset, d, train_dir,
                                                  val_dir if d.validation_fraction else None,
                                                  None, common))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        elif d.source == "folder":
            summaries.update(_prepare_folders(prepare_image_dataset, d, d.train_dir, d.val_dir,
                                              d.val_labels_file, common))
        else:  # table
            frame = spark.table(d.table)
            parts = (frame.randomSplit([1 - d.validation_fraction, d.validation_fraction],
                                       seed=d.seed) if d.validation_fraction else (frame, None))
            classes = None if _string_labels(frame, d.label_col) else d.classes
            summaries["train"] = prepare_image_dataset(
                d.train_output, dataframe=parts[0], image_col=d.image_col,
                label_col=d.label_col, classes=classes, **common)
            if parts[1] is not None:
                summaries["validation"] = prepare_image_dataset(
                    d.validation_output, dataframe=parts[1], image_col=d.image_col,
                    label_col=d.label_col, label_index=d.train_output, **common)
    for split in ("train", "validation"):
        summary = summaries[split]
        if summary is not None:
            summary = summary if isinstance(summary, dict) else summary.to_dict()
            summaries[split] = summary
            print(f"dist_dl prepare-data: {split}: {summary['rows_in']} rows in, "
                  f"{summary['rows_written']} written, {summary['rows_skipped']} skipped "
                  f"{summary.get('skipped_by_reason') or ''} -> {summary['output']}")
    return summaries


def _prepare_folders(prepare, d, train_dir, val_dir, val_labels_file, common) -> dict:
    out = {"train": prepare(d.train_output, image_dir=train_dir, **common), "validation": None}
    if val_dir:
        out["validation"] = prepare(d.validation_output, image_dir=val_dir,
                                    labels_file=val_labels_file, label_index=d.train_output,
                                    **common)
    else:
        print("dist_dl prepare-data: no data.val_dir: no validation shards are written")
    return out


def _string_labels(frame, column: str) -> bool:
    from pyspark.sql.types import StringType

    return column in frame.columns and isinstance(frame.schema[column].dataType, StringType)


# ------------------------------------------------------------------ train

def train(config: PipelineConfig, *, master: str | None = None, spark=None):
    """``train_distributed`` on ``<data.output>/train`` (validated on
    ``<data.output>/validation`` when it exists); returns the TrainedModel."""
    from dist_dl.train import train_distributed

    data = config.data.train_output
    validation = config.data.validation_output if _has_shards(config.data.validation_output) \
        else None
    if config.train.backend == "spark" or master is not None:
        spark = _spark(master, spark)
    trained = train_distributed(
        data, validation=validation, config=config.train, spark=spark,
        tracking_uri=_tracking_uri(config), experiment_name=config.tracking.experiment_name,
        run_name=config.tracking.run_name,
        registered_model_name=config.tracking.registered_model_name)
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(trained.metrics.items()))
    print(f"dist_dl train: MLflow run {trained.run_id} ({trained.tracking_uri}); {metrics}")
    if trained.registered_model_name:
        print(f"dist_dl train: registered as {trained.registered_model_name} "
              f"version {trained.registered_version}")
    return trained


# --------------------------------------------------------------- evaluate

def _registered_model(config: PipelineConfig, alias: str | None = None) -> tuple[str, str, Any]:
    """(model URI, run id, version) of the registered model: the version with
    ``alias``, or else the newest version."""
    from mlflow.tracking import MlflowClient

    name = config.tracking.registered_model_name
    if not name:
        raise ValueError("tracking.registered_model_name is not set: evaluate and score use the "
                         "registered model (or set score.model_uri)")
    client = MlflowClient(_tracking_uri(config))
    if alias is not None:
        version = client.get_model_version_by_alias(name, alias)
    else:
        versions = model_versions(client, name)
        if not versions:
            raise ValueError(f"no version of the registered model {name!r}: run train first")
        version = max(versions, key=lambda v: int(v.version))
    return f"models:/{name}/{version.version}", version.run_id, version


def evaluate(config: PipelineConfig, *, model_uri: str | None = None, master: str | None = None,
             spark=None) -> dict:
    """Accuracy of the newest registered version (or ``model_uri``) on the
    validation shards, scored on the executors; logged to the model's run as
    ``eval_accuracy``. The version gets the ``evaluate.alias`` if it reaches
    ``evaluate.min_accuracy``.

    Raises:
        GateFailed: It does not (the alias is left where it was).
    """
    from mlflow.tracking import MlflowClient
    from pyspark.sql import functions as F

    from dist_dl.score import score_dataframe
    from dist_dl.tracking.target import mlflow_target

    shards = config.data.validation_output
    if not _has_shards(shards):
        raise ValueError(f"no validation shards at {shards}: run prepare-data with a validation "
                         "set (data.val_dir, or data.validation_fraction > 0)")
    version = run_id = None
    if model_uri is None:
        model_uri, run_id, version = _registered_model(config)
    spark = _spark(master, spark)
    frame = _shards_frame(spark, shards)
    with mlflow_target(_tracking_uri(config)):
        scored = score_dataframe(frame, model_uri, image_col="image",
                                 batch_size=config.evaluate.batch_size)
    row = scored.agg(F.count("*").alias("rows"),
                     F.avg((F.col("prediction") == F.col("label")).cast("double"))
                     .alias("accuracy")).first()
    accuracy, rows = float(row["accuracy"]), int(row["rows"])
    result = {"model_uri": model_uri, "accuracy": accuracy, "rows": rows, "promoted": False}
    client = MlflowClient(_tracking_uri(config))
    if run_id is not None:
        client.log_metric(run_id, "eval_accuracy", accuracy)
    print(f"dist_dl evaluate: {model_uri}: accuracy {accuracy:.4f} on {rows} validation images "
          f"(min_accuracy {config.evaluate.min_accuracy})")
    if accuracy < config.evaluate.min_accuracy:
        raise GateFailed(f"{model_uri} reached accuracy {accuracy:.4f} on {rows} validation "
                         f"images, below evaluate.min_accuracy={config.evaluate.min_accuracy}: "
                         f"not promoted to {config.evaluate.alias!r}")
    if version is not None:
        client.set_registered_model_alias(version.name, config.evaluate.alias, version.version)
        result["promoted"] = True
        print(f"dist_dl evaluate: {version.name} version {version.version} is now "
              f"@{config.evaluate.alias}")
    return result


def _shards_frame(spark, location: str):
    """A DataFrame over image shards, Parquet or Delta (the exact files of the
    table's version, so no Delta jars are needed)."""
    from dist_dl.read.resolve import resolve_files

    return spark.read.parquet(*resolve_files(location))


# ------------------------------------------------------------------ score

def score(config: PipelineConfig, *, master: str | None = None, spark=None,
          model_uri: str | None = None) -> dict:
    """Score ``score.input`` (image shards, or a table with ``score.image_col``;
    default: the validation shards) with ``score.model_uri`` (default: the
    registered model's ``evaluate.alias`` version), writing ``score.output``
    (a Parquet folder, or a table when the input is a table)."""
    from dist_dl.score import score_dataframe
    from dist_dl.tracking.target import mlflow_target

    s = config.score
    model_uri = model_uri or s.model_uri
    if model_uri is None:
        model_uri = _registered_model(config, alias=config.evaluate.alias)[0]
    spark = _spark(master, spark)
    source = s.input or config.data.validation_output
    is_table = s.input is not None and "/" not in s.input and ":" not in s.input
    frame = spark.table(source) if is_table else _shards_frame(spark, source)
    image_col = s.image_col if is_table else "image"
    with mlflow_target(_tracking_uri(config)):
        scored = score_dataframe(frame, model_uri, image_col=image_col, batch_size=s.batch_size,
                                 on_error=s.on_error)
    # The image bytes are the input, not the result: leave them out.
    result = scored.drop(image_col)
    output = s.output or os.path.join(config.train.output_dir, "scored")
    to_table = is_table and "/" not in output
    check_shared(spark, {} if to_table else {"score.output": output},
                 {} if is_table else {"score.input": source}, "dist-dl score")
    if to_table:
        result.write.mode("overwrite").saveAsTable(output)
        rows = spark.read.table(output).count()
    else:
        output = spark_path(output)
        result.write.mode("overwrite").parquet(output)
        rows = spark.read.parquet(output).count()
    print(f"dist_dl score: {rows} rows scored with {model_uri} -> {output}")
    return {"model_uri": model_uri, "rows": rows, "output": output}


# ------------------------------------------------------------ other jobs

def bench(config: PipelineConfig, *, master: str | None = None, spark=None) -> dict:
    """The throughput and scaling benchmark of the ``bench`` section."""
    from dist_dl.app.bench import run_benchmark

    return run_benchmark(config.bench, spark=spark if spark is not None or master is None
                         else _spark(master),
                         log_to_mlflow=config.bench.results is not None,
                         tracking_uri=_tracking_uri(config), experiment_name=config.tracking.experiment_name)


def _sklearn_frame(spark, source: str, label_col: str):
    import pandas as pd

    datasets = require("sklearn.datasets", f"the ensemble source {source!r}")

    loader = {"sklearn_digits": datasets.load_digits, "sklearn_wine": datasets.load_wine,
              "sklearn_breast_cancer": datasets.load_breast_cancer}[source]
    data = loader()
    pdf = pd.DataFrame(data.data, columns=[f"f{i}" for i in range(data.data.shape[1])])
    pdf[label_col] = data.target.astype("int64")
    return spark.createDataFrame(pdf)


def ensemble(config: PipelineConfig, *, master: str | None = None, spark=None):
    """Random forests, one per Spark partition, per the ``ensemble`` section."""
    from pyspark.sql.types import NumericType

    from dist_dl.ensemble import train_ensemble

    e = config.ensemble
    spark = _spark(master, spark)
    frame = spark.table(e.table) if e.source == "table" else _sklearn_frame(spark, e.source,
                                                                           e.label_col)
    if e.label_col not in frame.columns:
        raise ValueError(f"ensemble.label_col {e.label_col!r} is not a column; columns: "
                         f"{frame.columns}")
    features = e.feature_cols or tuple(
        f.name for f in frame.schema.fields
        if isinstance(f.dataType, NumericType) and f.name != e.label_col)
    n_estimators, max_depth = e.n_estimators, e.max_depth

    def forest(member):
        RandomForestClassifier = require("sklearn.ensemble",
                                         "the ensemble's forests").RandomForestClassifier

        return RandomForestClassifier(n_estimators=n_estimators, max_depth=max_depth,
                                      random_state=e.seed + member, n_jobs=1)

    result = train_ensemble(frame, forest, num_models=e.num_models, feature_cols=list(features),
                            label_col=e.label_col, combine=e.combine,
                            validation_fraction=e.validation_fraction, seed=e.seed,
                            output_dir=config.train.output_dir,
                            tracking_uri=_tracking_uri(config),
                            experiment_name=config.tracking.experiment_name)
    print(f"dist_dl ensemble: accuracy {result.score:.4f} on held-out rows (members "
          f"{', '.join(f'{s:.4f}' for s in result.member_scores)}); MLflow run {result.run_id}")
    return result


def search(config: PipelineConfig, *, master: str | None = None, spark=None):
    """Trials of the ``train`` settings named in ``search.space``, each a
    single-process training on the data shards in one Spark task; the
    objective is the last epoch's validation accuracy (maximised)."""
    from dist_dl.prepare import classes_of
    from dist_dl.search import search as run_search

    # Each trial trains a Keras model in its Spark task: checked here, before any starts.
    from dist_dl.core.optional import require_installed

    require_installed("tensorflow", "the search job (each trial trains a Keras model, "
                                    "dist_dl.train.single)")
    s = config.search
    spark = _spark(master, spark)
    data = config.data.train_output
    validation = config.data.validation_output if _has_shards(config.data.validation_output) \
        else None
    # The trials get the shards' file list, which has no label index beside
    # it: the class count is read here, on the driver.
    base = dataclasses.replace(config.train, epochs=s.epochs,
                               classes=config.train.classes or classes_of(
                                   data, fix="run prepare-data, or set train.classes")[0],
                               max_steps_per_epoch=s.max_steps_per_epoch or
                               config.train.max_steps_per_epoch)
    data_files, val_files = _files(data), (_files(validation) if validation else None)

    def trial(params, reporter):
        from dist_dl.train.single import train_single

        result = train_single(dataclasses.replace(base, **params), data_files, val_files,
                              report=reporter.report)
        return result["val_accuracy"] if val_files else result["history"]["accuracy"][-1]

    result = run_search(trial, dict(s.space), max_trials=s.max_trials,
                        max_concurrent=s.max_concurrent, algorithm=s.algorithm, mode="max",
                        early_stopping=s.early_stopping, seed=s.seed, spark=spark,
                        tracking_uri=_tracking_uri(config),
                        experiment_name=config.tracking.experiment_name, metric_name="val_accuracy")
    print(f"dist_dl search: best val_accuracy {result.best_value:.4f} with {result.best_params} "
          f"(MLflow run {result.best_run_id}, parent {result.parent_run_id})")
    return result


def _files(location: str) -> list[str]:
    from dist_dl.read.resolve import resolve_files

    return resolve_files(location)


# --------------------------------------------------------------- pipeline

def run_pipeline(config: PipelineConfig, *, master: str | None = None, spark=None) -> dict:
    """prepare-data, train, evaluate and score, in this process."""
    spark = _spark(master, spark)
    prepared = prepare_data(config, spark=spark)
    trained = train(config, spark=spark)
    result = {"prepare": prepared, "trained": trained}
    if trained.registered_model_name and prepared.get("validation"):
        result["evaluate"] = evaluate(config, spark=spark)
        result["score"] = score(config, spark=spark)
    else:
        print("dist_dl pipeline: evaluate and score need tracking.registered_model_name and "
              "validation shards; skipped")
    print(f"\ndist_dl pipeline: done. Shards: {os.path.abspath(config.data.output)}; MLflow run "
          f"{trained.run_id} in {trained.tracking_uri}"
          + (f"; registered model {trained.registered_model_name} version "
             f"{trained.registered_version}" if trained.registered_model_name else "")
          + (f"; scored rows: {result['score']['output']}" if "score" in result else ""))
    if trained.tracking_uri.startswith("file://"):
        print(f"  browse: mlflow ui --backend-store-uri {trained.tracking_uri}")
    return result


# ------------------------------------------------------- registry lookups

def model_versions(client, name: str) -> list:
    """Every version of the registered model ``name`` (MLflow ``ModelVersion``s).

    The registry's search takes a filter string, and MLflow's filter grammar
    has no escape for a quote inside a quoted name: the name goes in as a
    literal in the quote it does not contain, and a name that no quote can
    hold (both kinds, or a backslash, which the parser reads as an escape) is
    refused, so no name can change what the filter selects.

    Args:
        client: An ``mlflow.tracking.MlflowClient``.
        name: The registered model's name.

    Raises:
        ValueError: ``name`` is empty or cannot be quoted safely.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"registered model name {name!r}: give a non-empty name")
    quote = "'" if "'" not in name else '"'
    if quote in name or "\\" in name or any(ord(c) < 32 for c in name):
        raise ValueError(f"registered model name {name!r} holds both kinds of quotes, a "
                         "backslash or a control character, which an MLflow registry search "
                         "cannot match safely: register the model under a plainer name")
    found = client.search_model_versions(f"name = {quote}{name}{quote}")
    return [v for v in found if v.name == name]  # the exact name, whatever the store's matching


def registered_or_trained(config: PipelineConfig, *, train_if_missing: bool = False,
                          master: str | None = None, spark=None) -> str:
    """The model the evaluate and score steps will use, trained first if asked.

    ``score.model_uri`` when set; else the newest version of
    ``tracking.registered_model_name``. A registered model with no version
    yet is trained (`train()`, which registers it) when
    ``train_if_missing``, and is an error otherwise: on a cluster a missing
    model should not start a long training from a scoring notebook.

    Returns:
        The model URI (``models:/<name>/<version>``, or ``score.model_uri``).

    Raises:
        ValueError: Neither a model URI nor a registered model name is set,
            or the model has no version and ``train_if_missing`` is False.
    """
    if config.score.model_uri is not None:
        return config.score.model_uri
    from mlflow.tracking import MlflowClient

    name = config.tracking.registered_model_name
    if not name:
        raise ValueError("set tracking.registered_model_name (the registered_model widget), or "
                         "score.model_uri to score a model that is not registered")
    if not model_versions(MlflowClient(_tracking_uri(config)), name):
        if not train_if_missing:
            raise ValueError(f"the registered model {name!r} has no version: run the training "
                             "workflow's train task first, or set train_if_missing=true")
        print(f"dist_dl: no version of {name!r} registered yet: training one first")
        train(config, master=master, spark=spark)
    return _registered_model(config)[0]
