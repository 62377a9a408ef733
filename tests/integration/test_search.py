"""Parallel hyperparameter trials on local[2] Spark, logged to a temporary MLflow store."""
from __future__ import annotations

import pytest

from dist_dl.search import (Choice, IntRange, LogUniform, Uniform, search)


def _max_overlap(intervals) -> int:
    """Most intervals open at one instant (an end before a start at a tie)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def _toy_objective():
    # Built inside a function so that Spark's cloudpickle ships it by value
    # (the tests folder is not importable in the Python workers).
    def train(params, reporter):
        import time

        x = params["x"]
        if x == 0:
            raise ValueError("deliberate failure for x=0")
        final = (x - 3) ** 2
        far_off = final > 100  # x=40 and x=100
        for epoch in range(1, 6):
            time.sleep(0.4)
            # The ordinary x report alike: the median rule stops no trial that
            # ties the median, so the order in which they finish (which a busy
            # machine changes) cannot stop one. The far-off x report far off
            # from the first epoch.
            reporter.report((final if far_off else 0.0) + 10.0 / epoch, step=epoch)
        return final

    return train


@pytest.mark.profile_subset_164
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_grid_search_limits_concurrency_fails_and_stops_trials(spark, tmp_path):
    from mlflow.tracking import MlflowClient

    # Grid order is the listed order: x=3 (the optimum) and the ordinary ones
    # finish first, the hopeless x=40 and x=100 come last, when the median
    # rule has finished trials to compare them with.
    space = {"x": [1, 3, 5, 0, 2, 4, 40, 100]}
    result = search(_toy_objective(), space, max_trials=8, max_concurrent=2, algorithm="grid",
                    early_stopping="median", early_stopping_startup_trials=3, spark=spark,
                    tracking_uri=tmp_path.as_uri())

    trials = {t.params["x"]: t for t in result.trials}
    assert len(trials) == 8
    assert result.best_params == {"x": 3} and result.best_value == 0

    # At most two at a time, from the times measured inside the tasks, and
    # really two at a time (the cluster has two slots).
    timed = [(t.start, t.end) for t in result.trials if t.start is not None]
    assert len(timed) == 8
    assert _max_overlap(timed) == 2

    failed = trials[0]
    assert failed.status == "failed" and "deliberate failure" in failed.error
    for x in (40, 100):
        assert trials[x].status == "pruned", trials[x]
        assert trials[x].steps < 5
    assert {trials[x].status for x in (1, 3, 5, 2, 4)} == {"completed"}

    client = MlflowClient(tracking_uri=tmp_path.as_uri())
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["dist_dl.best_run_id"] == result.best_run_id
    for t in result.trials:
        run = client.get_run(t.run_id)
        assert run.data.tags["mlflow.parentRunId"] == result.parent_run_id
        assert run.info.status == {"completed": "FINISHED", "pruned": "KILLED",
                                   "failed": "FAILED"}[t.status]
    # Intermediate reports were logged as the trial's metric history.
    history = client.get_metric_history(trials[3].run_id, "objective")
    assert [m.step for m in history if m.step > 0][:5] == [1, 2, 3, 4, 5]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_adaptive_search_finds_the_optimum_region(spark, tmp_path):
    def train(params, reporter):
        return (params["lr"] - 0.01) ** 2 * 1e4 + (params["layers"] - 3) ** 2

    result = search(train, {"lr": LogUniform(1e-4, 1.0), "layers": IntRange(1, 6)},
                    max_trials=16, max_concurrent=2, algorithm="tpe", early_stopping=None,
                    seed=1, spark=spark, tracking_uri=tmp_path.as_uri())
    assert len(result.trials) == 16
    assert all(t.status == "completed" for t in result.trials)
    # Random search's expected best of 16 here is far worse than 1; TPE
    # concentrates around lr=0.01, layers=3.
    assert result.best_value < 1.0, result.best_params


@pytest.mark.profile_subset_164
def test_arguments_are_checked_before_any_trial(spark):
    def train(params, reporter):
        return 0.0

    with pytest.raises(ValueError, match="algorithm='bayes'"):
        search(train, {"x": [1, 2]}, max_trials=2, max_concurrent=1, algorithm="bayes",
               spark=spark)
    with pytest.raises(ValueError, match="grid search needs Choice or IntRange"):
        search(train, {"x": Uniform(0, 1)}, max_trials=2, max_concurrent=1, algorithm="grid",
               spark=spark)
    with pytest.raises(ValueError, match="max_concurrent=0"):
        search(train, {"x": Choice((1,))}, max_trials=2, max_concurrent=0, spark=spark)
