"""Members and how they combine: used in Spark tasks, on the driver and at load time.

A member is a fitted scikit-learn classifier or a Keras model, kept as pickled
bytes so it crosses the driver/task boundary and goes into MLflow unchanged.
Everything here works on NumPy arrays and imports neither Spark nor MLflow's
tracking code, so the loaded MLflow model needs only these members' own
libraries (plus this package).
"""
from __future__ import annotations

import pickle
from typing import Sequence

import numpy as np

from dist_dl.core.integrity import read_verified

__all__ = ["COMBINE_METHODS", "fit_member", "member_proba", "combine", "read_members", "Scorer"]

COMBINE_METHODS = ("vote", "mean")


def _is_keras(model) -> bool:
    # By module name, so that scikit-learn members never import TensorFlow.
    return type(model).__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow")


def fit_member(model, x: np.ndarray, y_index: np.ndarray, fit_kwargs: dict | None):
    """Fit one member on class indices 0..k-1 (so every member shares one
    class order, even one whose partition happened to miss a class)."""
    kwargs = dict(fit_kwargs or {})
    if _is_keras(model):
        kwargs.setdefault("verbose", 0)
        model.fit(x, y_index, **kwargs)
    else:
        model.fit(x, y_index, **kwargs)
    return model


def member_proba(model, x: np.ndarray, num_classes: int) -> np.ndarray:
    """Class probabilities of one member, shape (rows, num_classes), columns in
    class-index order."""
    if _is_keras(model):
        out = np.asarray(model.predict(x, verbose=0), dtype=np.float64)
        if out.ndim == 1 or out.shape[1] == 1:
            # One sigmoid unit: the probability of class index 1.
            p1 = out.reshape(-1)
            out = np.stack([1.0 - p1, p1], axis=1)
        if out.shape[1] != num_classes:
            raise ValueError(f"a Keras member outputs {out.shape[1]} columns for {num_classes} "
                             "classes; give the last layer one unit per class (softmax) or one "
                             "sigmoid unit for two classes")
        return out
    if not hasattr(model, "predict_proba"):
        # A classifier without probabilities still votes: one-hot of its label.
        labels = np.asarray(model.predict(x)).astype(int)
        return np.eye(num_classes)[labels]
    raw = np.asarray(model.predict_proba(x), dtype=np.float64)
    # A member trained on a partition without some class knows fewer classes;
    # put its columns where they belong and give the missing ones 0.
    out = np.zeros((len(x), num_classes))
    out[:, np.asarray(model.classes_).astype(int)] = raw
    return out


def combine(probas: Sequence[np.ndarray], method: str) -> np.ndarray:
    """Combined class index per row from the members' probabilities.

    ``vote``: each member votes for its most probable class; a tie goes to the
    tied class with the highest mean probability. ``mean``: the class with the
    highest mean probability.
    """
    stacked = np.stack(probas)  # (members, rows, classes)
    if method == "mean":
        return stacked.mean(axis=0).argmax(axis=1)
    if method == "vote":
        votes = stacked.argmax(axis=2)  # (members, rows)
        num_classes = stacked.shape[2]
        counts = np.stack([(votes == c).sum(axis=0) for c in range(num_classes)], axis=1)
        # Ties (common with an even number of members) go to the tied class
        # with the highest mean probability, not to whichever comes first.
        mean = stacked.mean(axis=0)
        tied = counts == counts.max(axis=1, keepdims=True)
        return np.where(tied, mean, -np.inf).argmax(axis=1)
    raise ValueError(f"combine={method!r}: use one of {COMBINE_METHODS}")


def read_members(paths: Sequence[str], digests: Sequence[str] | None) -> list[bytes]:
    """The pickled members in the files at ``paths``, each checked against
    its SHA-256 in ``digests`` (recorded by the task that wrote it) before
    anyone unpickles it: a member file sits in shared storage, and unpickling
    a planted one would run its code. ``digests=None`` (a model logged before
    digests were recorded) reads them unchecked.

    Raises:
        IntegrityError: a file does not match its digest (named, with both digests).
    """
    if digests is not None and len(digests) != len(paths):
        raise ValueError(f"{len(paths)} member files but {len(digests)} digests")
    blobs = []
    for i, path in enumerate(paths):
        if digests is None:
            with open(path, "rb") as f:
                blobs.append(f.read())
        else:
            blobs.append(read_verified(path, digests[i], what=f"ensemble member {i}"))
    return blobs


class Scorer:
    """Members plus everything needed to turn a pandas frame into labels."""

    def __init__(self, blobs: Sequence[bytes], classes: Sequence, feature_cols: Sequence[str],
                 method: str):
        self.members = [pickle.loads(b) for b in blobs]
        self.classes = np.asarray(list(classes), dtype=object)
        self.feature_cols = list(feature_cols)
        self.method = method

    def features(self, pdf) -> np.ndarray:
        missing = [c for c in self.feature_cols if c not in pdf.columns]
        if missing:
            raise ValueError(f"input is missing feature columns {missing}; the ensemble was "
                             f"trained on {self.feature_cols}")
        return pdf[self.feature_cols].to_numpy(dtype=np.float64)

    def member_probas(self, x: np.ndarray) -> list[np.ndarray]:
        return [member_proba(m, x, len(self.classes)) for m in self.members]

    def combine(self, probas: Sequence[np.ndarray]) -> np.ndarray:
        return combine(probas, self.method)

    def predict_index(self, x: np.ndarray) -> np.ndarray:
        return combine(self.member_probas(x), self.method)

    def predict(self, pdf):
        return self.classes[self.predict_index(self.features(pdf))]
