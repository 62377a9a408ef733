"""The ensemble as an MLflow pyfunc model (built on the driver, loaded anywhere).

Kept apart from ``members.py`` so that Spark tasks, which only train and score,
never import MLflow.
"""
from __future__ import annotations

from typing import Sequence

import mlflow.pyfunc

from dist_dl.ensemble.members import Scorer

__all__ = ["EnsemblePyfunc"]


class EnsemblePyfunc(mlflow.pyfunc.PythonModel):
    """The ensemble as an MLflow pyfunc model: ``predict(pandas_df)`` returns a
    pandas Series of labels (the label column's original values)."""

    def __init__(self, blobs: Sequence[bytes], classes: Sequence, feature_cols: Sequence[str],
                 method: str):
        self.blobs = list(blobs)
        self.classes = list(classes)
        self.feature_cols = list(feature_cols)
        self.method = method
        self._scorer = None

    def __getstate__(self):
        # Pickle the bytes, never the unpickled members (Keras models would
        # otherwise be pickled twice over).
        state = dict(self.__dict__)
        state["_scorer"] = None
        return state

    def _get_scorer(self) -> Scorer:
        if self._scorer is None:
            self._scorer = Scorer(self.blobs, self.classes, self.feature_cols, self.method)
        return self._scorer

    def predict(self, context, model_input, params=None):
        import pandas as pd

        labels = self._get_scorer().predict(model_input)
        return pd.Series(labels, index=model_input.index, name="prediction")
