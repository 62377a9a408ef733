"""``score_dataframe``: add a classifier's predictions to a Spark DataFrame.

Driver side: checks the columns, fetches the model once from MLflow, and
ships it to the executors as a file (so executors never talk to the tracking
server and need no credentials); the scoring itself runs in the executors
(`dist_dl.score._executor`).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
import zipfile

from dist_dl.core.sessionkind import is_connect

__all__ = ["score_dataframe"]


def score_dataframe(df, model_uri: str, *, image_col: str, prediction_col: str = "prediction",
                    probability_col: str = "probability", probabilities_col: str | None = None,
                    batch_size: int = 64, on_error: str = "raise",
                    error_col: str = "score_error"):
    """Score a DataFrame of encoded images with a classifier logged by
    `dist_dl.tracking.log_keras_classifier()` or by the torch engine
    (`dist_dl.tracking.torch_log.log_torch_classifier()`).

    Lazy, like any transformation: nothing runs until the result is used. The
    model is downloaded once, here, and each executor Python worker loads it
    once and scores its rows ``batch_size`` at a time.

    Args:
        df: A Spark DataFrame with a binary column of encoded images.
        model_uri: Any MLflow model URI (``runs:/...``, ``models:/name/version``,
            a path).
        image_col: The column of encoded images (JPEG, PNG, ...).
        prediction_col: New column for the predicted class index (long).
        probability_col: New column for that class's probability (double).
        probabilities_col: If given, new column for every class's probability
            (array<double>).
        batch_size: Rows per call to the model (bounds executor memory:
            each Python worker holds its Arrow batch, ``spark.sql.execution.
            arrow.maxRecordsPerBatch`` rows, and one chunk of decoded images).
        on_error: What an image that cannot be scored (null, empty, not
            decodable) does. ``"raise"`` (default): the Spark job fails with
            an error naming the partition, the row's place in it and why.
            ``"null"``: that row's outputs are null and ``error_col`` says
            why; every other row is scored as usual.
        error_col: With ``on_error="null"``, the new string column of reasons
            (null where the row was scored).

    Returns:
        ``df`` with the new columns added; every row kept, in the same partitions.

    Raises:
        ValueError: A column is missing, of the wrong type, or already exists;
            or the model is not a classifier of this library.
        ImportError: The model's framework (TensorFlow for a Keras model,
            torch for one of the torch engine) is not installed here.
    """
    from pyspark.sql import types as T

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if image_col not in df.columns:
        raise ValueError(f"image_col {image_col!r} is not a column of the DataFrame; "
                         f"its columns are {df.columns}")
    field = df.schema[image_col]
    if not isinstance(field.dataType, T.BinaryType):
        raise ValueError(f"image_col {image_col!r} must be binary (encoded image bytes), "
                         f"but it is {field.dataType.simpleString()}")
    if on_error not in _ON_ERROR:
        raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    output_cols = {"prediction": prediction_col, "probability": probability_col}
    if probabilities_col is not None:
        output_cols["probabilities"] = probabilities_col
    names = list(output_cols.values()) + ([error_col] if on_error == "null" else [])
    if len(set(names)) != len(names):
        raise ValueError(f"the output column names must differ, got {names}")
    for name in names:
        if name in df.columns:
            raise ValueError(f"column {name!r} already exists in the DataFrame; pass another "
                             "name (prediction_col=..., probability_col=..., error_col=...)")

    local_dir = _download(model_uri)
    model_image_col = _model_image_col(local_dir, model_uri)
    archive = _archive(local_dir)
    spark = df.sparkSession
    if is_connect(spark):
        # The session's file artifacts: SparkFiles.get finds them in its tasks.
        spark.addArtifacts(archive, file=True)
    else:
        spark.sparkContext.addFile(archive)

    nullable = on_error == "null"
    schema = T.StructType(list(df.schema.fields))
    schema = schema.add(prediction_col, T.LongType(), nullable=nullable)
    schema = schema.add(probability_col, T.DoubleType(), nullable=nullable)
    if probabilities_col is not None:
        schema = schema.add(probabilities_col, T.ArrayType(T.DoubleType(), containsNull=False),
                            nullable=nullable)
    if nullable:
        schema = schema.add(error_col, T.StringType(), nullable=True)

    from functools import partial

    from dist_dl.score._executor import score_partition

    fn = partial(score_partition, archive_name=os.path.basename(archive), image_col=image_col,
                 model_image_col=model_image_col, output_cols=output_cols, batch_size=batch_size,
                 error_col=error_col if nullable else None)
    return df.mapInPandas(fn, schema)


_ON_ERROR = ("raise", "null")
_scratch: str | None = None


def _scratch_dir() -> str:
    # The archive must outlive this call (the DataFrame is lazy and executors
    # fetch the file when they first need it), so it lives until the driver exits.
    global _scratch
    if _scratch is None:
        _scratch = tempfile.mkdtemp(prefix="dist_dl-score-")
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


def _download(model_uri: str) -> str:
    import mlflow.artifacts

    target = os.path.join(_scratch_dir(), uuid.uuid4().hex)
    os.makedirs(target)
    try:
        return mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=target)
    except Exception as exc:
        raise ValueError(f"cannot fetch the model {model_uri!r} from MLflow "
                         f"(tracking URI {mlflow.get_tracking_uri()!r}): {exc}") from exc


def _model_image_col(local_dir: str, model_uri: str) -> str:
    """The input column the logged model reads (from its MLmodel file), once
    the framework the executors load it with is known to be installed: torch
    for the torch engine's models, TensorFlow for Keras ones (Databricks
    Runtime 19 ML has no TensorFlow; the executors have the driver's
    packages)."""
    from mlflow.models import Model

    from dist_dl.core.optional import require_installed

    try:
        meta = Model.load(local_dir)
    except Exception as exc:
        raise ValueError(f"{model_uri!r} is not an MLflow model: {exc}") from exc
    if "python_function" not in meta.flavors:
        raise ValueError(f"{model_uri!r} has no python_function flavor; log it with "
                         "dist_dl.tracking.log_keras_classifier")
    column = (meta.metadata or {}).get("image_col")
    if column is None:
        raise ValueError(f"{model_uri!r} was not logged by dist_dl.tracking.log_keras_classifier "
                         "(its metadata names no image_col)")
    if meta.metadata.get("engine") == "torch":
        require_installed("torch", f"scoring the torch model {model_uri!r}")
    else:
        require_installed("tensorflow", f"scoring the Keras model {model_uri!r}")
    return column


def _archive(local_dir: str) -> str:
    path = os.path.join(_scratch_dir(), f"dist_dl-model-{uuid.uuid4().hex}.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for root, _, files in os.walk(local_dir):
            for name in files:
                full = os.path.join(root, name)
                archive.write(full, os.path.relpath(full, local_dir))
    return path
