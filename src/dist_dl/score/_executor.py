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

__all__ = ["score_partition"]

_models: dict = {}  # archive name -> loaded model, oldest first
_lock = threading.Lock()
# A long-lived notebook session may score with many models; a Python worker
# keeps only the last few loaded, so its memory does not grow without bound.
_MAX_MODELS = 2


def _load(archive_name: str):
    with _lock:
        model = _models.get(archive_name)
        if model is None:
            import mlflow.pyfunc
            from pyspark import SparkFiles

            target = tempfile.mkdtemp(prefix="dist_dl-model-")
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
                    output_cols: dict, batch_size: int) -> Iterator:
    """``mapInPandas`` body: add the model's outputs to every pandas batch.

    Args:
        batches: The partition's pandas DataFrames.
        archive_name: Name of the model archive given to ``addFile``.
        image_col: The DataFrame's column of encoded images.
        model_image_col: The column name the model reads.
        output_cols: Model output column -> DataFrame column to write it to.
        batch_size: Rows per call to the model.
    """
    import pandas as pd

    model = None
    for frame in batches:
        if model is None and len(frame):
            model = _load(archive_name)  # an empty partition never loads it
        outputs = []
        for start in range(0, len(frame), batch_size):
            chunk = frame.iloc[start:start + batch_size]
            model_input = pd.DataFrame({model_image_col: chunk[image_col].to_numpy()},
                                       index=chunk.index)
            outputs.append(model.predict(model_input))
        result = frame.copy()
        scored = pd.concat(outputs) if outputs else pd.DataFrame(
            {name: pd.Series(dtype="object") for name in output_cols})
        for model_col, df_col in output_cols.items():
            values = scored[model_col].to_numpy()
            if model_col == "probabilities":
                values = [list(map(float, v)) for v in values]
            result[df_col] = values
        yield result
