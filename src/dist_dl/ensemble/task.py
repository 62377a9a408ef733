"""What runs inside Spark tasks: train one member on a partition, score rows.

Each function takes an iterator of pandas frames (the ``mapInPandas``
contract) plus plain, picklable arguments bound with ``functools.partial`` on
the driver. Only small results (a pickled member, counts, predictions for the
caller's rows) leave a task; training rows never reach the driver.
"""
from __future__ import annotations

import inspect
import pickle
import time
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from dist_dl.ensemble.members import Scorer, fit_member

__all__ = ["TRAIN_SCHEMA", "SCORE_SCHEMA", "train_partition", "score_partition",
           "predict_partition", "shared_scorer"]

TRAIN_SCHEMA = ("member int, model binary, rows long, start double, end double, "
                "fit_seconds double, error string")
SCORE_SCHEMA = "rows long, ensemble_correct long, member_correct array<long>"

# The scorer of the last broadcast this Python worker used: (broadcast, args,
# scorer). Spark reuses a Python worker for many tasks and hands every task
# of a worker the same Broadcast object for one broadcast id, so members are
# unpickled once per worker instead of once per task. That is 0.01 s for a
# 7 MB forest and 0.04 s for a small Keras model here, per member and task:
# it adds up for big members and for transform() over many partitions. One
# entry only, and Spark stops a Python worker after a minute idle, so members
# are not held for long.
_last_scorer: tuple = (None, None, None)


def shared_scorer(blobs, classes: Sequence, feature_cols: Sequence[str], method: str) -> Scorer:
    """The ``Scorer`` of ``blobs`` (a PySpark ``Broadcast`` of the members'
    bytes), built once per Python worker for each broadcast."""
    global _last_scorer
    args = (tuple(classes), tuple(feature_cols), method)
    cached_blobs, cached_args, scorer = _last_scorer
    # By identity: the cache holds its Broadcast, so the object cannot be
    # freed and its address reused by a later one.
    if cached_blobs is not blobs or cached_args != args:
        _last_scorer = (None, None, None)  # free the old members before loading new ones
        scorer = Scorer(blobs.value, classes, feature_cols, method)
        _last_scorer = (blobs, args, scorer)
    return scorer


def _call_factory(factory: Callable, member: int):
    # A factory that takes one argument gets the member's index (to seed it);
    # one that takes none is called bare.
    try:
        params = inspect.signature(factory).parameters.values()
        positional = [p for p in params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                      and p.default is p.empty]
    except (TypeError, ValueError):
        positional = []
    return factory(member) if len(positional) == 1 else factory()


def train_partition(batches: Iterator[pd.DataFrame], *, factory: Callable,
                    feature_cols: Sequence[str], label_col: str, classes: Sequence,
                    fit_kwargs: dict | None) -> Iterator[pd.DataFrame]:
    """Train one member on all rows of this task's partition."""
    from pyspark import TaskContext

    member = TaskContext.get().partitionId()
    start = time.time()
    frames = list(batches)
    pdf = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[*feature_cols, label_col])
    del frames
    row = {"member": member, "model": None, "rows": len(pdf), "start": start,
           "end": None, "fit_seconds": None, "error": None}
    if len(pdf) == 0:
        row["error"] = "the partition is empty"
    else:
        x = pdf[list(feature_cols)].to_numpy(dtype=np.float64)
        index = {c: i for i, c in enumerate(classes)}
        y = pdf[label_col].map(index).to_numpy(dtype=np.int64)
        del pdf
        model = _call_factory(factory, member)
        fit_start = time.perf_counter()
        model = fit_member(model, x, y, fit_kwargs)
        # The fit alone; start..end also holds the rows' arrival from the JVM
        # and pickling the member.
        row["fit_seconds"] = time.perf_counter() - fit_start
        row["model"] = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
    row["end"] = time.time()
    yield pd.DataFrame([row])


def score_partition(batches: Iterator[pd.DataFrame], *, blobs, classes: Sequence,
                    feature_cols: Sequence[str], label_col: str,
                    method: str) -> Iterator[pd.DataFrame]:
    """Count correct predictions of each member and of the ensemble (one row
    per task, summed on the driver)."""
    scorer = shared_scorer(blobs, classes, feature_cols, method)
    index = {c: i for i, c in enumerate(classes)}
    rows, ensemble_correct = 0, 0
    member_correct = np.zeros(len(scorer.members), dtype=np.int64)
    for pdf in batches:
        if len(pdf) == 0:
            continue
        x = scorer.features(pdf)
        y = pdf[label_col].map(index).to_numpy()
        probas = scorer.member_probas(x)
        for i, p in enumerate(probas):
            member_correct[i] += int((p.argmax(axis=1) == y).sum())
        ensemble_correct += int((scorer.combine(probas) == y).sum())
        rows += len(pdf)
    yield pd.DataFrame([{"rows": rows, "ensemble_correct": ensemble_correct,
                         "member_correct": member_correct.tolist()}])


def predict_partition(batches: Iterator[pd.DataFrame], *, blobs, classes: Sequence,
                      feature_cols: Sequence[str], method: str,
                      prediction_col: str) -> Iterator[pd.DataFrame]:
    """Append the ensemble's prediction to every row."""
    scorer = shared_scorer(blobs, classes, feature_cols, method)
    for pdf in batches:
        out = pdf.copy()
        out[prediction_col] = scorer.predict(pdf) if len(pdf) else []
        yield out
