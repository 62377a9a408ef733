"""MirroredStrategyRunner's arguments and the weights check's verdicts: no
Spark job, no TensorFlow, no worker process."""
from __future__ import annotations

import math
import warnings

import pytest

from dist_dl import HorovodRunner, MirroredStrategyRunner, TFDistributeRunner, WorkersDiverged
from dist_dl.launch import UnsynchronizedTraining
from dist_dl.launch.core.slots import split as _split
from dist_dl.launch.engines.tensorflow import TFLocalBackend
from dist_dl.launch.core.weights import check

pytestmark = [pytest.mark.timeout(60), pytest.mark.profile_subset_164]


@pytest.mark.parametrize("num_slots", [0, False, 1.5, "2"])
def test_num_slots_must_be_a_non_zero_integer(num_slots):
    with pytest.raises(ValueError, match=r"MirroredStrategyRunner: num_slots is .* non-zero integer"):
        MirroredStrategyRunner(num_slots=num_slots)


def test_both_constructor_shapes_and_their_defaults():
    # spark-tensorflow-distributor's package and Databricks' documentation
    # write it with keywords; a positional num_slots is accepted too.
    runner = MirroredStrategyRunner(num_slots=1, local_mode=True, use_gpu=False)
    assert (runner.gpu_resource_name, runner.use_custom_strategy) == ("gpu", False)
    assert runner.get_num_tasks() == 1
    runner = MirroredStrategyRunner(1, local_mode=True, use_gpu=False, gpu_resource_name="gpu",
                                    use_custom_strategy=True)
    assert runner.use_custom_strategy and runner.local_mode
    # Output reaches the driver rank-prefixed by default; the weights check is on.
    assert runner.driver_log_verbosity == "all" and runner.check_weights


def test_local_cpu_training_is_one_process_and_negative_slots_are_processes():
    with pytest.raises(ValueError, match="num_slots must be 1 .* use num_slots=-3"):
        MirroredStrategyRunner(num_slots=3, local_mode=True, use_gpu=False)
    runner = MirroredStrategyRunner(num_slots=-3, use_gpu=False)
    assert isinstance(runner._backend, TFLocalBackend)
    assert runner._backend.worker_gpus == [[], [], []]  # CPU only: no GPU visible
    assert runner.get_num_tasks() == 3


@pytest.mark.parametrize("task_amount", [1, 2, 4])
@pytest.mark.parametrize("num_slots", [2, 4, 6, 8])
def test_gpus_per_task_as_the_original_splits_them(num_slots, task_amount):
    """spark-tensorflow-distributor: ceil(num_slots / amount) tasks, the
    first num_slots % tasks of them taking one GPU more."""
    tasks = math.ceil(num_slots / task_amount)
    shares = _split(num_slots, tasks)
    assert len(shares) == tasks and sum(shares) == num_slots
    assert shares == [num_slots // tasks + (i < num_slots % tasks) for i in range(tasks)]
    assert max(shares) <= task_amount


@pytest.mark.parametrize("runner", [HorovodRunner, TFDistributeRunner, MirroredStrategyRunner])
def test_each_runners_errors_name_that_runner(runner):
    with pytest.raises(TypeError, match=rf"^{runner.__name__}\.__init__\(\) got an unexpected"):
        runner(np=-2, num_slots=-2, no_such_argument=1)
    if runner is not MirroredStrategyRunner:
        with pytest.raises(ValueError, match=rf"^{runner.__name__}: np must be"):
            runner(np=0)
        with pytest.raises(ValueError, match=rf"^{runner.__name__}: timeout must be"):
            runner(np=-2, timeout=-1)
    else:
        with pytest.raises(ValueError, match=r"^MirroredStrategyRunner: num_slots"):
            runner(num_slots=0)
        with pytest.raises(ValueError, match=r"^MirroredStrategyRunner: timeout must be"):
            runner(num_slots=-1, use_gpu=False, timeout=-1)
        with pytest.raises(TypeError, match=r"^MirroredStrategyRunner\(num_slots=-1\)\.run: "):
            runner(num_slots=-1, use_gpu=False).run("not a function")


def _weights(rank, name="sequential", total=1.0, multi_worker=True, steps=3):
    return {"kind": "weights", "rank": rank, "models": [
        {"name": name, "steps": steps, "multi_worker": multi_worker,
         "variables": [["dense/kernel:0", total, abs(total) + 2.0], ["dense/bias:0", 0.5, 0.5]]}]}


def test_weights_that_differ_from_rank_0s_fail_naming_the_model_ranks_and_fix():
    records = [_weights(0, total=1.0, multi_worker=False), _weights(1, total=1.57, multi_worker=False)]
    with pytest.raises(WorkersDiverged) as caught:
        check(records, 2, "TFDistributeRunner(np=2)", "FIX HERE.")
    text = str(caught.value)
    assert text.startswith("TFDistributeRunner(np=2): the 2 workers ended with different weights")
    assert "'sequential'" in text and "rank 1 (variable dense/kernel:0" in text
    assert "outside a MultiWorkerMirroredStrategy's scope on rank(s) 0, 1" in text
    assert "FIX HERE." in text and "check_weights=False" in text


def test_weights_alike_without_a_strategy_warn_and_under_one_pass():
    alone = [_weights(0, multi_worker=False), _weights(1, multi_worker=False)]
    with pytest.warns(UnsynchronizedTraining, match="did the same work 2 times"):
        check(alone, 2, "TFDistributeRunner(np=2)", "fix")
    synced = [_weights(0), _weights(1), _weights(2, total=1.0 + 1e-9)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(synced, 3, "TFDistributeRunner(np=3)", "fix")


def test_models_not_on_every_rank_once_or_reports_missing_are_not_compared():
    # A model only rank 0 has (loaded for evaluation), or a rank that sent no report.
    check([_weights(0, name="loaded"), _weights(1, name="other", total=9.0)], 2, "r", "fix")
    check([_weights(0), {"kind": "start", "rank": 1}], 2, "r", "fix")
    twice = _weights(1, total=9.0)
    twice["models"] *= 2
    check([_weights(0), twice], 2, "r", "fix")
