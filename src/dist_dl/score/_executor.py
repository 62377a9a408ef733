"""What runs in the executors' Python workers when a DataFrame is scored.

The model arrives as a zip archive distributed with ``SparkContext.addFile``;
each Python worker unpacks and loads it once, on first use, and keeps it for
every later task (Spark reuses Python workers by default), so the model is
loaded once per worker, not once per batch or task.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import zipfile
from typing import Iterator

from mlflow.exceptions import MlflowException

from dist_dl.core.pyworker import prepare_python_worker

__all__ = ["score_partition"]

_models: dict = {}  # archive name -> loaded model, oldest first
_lock = threading.Lock()
# A long-lived notebook session may score with many models; a Python worker
# keeps only the last few loaded, so its memory does not grow without bound.
_MAX_MODELS = 2
# What the model raises for a row it cannot score: this library's decoder
# (null, empty, undecodable bytes) raises ValueError; MLflow's check of the
# input against the logged signature, MlflowException.
_BAD_INPUT = (ValueError, MlflowException)


def _load(archive_name: str):
    with _lock:
        model = _models.get(archive_name)
        if model is None:
            import mlflow.pyfunc
            from pyspark import SparkFiles

            # Beside the fetched archive, in the folder Spark gives this
            # application's files on this executor and removes when the
            # application ends: a Python worker can end without running
            # cleanup of its own, and the models would pile up in /tmp.
            target = tempfile.mkdtemp(prefix="dist_dl-model-", dir=SparkFiles.getRootDirectory())
            try:
                with zipfile.ZipFile(SparkFiles.get(archive_name)) as archive:
                    archive.extractall(target)
                model = mlflow.pyfunc.load_model(target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            _models[archive_name] = model
            while len(_models) > _MAX_MODELS:
                del _models[next(iter(_models))]
        return model


def score_partition(batches: Iterator, *, archive_name: str, image_col: str, model_image_col: str,
                    output_cols: dict, batch_size: int, error_col: str | None = None) -> Iterator:
    """``mapInPandas`` body: add the model's outputs to every pandas batch.

    Args:
        batches: The partition's pandas DataFrames.
        archive_name: Name of the model archive given to ``addFile``.
        image_col: The DataFrame's column of encoded images.
        model_image_col: The column name the model reads.
        output_cols: Model output column -> DataFrame column to write it to.
        batch_size: Rows per call to the model.
        error_col: None: a row that cannot be scored fails the task, naming
            the partition, the row and why. Else the column to write that
            reason to, the row's outputs being null.
    """
    import pandas as pd

    prepare_python_worker()
    model = None
    done = 0  # rows of this partition in earlier batches
    for frame in batches:
        if model is None and len(frame):
            model = _load(archive_name)  # an empty partition never loads it
        outputs = []
        for start in range(0, len(frame), batch_size):
            chunk = frame.iloc[start:start + batch_size]
            model_input = pd.DataFrame({model_image_col: chunk[image_col].to_numpy()},
                                       index=chunk.index)
            outputs.append(_scored(model, model_input, done + start, image_col, error_col))
        result = frame.copy()
        scored = pd.concat(outputs) if outputs else pd.DataFrame(
            {name: pd.Series(dtype="object") for name in output_cols})
        for model_col, df_col in output_cols.items():
            values = scored[model_col].to_numpy()
            if model_col == "probabilities":
                values = [None if v is None else list(map(float, v)) for v in values]
            result[df_col] = values
        if error_col is not None:
            result[error_col] = (scored["error"].to_numpy() if "error" in scored
                                 else [None] * len(result))
        done += len(frame)
        yield result


def _scored(model, model_input, first_row: int, image_col: str, error_col: str | None):
    """The model's outputs for ``model_input``; rows the model refuses found
    by halving the rows it refused (a few calls per bad row, not one per row
    of its batch), each with null outputs and its reason, or, without
    ``error_col``, the first of them failing the task with an error naming it.
    ``first_row``: the position of ``model_input``'s first row in the partition."""
    import numpy as np
    import pandas as pd

    try:
        return model.predict(model_input)
    except _BAD_INPUT as exc:
        if len(model_input) > 1:
            half = len(model_input) // 2
            return pd.concat([
                _scored(model, model_input.iloc[:half], first_row, image_col, error_col),
                _scored(model, model_input.iloc[half:], first_row + half, image_col, error_col)])
        reason = _reason(exc)
    if error_col is None:
        raise ValueError(
            f"cannot score {_place(first_row)} of column {image_col!r}: {reason}. "
            f"Fix or drop that row, or pass on_error='null' to score every other row "
            f"and get a null prediction with the reason in a column") from None
    return pd.DataFrame({"prediction": [None], "probability": [np.nan], "probabilities": [None],
                         "error": [reason]}, index=model_input.index)


def _place(row: int) -> str:
    from pyspark import TaskContext

    context = TaskContext.get()
    where = f" of partition {context.partitionId()}" if context is not None else ""
    return f"row {row}{where}"


def _reason(exc: BaseException) -> str:
    """The model's message without its batch position (one row here)."""
    import re

    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"^in column '[^']*', batch starting at row [^:]*: image 0 ", "image ", text)
    return text.splitlines()[0][:1000] if text else type(exc).__name__
