"""Notebooks: Databricks source format, a header that names the job behind
each one (checked against jobs/*.json) and its widgets, widgets read once at
the top, and each runs end to end locally (widgets fall back to their
defaults without dbutils)."""


import runpy
from pathlib import Path

import pytest


ROOT = Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


# Over a minute each in a full run here (pytest --durations=0): `make test-fast` skips them.
SLOW_NOTEBOOKS = {"04_train_distributed_dataframe", "05_ensembles_and_search", "06_benchmark",
                  "07_batch_scoring"}


# HorovodRunner's notebook and the benchmark's (whose setups are Horovod jobs)
# need Horovod: skipped, saying so, where it does not import (runtimes 16.x, 17.x).
HOROVOD_NOTEBOOKS = {"03_horovod_runner", "06_benchmark"}


# The single-node baseline (a Keras model in one process) and the search
# (each trial trains a Keras model) need TensorFlow: skipped, saying so, where
# it does not import (runtime 19).
TENSORFLOW_NOTEBOOKS = {"02_single_node_baseline", "05_ensembles_and_search"}


# TorchDistributor's notebook needs torch: run on the profiles that install it
# (dbr-16.4-ml, dbr-17.3-ml), skipped, saying so, elsewhere.
TORCH_NOTEBOOKS = {"08_torch_distributor"}

# What a notebook's `result` must show beyond being there.
CHECKS = {
    # Two processes on Spark tasks learn the digits (exact validation over every row once),
    # with the notebook's own function and with train_distributed's torch engine.
    "08_torch_distributor": lambda result: (result["num_workers"] == 2
                                            and result["validation_rows"] > 300
                                            and result["history"]["val_accuracy"][-1] >= 0.95
                                            and result["train_distributed_val_accuracy"] >= 0.95),
}


def _marks(path) -> list:
    return ([pytest.mark.slow] if path.stem in SLOW_NOTEBOOKS else []) + \
        ([pytest.mark.needs("horovod.tensorflow")] if path.stem in HOROVOD_NOTEBOOKS else []) + \
        ([pytest.mark.needs("tensorflow")] if path.stem in TENSORFLOW_NOTEBOOKS else []) + \
        ([pytest.mark.needs("torch"), pytest.mark.profile_subset_164]
         if path.stem in TORCH_NOTEBOOKS else [])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", [pytest.param(p, marks=_marks(p)) for p in NOTEBOOKS],
                         ids=lambda p: p.stem)
def test_notebook_runs_locally(path, spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the notebooks write under ./runs
    namespace = runpy.run_path(str(path), run_name="__main__")
    result = namespace.get("result")
    assert result is not None, f"{path.name} must leave its outcome in `result`"
    check = CHECKS.get(path.stem)
    assert check is None or check(result), f"{path.name}: {result}"
