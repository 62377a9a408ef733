"""The ensemble as an MLflow pyfunc model (built on the driver, loaded anywhere).

Kept apart from ``members.py`` so that Spark tasks, which only train and score,
never import MLflow.
"""
from __future__ import annotations

from typing import Sequence

import mlflow.pyfunc

from dist_dl.ensemble.members import Scorer, read_members

__all__ = ["EnsemblePyfunc", "member_artifacts"]


def member_artifacts(paths: Sequence[str]) -> dict:
    """The ``artifacts`` argument of ``mlflow.pyfunc.log_model`` for the
    members' files: MLflow copies each into the model, in member order."""
    return {f"member_{i}": path for i, path in enumerate(paths)}


class EnsemblePyfunc(mlflow.pyfunc.PythonModel):
    """The ensemble as an MLflow pyfunc model: ``predict(pandas_df)`` returns a
    pandas Series of labels (the label column's original values).

    The members are the model's artifacts (``member_artifacts``), one pickled
    file each, so the pickled model itself stays small and logging it does
    not pickle the members a second time.
    """

    def __init__(self, num_members: int, classes: Sequence, feature_cols: Sequence[str],
                 method: str, member_digests: Sequence[str] | None = None):
        self.num_members = num_members
        # The SHA-256 of each member file, as its training task wrote it:
        # checked before a member is unpickled (see ``read_members``).
        self.member_digests = None if member_digests is None else list(member_digests)
        self.classes = list(classes)
        self.feature_cols = list(feature_cols)
        self.method = method
        self.member_paths = None
        self._scorer = None

    def __getstate__(self):
        # The loaded members and their local paths belong to one process.
        state = dict(self.__dict__)
        state["_scorer"] = state["member_paths"] = None
        return state

    def load_context(self, context):
        self.member_paths = [context.artifacts[f"member_{i}"] for i in range(self.num_members)]

    def member_blobs(self) -> list[bytes]:
        """The members' pickled bytes, from the loaded model's files."""
        if self.member_paths is None:
            raise RuntimeError("the members are the model's artifacts: load the model with "
                               "mlflow.pyfunc.load_model first")
        return read_members(self.member_paths, getattr(self, "member_digests", None))

    def scorer(self) -> Scorer:
        if self._scorer is None:
            self._scorer = Scorer(self.member_blobs(), self.classes, self.feature_cols,
                                  self.method)
        return self._scorer

    def predict(self, context, model_input, params=None):
        import pandas as pd

        labels = self.scorer().predict(model_input)
        return pd.Series(labels, index=model_input.index, name="prediction")
