"""Driver side of Spark-partitioned ensembles: validate, check memory, launch, log.

``train_ensemble`` reads the input once: one shuffle gives every row a random
number that puts it in the held-out split or in one of ``num_models``
partitions, and that copy is cached for the call. The job that builds the
cache also counts rows and labels per partition, so the classes and the exact
partition sizes (for the memory check) cost no extra pass. Then one member per
partition is trained in a Spark task (``task.py``), which writes the member to
a file under ``output_dir``; members and ensemble are scored on the cached
held-out rows on the executors, which read those files; and one MLflow run is
logged with the scores and one pyfunc model whose artifacts are the files.
Only counts and file names come back to the driver: a member never passes
through the driver's JVM. Collecting members (forests of tens of MB each)
and broadcasting them back for scoring would cost seconds per call, and
collecting that much a few times in a row runs the driver JVM's serving
thread out of heap (Spark's default 1 GiB).
"""
from __future__ import annotations

import functools
import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Callable, Sequence

from dist_dl.core import compat
from dist_dl.core.deprecation import renamed_attribute, renamed_parameters
from dist_dl.core.integrity import verify_file
from dist_dl.core.locations import local_path
from dist_dl.core.sessionkind import default_parallelism, is_connect, session_jobs
from dist_dl.core.settings import checked, setting
from dist_dl.core.storage import check_shared
from dist_dl.ensemble import task as _task
from dist_dl.ensemble.members import COMBINE_METHODS
from dist_dl.ensemble.memory import check_partition_memory, task_memory
from dist_dl.tracking.target import mlflow_target

__all__ = ["train_ensemble", "Ensemble"]

_NUMERIC = {"ByteType": 1, "ShortType": 2, "IntegerType": 4, "LongType": 8, "FloatType": 4,
            "DoubleType": 8, "BooleanType": 1}
_MLFLOW_TYPES = {"ByteType": "integer", "ShortType": "integer", "IntegerType": "integer",
                 "LongType": "long", "FloatType": "float", "DoubleType": "double",
                 "BooleanType": "boolean", "StringType": "string"}
# The column of per-row random numbers that assigns rows (see train_ensemble).
_RAND = "_dist_dl_rand"


@dataclass(frozen=True)
@checked()
class _Spec:
    """The validated arguments of one ``train_ensemble`` call."""

    num_models: int = setting(low=2, why="an ensemble has two members or more")
    feature_cols: tuple = setting(nonempty=True, why="name the numeric feature columns")
    label_col: str = setting(nonempty=True)
    combine: str = setting(choices=COMBINE_METHODS)
    validation_fraction: float = setting(low=0.0, high=0.5, low_open=True, high_open=True,
                                         why="rows held out to score the ensemble")
    seed: int = setting()
    memory_factor: float = setting(low=1.0, why="task memory per byte of partition data")
    task_memory_bytes: int | None = setting(low=1)

    def __post_init__(self):
        if self.label_col in self.feature_cols:
            raise ValueError(f"label_col={self.label_col!r} is also in feature_cols; remove it "
                             "from feature_cols")


@renamed_parameters({"classes": "class_names"})
@dataclass(frozen=True)
class Ensemble:
    """A trained ensemble: its members, scores and the MLflow run that holds it.

    Attributes:
        run_id: The MLflow run with the scores and the model.
        model_uri: The model's artifact URI, loadable with ``mlflow.pyfunc.load_model``.
        score: The ensemble's accuracy on the held-out rows.
        member_scores: Each member's accuracy on the same rows.
        member_rows: How many training rows each member saw.
        class_names: The labels the ensemble predicts, in the members' class
            order (``classes``, the old name, reads it with a warning for
            one release).
        feature_cols, label_col, combine: As given to `train_ensemble()`.

    The members are read from the logged model (``model_uri``) the first time
    ``members``, ``predict`` or ``transform`` needs them.
    """

    run_id: str
    model_uri: str
    score: float
    member_scores: tuple
    member_rows: tuple
    class_names: tuple
    feature_cols: tuple
    label_col: str
    combine: str
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)

    classes = renamed_attribute("class_names")

    def _model(self):
        """The logged pyfunc model, loaded once."""
        if "model" not in self._loaded:
            import mlflow

            self._loaded["model"] = mlflow.pyfunc.load_model(self.model_uri).unwrap_python_model()
        return self._loaded["model"]

    @property
    def members(self) -> list:
        """The fitted members."""
        return self._model().scorer().members

    def predict(self, pdf):
        """Predict a small pandas DataFrame on the driver."""
        return self._model().scorer().predict(pdf)

    def transform(self, df, prediction_col: str = "prediction"):
        """Score a Spark DataFrame on the executors: every column of ``df`` plus
        ``prediction_col`` (same type as the label column)."""
        from pyspark.sql import types as T

        missing = [c for c in self.feature_cols if c not in df.columns]
        if missing:
            raise ValueError(f"df is missing feature columns {missing}")
        if prediction_col in df.columns:
            raise ValueError(f"prediction_col={prediction_col!r} is already a column of df; "
                             "pass another name")
        spark = df.sparkSession
        # A Connect session has no broadcast variables: the members travel
        # in the task's closure.
        blobs = (_task.InlineMembers(self._model().member_blobs()) if is_connect(spark)
                 else spark.sparkContext.broadcast(self._model().member_blobs()))
        label_type = _label_type(self.class_names)
        schema = T.StructType([*df.schema.fields, T.StructField(prediction_col, label_type)])
        fn = functools.partial(_task.predict_partition, blobs=blobs, classes=list(self.class_names),
                               feature_cols=list(self.feature_cols), method=self.combine,
                               prediction_col=prediction_col)
        return df.mapInPandas(fn, schema)


def _label_type(classes):
    from pyspark.sql import types as T

    if all(isinstance(c, bool) for c in classes):
        return T.BooleanType()
    if all(isinstance(c, int) for c in classes):
        return T.LongType()
    if all(isinstance(c, (int, float)) for c in classes):
        return T.DoubleType()
    return T.StringType()


# Prefix of the descriptions of train_ensemble's Spark jobs (one per phase).
PHASE_PREFIX = "dist_dl ensemble: "


def _describe(spark, phase: str) -> None:
    # Names the next Spark jobs in the UI and event log (and lets a benchmark
    # time each phase); a Connect session's jobs go by their group's tag.
    if not is_connect(spark):
        spark.sparkContext.setLocalProperty("spark.job.description", PHASE_PREFIX + phase)


def _check_counts(stats, spec: _Spec) -> tuple[tuple, list[int]]:
    """The classes and each partition's training rows, from the per-partition
    counts of the split; raises for data an ensemble cannot be trained on."""
    label = spec.label_col
    nulls = sum(r.nulls for r in stats)
    if nulls:
        raise ValueError(f"label column {label!r} has {nulls} null values; drop or fill them "
                         "first")
    classes = tuple(sorted({value for r in stats for value in r.labels}))
    if len(classes) < 2:
        raise ValueError(f"label column {label!r} has {len(classes)} class(es); a classifier "
                         "ensemble needs at least 2")
    partition_rows = [0] * spec.num_models
    for r in stats:
        if not r.held_out:
            partition_rows[r.part] = r.rows
    train_rows = sum(partition_rows)
    if train_rows < 2 * spec.num_models:
        raise ValueError(f"{train_rows} training rows for num_models={spec.num_models}: lower "
                         "num_models so each member gets data")
    empty = [i for i, rows in enumerate(partition_rows) if rows == 0]
    if empty:
        raise RuntimeError(f"partition(s) {empty} got none of the {train_rows} training rows; "
                           "lower num_models")
    if not any(r.held_out and r.rows for r in stats):
        raise RuntimeError("the held-out split is empty; raise validation_fraction")
    return classes, partition_rows


def _validate_columns(df, spec: _Spec) -> None:
    types = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
    for col in (*spec.feature_cols, spec.label_col):
        if col == _RAND:
            raise ValueError(f"column name {_RAND!r} is used by train_ensemble itself; rename "
                             "that column")
        if col not in types:
            raise ValueError(f"column {col!r} is not in df (columns: {sorted(types)})")
    for col in spec.feature_cols:
        if types[col] not in _NUMERIC:
            raise ValueError(f"feature column {col!r} is {types[col]}; members take numeric "
                             "columns: cast it, or encode it first")


def _signature(df, spec: _Spec):
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    types = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
    inputs = Schema([ColSpec(_MLFLOW_TYPES[types[c]], c) for c in spec.feature_cols])
    label = _MLFLOW_TYPES.get(types[spec.label_col])
    outputs = Schema([ColSpec(label)]) if label else None
    return ModelSignature(inputs=inputs, outputs=outputs)


def _requirements(kinds) -> list[str]:
    """Pinned requirements of the model, from the members' kinds (the top
    module of each member's class, reported by the training tasks)."""
    from importlib.metadata import PackageNotFoundError, version

    names = ["numpy", "pandas", "cloudpickle", "mlflow"]
    names += (["tensorflow-cpu", "tensorflow"]
              if set(kinds) & {"keras", "tf_keras", "tensorflow"} else [])
    # The Keras the members were built with: the keras package (Keras 3
    # from TensorFlow 2.16 on), or tf-keras (Keras 2 beside it).
    names += ["keras"] if "keras" in kinds else []
    names += ["tf-keras"] if "tf_keras" in kinds else []
    names += ["scikit-learn"] if "sklearn" in kinds else []
    reqs = []
    for name in names:
        try:
            reqs.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return reqs


def _member_files(results, output_dir: str) -> tuple:
    """The members' files as ``(path, sha256)`` pairs, checked from the
    driver: each must be there, with the size and the SHA-256 its task
    reported (so that a file swapped in the shared folder after the task
    wrote it is refused before it is scored or copied into MLflow)."""
    members = []
    for r in results:
        seen = os.path.getsize(r.path) if os.path.isfile(r.path) else None
        if seen != r.size:
            found = "cannot find that file" if seen is None else f"sees {seen:,} bytes there"
            raise RuntimeError(
                f"member {r.member} was written to {r.path} ({r.size:,} bytes) by its Spark "
                f"task, but the driver {found}: output_dir={output_dir!r} must be a folder the "
                "driver and every executor share (on Databricks a /dbfs/... or /Volumes/... "
                "path)")
        verify_file(r.path, r.sha256, what=f"ensemble member {r.member}")
        members.append((r.path, r.sha256))
    return tuple(members)


def _remove_staging(staging: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(staging))  # "ensembles", unless another call uses it
    except OSError:
        pass


def train_ensemble(df, model_factory: Callable, *, num_models: int, feature_cols: Sequence[str],
                   label_col: str, combine: str = "vote", validation_fraction: float = 0.2,
                   fit_kwargs: dict | None = None, seed: int = 0, memory_factor: float = 4.0,
                   task_memory_bytes: int | None = None, output_dir: str = "runs",
                   tracking_uri: str | None = None, experiment_name: str | None = None,
                   run_name: str = "ensemble") -> Ensemble:
    """Train ``num_models`` classifiers, one per random partition, in Spark tasks.

    The input is read once. Its selected columns are shuffled into the
    partitions and cached (memory, spilling to disk) until this call returns,
    so that training and held-out scoring use the one split. Rows never reach
    the driver.

    Args:
        df: Spark DataFrame with numeric feature columns and a label column.
        model_factory: Plain function returning an unfitted scikit-learn
            classifier or a compiled Keras model (softmax over the classes, or
            one sigmoid unit for two). If it takes one argument, it gets the
            member's index (use it as a seed). Called inside the tasks, so it
            must be picklable (a module-level function or a closure).
        num_models: Members, and partitions (>= 2).
        feature_cols: Numeric feature columns.
        label_col: Class label column (ints, strings, ...). Keras members are
            fitted on class indices 0..k-1 in sorted label order.
        combine: ``"vote"`` (majority of the members' labels) or ``"mean"``
            (highest mean probability).
        validation_fraction: Rows held out, before partitioning, to score every
            member and the ensemble on the same data. Default 0.2.
        fit_kwargs: Passed to each member's ``fit`` (e.g. ``epochs`` for Keras).
        seed: Seed of the held-out split and of the row shuffle (the same seed
            on the same input partitions gives the same split, and each
            member its rows in the same order: a member retried by Spark
            after a lost executor is the model it would have been, given a
            factory that seeds it by the member's index).
        memory_factor: Task memory per byte of partition data (see
            ``estimate_partition_memory``). Default 4.
        task_memory_bytes: Memory of one task; default from the Spark
            configuration (``spark.executor.pyspark.memory`` per core if set).
        output_dir: A folder the driver and every executor can reach (as
            ``train_distributed``'s; on Databricks a ``/dbfs/...`` or
            ``/Volumes/...`` path). The tasks write the fitted members to a
            new folder under it, which is removed once they are logged to
            MLflow. Default ``runs``.
        tracking_uri: MLflow tracking URI for this call; default the current one.
        experiment_name: MLflow experiment; default the active one.
        run_name: Name of the MLflow run. Nested if a run is active.

    Returns:
        The ``Ensemble``: scores, the MLflow run and model URI, ``transform``.

    Raises:
        ValueError: bad arguments, columns or labels (raised before any training).
        PartitionMemoryError: the largest partition would not fit a task's
            memory (checked on the counted partitions, before any training).
        RuntimeError: a partition or the held-out split came out empty
            (before training), a task trained no member, or the driver cannot
            see a member's file (``output_dir`` is not shared).
    """
    spec = _Spec(num_models=num_models, feature_cols=tuple(feature_cols), label_col=label_col,
                 combine=combine, validation_fraction=float(validation_fraction), seed=int(seed),
                 memory_factor=float(memory_factor), task_memory_bytes=task_memory_bytes)
    _validate_columns(df, spec)
    output_dir = os.fspath(output_dir)
    # Tasks write the members there and the scoring tasks read them.
    check_shared(df.sparkSession, {"output_dir": output_dir}, purpose="train_ensemble")
    members_root = os.path.join(local_path(output_dir, "output_dir"), "ensembles")
    limit, source = ((task_memory_bytes, "task_memory_bytes") if task_memory_bytes
                     else task_memory(df.sparkSession))
    group = f"dist_dl-ensemble-{uuid.uuid4().hex[:8]}"
    # The members' folder, removed when the call ends (they are in MLflow by
    # then, or the call failed).
    staging = os.path.join(members_root, group)
    os.makedirs(staging)  # fails here, before any job, if output_dir is not writable
    try:
        classes, results, members, scored = _train_and_score(
            df, spec, model_factory, fit_kwargs, limit, source, group, staging, output_dir)
        return _log_ensemble(df, spec, classes, results, members, scored, tracking_uri,
                             experiment_name, run_name)
    finally:
        _remove_staging(staging)


def _train_and_score(df, spec: _Spec, model_factory, fit_kwargs, limit: int, source: str,
                     group: str, staging: str, output_dir: str):
    """The Spark jobs of ``train_ensemble``: split, train (members written to
    ``staging``), score on the held-out rows. Returns the classes, the
    training tasks' rows, the members' files and the scoring tasks' rows."""
    from pyspark.sql import functions as F

    label_col, num_models = spec.label_col, spec.num_models
    spark = df.sparkSession
    # One uniform random number per row decides where it goes: below
    # validation_fraction it is held out, and its hash picks the partition
    # (the member). It is drawn once and cached with the rows, so training and
    # scoring see the same split whatever order the input yields its rows in
    # (randomSplit gets that by sorting every partition, on every pass). An
    # explicit partition count is kept as given by adaptive query execution
    # (it never coalesces REPARTITION_BY_NUM). The cache is memory and disk:
    # it spills rather than fail, and it is dropped before returning.
    assigned = (df.select(*spec.feature_cols, label_col)
                .withColumn(_RAND, F.rand(spec.seed))
                .repartition(num_models, _RAND)
                .persist())
    held_out = F.col(_RAND) < spec.validation_fraction
    try:
        with session_jobs(spark, group, f"dist_dl ensemble of {num_models} members"):
            _describe(spark, "split rows, cache and count them")
            stats = (assigned
                     .groupBy(F.spark_partition_id().alias("part"), held_out.alias("held_out"))
                     .agg(F.count("*").alias("rows"),
                          F.count(F.when(F.col(label_col).isNull(), 1)).alias("nulls"),
                          F.collect_set(label_col).alias("labels"))
                     .collect())
            classes, partition_rows = _check_counts(stats, spec)
            check_partition_memory(max(partition_rows), sum(partition_rows),
                                   len(spec.feature_cols), spec.memory_factor, limit, source)

            _describe(spark, "train one member per partition")
            fn = functools.partial(_task.train_partition, factory=model_factory,
                                   feature_cols=list(spec.feature_cols), label_col=label_col,
                                   classes=list(classes), fit_kwargs=fit_kwargs, member_dir=staging)
            # Each task sees its rows in the order of their random number, not
            # in the order its shuffle blocks arrived (local ones first, then
            # remote ones as fetched): a member retried after a lost executor,
            # or trained again with the same seed, is the same model. Sorted
            # in the JVM, which spills; the task's Python memory is unchanged.
            training = assigned.where(~held_out).sortWithinPartitions(_RAND).drop(_RAND)
            results = sorted(training.mapInPandas(fn, _task.TRAIN_SCHEMA).collect(),
                             key=lambda r: r.member)
            failed = [f"member {r.member}: {r.error}" for r in results if r.path is None]
            if failed or len(results) != num_models:
                raise RuntimeError(f"{len(results) - len(failed)} of {num_models} members trained "
                                   f"({'; '.join(failed) or 'tasks missing'}); lower num_models")
            members = _member_files(results, output_dir)

            _describe(spark, "score members and ensemble on the held-out rows")
            # The digests travel with the task (its closure), not through the
            # shared folder.
            score_fn = functools.partial(_task.score_partition, members=members,
                                         classes=list(classes),
                                         feature_cols=list(spec.feature_cols),
                                         label_col=label_col, method=spec.combine)
            # Every partition holds some held-out rows; one task per core (at
            # most) scores them, so fewer tasks set up a Python stream.
            tasks = max(1, min(num_models, default_parallelism(spark)))
            scored = (assigned.where(held_out).drop(_RAND).coalesce(tasks)
                      .mapInPandas(score_fn, _task.SCORE_SCHEMA).collect())
    finally:
        assigned.unpersist()
    return classes, results, members, scored


def _log_ensemble(df, spec: _Spec, classes, results, members, scored, tracking_uri,
                  experiment_name, run_name) -> Ensemble:
    """One MLflow run with the scores and the pyfunc model (the members'
    files its artifacts); returns the ``Ensemble``."""
    import mlflow

    from dist_dl.ensemble.pyfunc import EnsemblePyfunc, member_artifacts

    num_models, combine, label_col = spec.num_models, spec.combine, spec.label_col
    val_rows = sum(r.rows for r in scored)  # > 0: _check_counts saw held-out rows
    ensemble_score = sum(r.ensemble_correct for r in scored) / val_rows
    member_scores = tuple(sum(r.member_correct[i] for r in scored) / val_rows
                          for i in range(num_models))
    with mlflow_target(tracking_uri, experiment_name) as experiment_id, \
            mlflow.start_run(run_name=run_name, experiment_id=experiment_id,
                             nested=mlflow.active_run() is not None) as run:
        mlflow.log_params({"num_models": num_models, "combine": combine,
                           "num_features": len(spec.feature_cols), "label_col": label_col,
                           "num_classes": len(classes),
                           "validation_fraction": spec.validation_fraction, "seed": spec.seed,
                           "train_rows": sum(r.rows for r in results),
                           "validation_rows": val_rows})
        metrics = {"ensemble_val_accuracy": ensemble_score,
                   "member_mean_val_accuracy": sum(member_scores) / num_models}
        for i, s in enumerate(member_scores):
            metrics[f"member_{i}_val_accuracy"] = s
            metrics[f"member_{i}_train_seconds"] = results[i].end - results[i].start
            metrics[f"member_{i}_fit_seconds"] = results[i].fit_seconds
        mlflow.log_metrics(metrics)
        info = mlflow.pyfunc.log_model(
            **compat.model_name_argument("model"),
            python_model=EnsemblePyfunc(num_models, classes, spec.feature_cols, combine,
                                        member_digests=[d for _, d in members]),
            artifacts=member_artifacts([p for p, _ in members]),
            signature=_signature(df, spec),
            # Given explicitly: inferring them loads the model in a subprocess,
            # which is slow and learns nothing we do not know here.
            pip_requirements=_requirements({r.kind for r in results}))
        run_id = run.info.run_id
        # The artifact's own URI, not runs:/..., so that it still resolves
        # after the caller's tracking URI is put back (on MLflow 3 the logged
        # model's own location: the run's artifacts hold no copy).
        model_uri = compat.logged_model_location(info, "model")
    return Ensemble(run_id=run_id, model_uri=model_uri, score=ensemble_score,
                    member_scores=member_scores, member_rows=tuple(r.rows for r in results),
                    class_names=classes, feature_cols=spec.feature_cols, label_col=label_col,
                    combine=combine)
