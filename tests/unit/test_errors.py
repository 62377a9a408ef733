"""The driver's errors for a failed job name the runner whose job it was
(dist_dl.launch.core.errors.failure_from): worker errors and timeouts alike."""
import pytest

from dist_dl.launch.core.errors import JobTimeout, WorkerError, failure_from
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
