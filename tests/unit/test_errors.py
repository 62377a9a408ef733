"""The driver's errors for a failed job name the runner whose job it was
(dist_dl.launch.core.errors.failure_from): worker errors and timeouts alike."""
import pytest

from dist_dl.launch.core.errors import (JobTimeout, WorkerError, cancelled_from_outside,
                                        failure_from)
from dist_dl.launch.core.protocol import DriverSink, encode_control

RUNNER = "MirroredStrategyRunner(num_slots=2)"


def _sink(*records: str) -> DriverSink:
    sink = DriverSink("log_callback_only")
    sink.feed(encode_control("start", 0, pid=11, host="worker1", time=0.0))
    sink.feed(encode_control("start", 1, pid=12, host="worker2", time=0.0))
    for record in records:
        sink.feed(record)
    return sink


@pytest.mark.timeout(30)
def test_a_worker_error_starts_with_the_runner_then_the_rank_and_its_host():
    sink = _sink(encode_control("error", 1, type="ValueError", message="bad label 11",
                                traceback="Traceback ...\n"))
    error = failure_from(sink, None, timeout=None, runner=RUNNER)
    assert isinstance(error, WorkerError) and error.runner == RUNNER
    assert str(error).splitlines()[0] == (
        f"{RUNNER}: worker rank 1 on host worker2 failed: ValueError: bad label 11")
    # A worker that died without a report: named the same way.
    died = failure_from(_sink(), (0, -9), timeout=None, runner=RUNNER)
    assert str(died).startswith(f"{RUNNER}: worker rank 0 on host worker1 failed: WorkerDied: "
                                "the worker process was killed by SIGKILL"), died


@pytest.mark.timeout(30)
def test_a_timeout_starts_with_the_runner():
    sink = _sink(encode_control("timeout", 1, seconds=30.0))
    error = failure_from(sink, (1, 1), timeout=30.0, runner=RUNNER)
    assert isinstance(error, JobTimeout)
    assert str(error).startswith(f"{RUNNER}: rank 1 on host worker2 was still running after "
                                 "the job's timeout of 30 s"), error


@pytest.mark.timeout(30)
def test_without_a_runner_the_message_is_the_workers():
    sink = _sink(encode_control("error", 0, type="ValueError", message="no", traceback=""))
    error = failure_from(sink, None, timeout=None)
    assert error.runner == "" and str(error) == "worker rank 0 on host worker1 failed: ValueError: no"


def _py4j(line: str) -> str:
    """A failed collect() as py4j words it, around Spark's own line."""
    return (f"An error occurred while calling o123.collectAndServe.\n: "
            f"org.apache.spark.SparkException: {line}\n\tat org.apache.spark.scheduler."
            f"DAGScheduler.handleJobCancellation(DAGScheduler.scala:2719)\n")


# Spark's lines, as PySpark 3.5 (first) and 4.1 (error class and SQLSTATE) raise them.
_ALL_JOBS = ["Job 1 cancelled as part of cancellation of all jobs",
             "[SPARK_JOB_CANCELLED] Job 1 cancelled as part of cancellation of all jobs "
             "SQLSTATE: XXKDA"]
_OUR_GROUP = ["Job 0 cancelled part of cancelled job group dist_dl-torch-ab12",
              "[SPARK_JOB_CANCELLED] Job 0 cancelled part of cancelled job group "
              "dist_dl-torch-ab12 SQLSTATE: XXKDA"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("line", _ALL_JOBS)
def test_a_cancel_of_all_jobs_is_from_outside_and_certain(line):
    # Certain: a worker whose peer the cancel killed may report its own
    # failure first, and the cancel is still what ended the job.
    assert cancelled_from_outside(_py4j(line), "dist_dl-torch-ab12") == (
        "Job 1 cancelled as part of cancellation of all jobs", True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("line", _OUR_GROUP)
def test_the_runners_own_cancel_of_its_job_group_is_not_from_outside(line):
    assert cancelled_from_outside(_py4j(line), "dist_dl-torch-ab12") is None
    # Another group's cancel (a notebook's) is from outside.
    assert cancelled_from_outside(_py4j(line), "dist_dl-torch-cd34")[1] is True


@pytest.mark.timeout(30)
def test_a_failed_stage_that_says_cancelled_elsewhere_is_only_a_guess():
    stage = ("Job aborted due to stage failure: Task 0 in stage 3.0 failed: TaskKilled "
             "(Stage cancelled)")
    assert cancelled_from_outside(_py4j(stage)) == (stage, False)
    assert cancelled_from_outside(_py4j("Job aborted due to stage failure: barrier task "
                                        "ResultTask(1, 0) finished unsuccessfully")) is None


@pytest.mark.timeout(30)
def test_a_tf_worker_ended_by_a_peers_missing_heartbeats_names_that_peer_and_its_host():
    # What a tf.distribute worker prints before TensorFlow ends it (exit
    # code 1, no Python error) when its peer's host is cut off the network.
    lines = ["E tensorflow/core/common_runtime/base_collective_executor.cc:248] "
             "BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from "
             "/job:worker/task:1: The following tasks are unhealthy (stopped sending "
             "heartbeats):", "/job:worker/replica:0/task:1",
             "The tasks have crashed. Check the task logs for an earlier error."]
    sink = _sink(*[f"[0]<stderr>:{line}\n" for line in lines])
    error = failure_from(sink, (0, 1), timeout=None, runner=RUNNER)
    assert str(error).splitlines()[0] == (
        f"{RUNNER}: worker rank 0 on host worker1 failed: WorkerDied: the worker process "
        "exited with code 1 after TensorFlow found rank 1 on host worker2 stopped sending "
        "heartbeats (a host cut off the network, or a worker stopped or lost)")
    # Its Python error, where it raised one, names the peer the same way.
    raised = _sink(*[f"[0]<stderr>:{line}\n" for line in lines], encode_control(
        "error", 0, type="UnavailableError", message="Collective ops is aborted by: ...",
        traceback=""))
    assert "TensorFlow found rank 1 on host worker2 stopped sending heartbeats" in str(
        failure_from(raised, (0, 1), timeout=None, runner=RUNNER)).splitlines()[0]
