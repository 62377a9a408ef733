"""What runs inside Spark tasks: train one member on a partition, score rows.

Each function takes an iterator of pandas frames (the ``mapInPandas``
contract) plus plain, picklable arguments bound with ``functools.partial`` on
the driver. Only small results (where a member was written, counts,
predictions for the caller's rows) leave a task; training rows never reach the
driver, and the members themselves go to files, not through it (see
``train_partition``).
"""
from __future__ import annotations

import inspect
import os
import pickle
import time
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from dist_dl.core import compat
from dist_dl.core.integrity import HashingWriter
from dist_dl.core.pyworker import prepare_python_worker
from dist_dl.ensemble.members import Scorer, fit_member, read_members

__all__ = ["TRAIN_SCHEMA", "SCORE_SCHEMA", "train_partition", "score_partition",
           "predict_partition", "shared_scorer", "InlineMembers"]

TRAIN_SCHEMA = ("member int, path string, size long, sha256 string, kind string, rows long, "
                "start double, end double, fit_seconds double, error string")
SCORE_SCHEMA = "rows long, ensemble_correct long, member_correct array<long>"

# The scorer of the members this Python worker used last: (source, args,
# scorer). Spark reuses a Python worker for many tasks, so members are
# unpickled once per worker instead of once per task. That is 0.01 s for a
# 7 MB forest and 0.04 s for a small Keras model here, per member and task:
# it adds up for big members and for transform() over many partitions. One
# entry only, and Spark stops a Python worker after a minute idle, so members
# are not held for long.
_last_scorer: tuple = (None, None, None)


class InlineMembers:
    """The members' pickled bytes carried in the task's closure (a Spark
    Connect session has no broadcast variables); read as a Broadcast is, by
    ``value``. Each task unpickles its own copy, so a worker's cache goes by
    its content's digest."""

    def __init__(self, blobs: list[bytes]):
        import hashlib

        self.value = blobs
        self.digest = hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blobs)).hexdigest()


def _same_source(cached, source) -> bool:
    if isinstance(source, InlineMembers):
        return isinstance(cached, InlineMembers) and cached.digest == source.digest
    if isinstance(source, tuple):  # member files: the same paths
        return cached == source
    # A Broadcast: Spark hands every task of a worker the same object for one
    # broadcast id. By identity: the cache holds the object, so it cannot be
    # freed and its address reused by a later one.
    return cached is source


def shared_scorer(members, classes: Sequence, feature_cols: Sequence[str],
                  method: str) -> Scorer:
    """The ``Scorer`` of ``members``, built once per Python worker.

    ``members`` is a tuple of ``(path, sha256)`` pairs of the members' files
    (what ``train_partition`` wrote and reported; each file is checked
    against its digest before it is unpickled), or a PySpark ``Broadcast`` or
    `InlineMembers` of their pickled bytes (already checked by the driver).
    """
    global _last_scorer
    args = (tuple(classes), tuple(feature_cols), method)
    cached_source, cached_args, scorer = _last_scorer
    if not _same_source(cached_source, members) or cached_args != args:
        _last_scorer = (None, None, None)  # free the old members before loading new ones
        if isinstance(members, tuple):
            blobs = read_members([p for p, _ in members], [d for _, d in members])
        else:
            blobs = members.value
        scorer = Scorer(blobs, classes, feature_cols, method)
        _last_scorer = (members, args, scorer)
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
                    fit_kwargs: dict | None, member_dir: str) -> Iterator[pd.DataFrame]:
    """Train one member on all rows of this task's partition and write it,
    pickled, to a file in ``member_dir`` (one name per task attempt, written
    under a temporary name and renamed, so a file under its final name is
    complete). The row returned says where, how many bytes and their SHA-256:
    that digest goes back to the driver through Spark, not through the
    shared folder, and every later reader checks the file against it."""
    from pyspark import TaskContext

    prepare_python_worker()
    context = TaskContext.get()
    member = context.partitionId()
    start = time.time()
    frames = list(batches)
    pdf = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[*feature_cols, label_col])
    del frames
    row = {"member": member, "path": None, "size": None, "sha256": None, "kind": None,
           "rows": len(pdf),
           "start": start, "end": None, "fit_seconds": None, "error": None}
    if len(pdf) == 0:
        row["error"] = "the partition is empty"
    else:
        x = pdf[list(feature_cols)].to_numpy(dtype=np.float64)
        index = {c: i for i, c in enumerate(classes)}
        y = pdf[label_col].map(index).to_numpy(dtype=np.int64)
        del pdf
        compat.use_worker_env()  # before the factory's first tf.keras
        model = _call_factory(factory, member)
        fit_start = time.perf_counter()
        model = fit_member(model, x, y, fit_kwargs)
        # The fit alone; start..end also holds the rows' arrival from the JVM
        # and writing the member.
        row["fit_seconds"] = time.perf_counter() - fit_start
        row["kind"] = type(model).__module__.split(".")[0]
        # Named by the task attempt's id, unique in the application:
        # attemptNumber() starts again at 0 when Spark resubmits the stage (an
        # executor lost with shuffle output), while the first stage attempt's
        # task may still run the same member, so two writers would share a
        # name and the later would replace the file the driver was told of.
        path = os.path.join(member_dir, f"member-{member}-task-{context.taskAttemptId()}.pkl")
        os.makedirs(member_dir, exist_ok=True)  # an executor on another node
        with open(path + ".tmp", "wb") as f:
            # Hashed as it is written: no second copy of a big member in memory.
            out = HashingWriter(f)
            try:
                pickle.dump(model, out, protocol=pickle.HIGHEST_PROTOCOL)
            except (AttributeError, TypeError, pickle.PicklingError) as exc:
                raise ValueError(_unpicklable(member, model, exc)) from exc
        os.replace(path + ".tmp", path)
        row["path"], row["size"], row["sha256"] = path, out.size, out.hexdigest()
    row["end"] = time.time()
    yield pd.DataFrame([row])


def score_partition(batches: Iterator[pd.DataFrame], *, members: tuple, classes: Sequence,
                    feature_cols: Sequence[str], label_col: str,
                    method: str) -> Iterator[pd.DataFrame]:
    """Count correct predictions of each member (``members``: their files and
    digests, see ``shared_scorer``) and
    of the ensemble (one row per task, summed on the driver)."""
    prepare_python_worker()
    scorer = shared_scorer(members, classes, feature_cols, method)
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
    """Append the ensemble's prediction to every row (``blobs``: a Broadcast of
    the pickled members)."""
    prepare_python_worker()
    scorer = shared_scorer(blobs, classes, feature_cols, method)
    for pdf in batches:
        out = pdf.copy()
        out[prediction_col] = scorer.predict(pdf) if len(pdf) else []
        yield out


def _unpicklable(member: int, model, exc: Exception) -> str:
    """Why member ``member`` could not be pickled, and what to do."""
    from importlib.metadata import version

    kind = f"{type(model).__module__}.{type(model).__name__}"
    if compat.is_keras3_model(model):
        return (f"member {member}: the factory built a Keras 3 model ({kind}), which Keras "
                f"{version('keras')} cannot pickle ({exc}; Keras 3 models pickle from 3.5 on, "
                "keras-team/keras#19554): build the members with tf.keras, which is Keras 2 "
                "(tf-keras) in the ensemble's tasks, or use Keras 3.5 or later")
    return f"member {member}: the fitted model ({kind}) cannot be pickled: {exc}"
