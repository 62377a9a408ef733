"""The cases of tests/integration/test_ensemble.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dist_dl.core.integrity import IntegrityError, sha256_bytes


class _FakeBroadcast:
    """What a Python worker sees of a PySpark broadcast: an object with .value."""

    def __init__(self, value):
        self.value = value


def test_worker_unpickles_members_once_per_source(tmp_path):
    import pickle

    from sklearn.tree import DecisionTreeClassifier

    from dist_dl.ensemble import task

    x = np.arange(20, dtype=float).reshape(10, 2)
    blobs = [pickle.dumps(DecisionTreeClassifier(random_state=i).fit(x, np.arange(10) % 2))
             for i in range(2)]
    first, second = _FakeBroadcast(blobs), _FakeBroadcast(blobs)
    scorer = task.shared_scorer(first, [0, 1], ["a", "b"], "vote")
    assert task.shared_scorer(first, [0, 1], ["a", "b"], "vote") is scorer
    # Another broadcast, or other arguments, get their own members.
    assert task.shared_scorer(first, [0, 1], ["a", "b"], "mean") is not scorer
    other = task.shared_scorer(second, [0, 1], ["a", "b"], "vote")
    assert other is not scorer and other.members[0] is not scorer.members[0]
    np.testing.assert_array_equal(other.predict(pd.DataFrame(x, columns=["a", "b"])),
                                  np.arange(10) % 2)

    # Members in files (as the training tasks write them): the same paths
    # (a new tuple each task) share one scorer, other paths do not.
    paths = []
    for i, blob in enumerate(blobs):
        paths.append((str(tmp_path / f"member-{i}.pkl"), sha256_bytes(blob)))
        (tmp_path / f"member-{i}.pkl").write_bytes(blob)
    from_files = task.shared_scorer(tuple(paths), [0, 1], ["a", "b"], "vote")
    assert task.shared_scorer(tuple(list(paths)), [0, 1], ["a", "b"], "vote") is from_files
    assert task.shared_scorer(tuple(paths[:1]), [0, 1], ["a", "b"], "vote") is not from_files
    np.testing.assert_array_equal(from_files.predict(pd.DataFrame(x, columns=["a", "b"])),
                                  np.arange(10) % 2)


def test_member_file_the_driver_cannot_see_is_named(tmp_path):
    """The driver's side of the file hand-over: a member file that a task on
    another node wrote where the driver cannot see it (an output_dir that is
    not shared) gives an error naming the file and the fix."""
    from collections import namedtuple

    from dist_dl.ensemble.driver import _member_files

    Row = namedtuple("Row", "member path size sha256")
    good = tmp_path / "member-0-task-0.pkl"
    good.write_bytes(b"x" * 10)
    digest = sha256_bytes(b"x" * 10)
    assert _member_files([Row(0, str(good), 10, digest)], "runs") == ((str(good), digest),)
    missing = Row(1, str(tmp_path / "member-1-task-1.pkl"), 10, digest)
    with pytest.raises(RuntimeError, match=r"member 1 was written to .*member-1-task-1.pkl "
                       r"\(10 bytes\).*cannot find that file: output_dir='runs' must be a "
                       r"folder the driver and every executor share"):
        _member_files([Row(0, str(good), 10, digest), missing], "runs")
    with pytest.raises(RuntimeError, match="sees 10 bytes there"):
        _member_files([Row(0, str(good), 12, digest)], "runs")
    # The same size but other bytes: swapped after the task wrote it.
    with pytest.raises(IntegrityError, match=f"ensemble member 0 {good}: its SHA-256 is "
                       f"{digest}, but the run that wrote it recorded {'0' * 64}"):
        _member_files([Row(0, str(good), 10, "0" * 64)], "runs")
