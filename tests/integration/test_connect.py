"""The launchers from a Spark Connect session (``SparkSession.builder.remote``):
a real Connect server (Spark's own plugin, ``local[2]``) in a process of its
own (tests/support/connect_server.py), this test process its client.

What is checked is what a classic session guarantees: rank 0's value back,
the workers' output, the failing rank named with its traceback, the
timeout, the task slots checked before any stage, nothing left running,
``train_distributed`` retried from its checkpoint; and the steps that need
the classic SparkContext refused before any work, naming the session kind.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra: "
                                    "profiles dbr-16.4-ml and dbr-17.3-ml)")
pyspark = pytest.importorskip("pyspark")
if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (3, 5):
    pytest.skip("a barrier stage from a Connect session needs pyspark 3.5 "
                "(mapInArrow(..., barrier=True)); this profile has " + pyspark.__version__,
                allow_module_level=True)
# pyspark's Connect client's own requirements (pyspark[connect]; the `connect`
# extra of dist_dl): the profiles with pyspark 3.5+ pin them, so they run.
pytest.importorskip("grpc", reason="the Spark Connect client needs grpcio (the `connect` extra)")
pytest.importorskip("grpc_status", reason="the Spark Connect client needs grpcio-status")

import cloudpickle  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

import train_hooks  # noqa: E402
from dist_dl import (JobTimeout, NotEnoughSlots, TorchDistributor, WorkerError,  # noqa: E402
                     train_distributed)
from dist_dl.core.sessionkind import ClassicSessionRequired, is_connect  # noqa: E402
from waits import workers_left  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(train_hooks)
# One test process runs the module's tests one after another (its client
# session is the module's fixture, and a classic test between two of them
# would find the process in Connect mode).
pytestmark = [pytest.mark.profile_subset_164, pytest.mark.xdist_group("connect")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    """The Connect server's process and port (ends with the module)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/support/connect_server.py"),
                             str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=REPO, text=True)
    try:
        line = proc.stdout.readline()  # "ready", or "" where it failed to start
        assert line.strip() == "ready", f"the Connect server did not start ({proc.poll()})"
        yield proc, port
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def connect(server):
    """The client session; the process is left as it was (a Connect client
    marks the whole process as one: pyspark's ``SPARK_CONNECT_MODE_ENABLED``).

    A Connect client's process holds no SparkContext (pyspark refuses to
    start a remote session beside one: ``SESSION_ALREADY_EXIST``), so an
    earlier test's local session in this test process is stopped first; the
    ``spark`` fixture starts another for the tests that come after."""
    from pyspark.sql import SparkSession

    classic = SparkSession.getActiveSession()
    if classic is not None:
        classic.stop()
    before = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{server[1]}").getOrCreate()
    assert is_connect(spark)
    try:
        yield spark
    finally:
        spark.stop()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _workers_left(server, within: float = 10.0) -> list[str]:
    """The Connect server's worker processes (of any job) still running ``within`` s from now."""
    return workers_left(server[0].pid, within)


def allreduce(scale):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {total.item()}")
        return total.item() * scale
    finally:
        dist.destroy_process_group()


# The first test of the module starts the server, its first Python workers
# and torch in them: seconds on an idle machine, minutes on a loaded one.
@pytest.mark.timeout(420)
def test_torch_distributor_runs_a_gloo_job_and_returns_rank_0s_value(connect, server, capsys):
    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, spark=connect)
    assert distributor.run(allreduce, 10) == 30.0
    out = capsys.readouterr().out
    # Each task's output comes back in its rows, rank-prefixed.
    assert "[0]<stdout>:rank 0 of 2: 3.0" in out and "[1]<stdout>:rank 1 of 2: 3.0" in out
    assert _workers_left(server) == []


def fail_on_rank_1():
    import os
    import time

    if os.environ["RANK"] == "1":
        raise ValueError("rank one says no")
    time.sleep(300)  # rank 0 waits: the failure ends it


def sleep_long():
    import time

    time.sleep(120)


@pytest.mark.timeout(420)
def test_a_failing_rank_is_named_and_a_timeout_stops_every_process(connect, server):
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         spark=connect).run(fail_on_rank_1)
    error = caught.value
    assert (error.rank, error.worker_type, error.worker_message) == (1, "ValueError",
                                                                      "rank one says no")
    assert error.host and "rank one says no" in error.worker_traceback
    assert str(error).startswith("TorchDistributor(num_processes=2, local_mode=False): worker "
                                 f"rank 1 on host {error.host} failed: ValueError"), error
    assert time.monotonic() - started < 240  # not rank 0's 300 s sleep
    assert _workers_left(server) == []

    started = time.monotonic()
    with pytest.raises(JobTimeout, match="timeout of 3 s"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, timeout=3,
                         spark=connect).run(sleep_long)
    assert time.monotonic() - started < 100  # not the 120 s sleep
    assert _workers_left(server) == []


@pytest.mark.timeout(120)
def test_slots_are_checked_and_classic_only_steps_refused_before_any_work(connect, tmp_path):
    with pytest.raises(NotEnoughSlots, match=r"^TorchDistributor\(num_processes=3, local_mode="
                       r"False\) needs 3 Spark tasks .*Connect session's cluster \(local\[2\]\) "
                       r"has 2 task slot"):
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=False,
                         spark=connect).run(sleep_long)
    with pytest.raises(ValueError, match=r"spark.task.resource.gpu.amount is unset.*use_gpu=False"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True, spark=connect)

    from dist_dl.prepare import prepare_image_dataset
    from dist_dl.search import Uniform, search

    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    with pytest.raises(ClassicSessionRequired, match=r"^prepare_image_dataset .*Spark Connect "
                       r"session.*Prepare the shards on a classic session"):
        prepare_image_dataset(str(tmp_path / "shards"), image_dir=str(tmp_path / "images"),
                              spark=connect)
    assert not (tmp_path / "shards").exists()
    with pytest.raises(ClassicSessionRequired, match=r"^search\(\) .*Spark Connect session"):
        search(lambda params, reporter: 0.0, {"x": Uniform(0, 1)}, max_trials=1,
               max_concurrent=1, spark=connect, tracking_uri=(tmp_path / "mlruns").as_uri())


@pytest.mark.timeout(420)
def test_train_distributed_runs_on_spark_tasks_and_retries_from_its_checkpoint(
        connect, server, shards, tmp_path, capfd):
    store = (tmp_path / "mlruns").as_uri()
    log = str(tmp_path / "steps.log")
    # 3 steps an epoch: rank 1 dies in the second step of epoch 2; the retry
    # resumes after epoch 1 from its checkpoint.
    trained = train_distributed(
        shards, engine="torch", model=train_hooks.TorchKiller(log, 1, 4), epochs=2,
        num_workers=2, batch_size=4, image_size=16, max_retries=1, spark=connect,
        tracking_uri=store, output_dir=str(tmp_path / "out"))
    assert os.path.exists(log + ".killed")
    assert trained.attempts == 2 and len(trained.history["loss"]) == 2
    run = MlflowClient(store).get_run(trained.run_id)
    assert run.data.params["backend"] == "spark"  # the Connect session's tasks, not this host
    assert "SIGKILL" in run.data.tags["dist_dl.attempt_1_error"]
    out = capfd.readouterr().out
    assert "(after epoch 1)" in out and "resuming after epoch 1" in out
    assert _workers_left(server) == []
