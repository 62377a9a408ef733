"""An engine's workers on the tasks of one Spark barrier stage started through
the DataFrame API, for Spark Connect sessions: what
`BarrierSparkBackend` (``dist_dl.launch.backends.spark_classic``) runs when its session
is a Connect client (``SparkSession.builder.remote(...)``; on Databricks:
serverless compute, standard access mode, Databricks Connect).

The stage is ``spark.range(n, numPartitions=n).mapInArrow(task, schema,
barrier=True)`` (pyspark 3.5 and later), its configuration is read through
``spark.conf``, and each task runs its workers exactly as a classic barrier
task does (``dist_dl.launch.backends.spark_classic._barrier_task``: places gathered
with ``allGather``, the engine's environment, the task's deadline, nothing
left running). What differs is the way back:

- Nothing connects from the executors to the client. The client of a
  Databricks Connect session runs on a laptop, which executors cannot reach,
  so training never depends on it. Each task writes its workers' output to
  its own stderr (the executor's log, where it is read live) and returns it
  in its rows: the client prints it, rank-prefixed, when the stage ends.
- A worker that fails fails its task with an error whose message carries the
  worker's reports (its error record with rank, host and traceback, its exit
  code, its last lines); Spark fails the barrier stage and kills the other
  tasks, whose workers end with their task (they watch their parent). The
  client reads the reports from the error and raises the same
  ``WorkerError`` naming the failing rank as on a classic session.
- A half-run training job never starts again on its own: Spark does not
  resubmit a failed barrier result stage, and a task's second attempt
  refuses to run; the caller retries from its checkpoints.
- The timeout: each task stops its workers at its deadline, and the client,
  past the deadline and the grace, interrupts the stage through its tag
  (``spark.interruptTag``).
- Task slots: where the configuration states them
  (`dist_dl.core.sessionkind.configured_slots()`) they are checked before the stage;
  elsewhere Spark's barrier mode checks them when the stage starts, and its
  refusal is raised as ``NotEnoughSlots``.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import sys
import threading
import time
from typing import Any, Callable, Iterator

import cloudpickle

from dist_dl.core.sessionkind import connect_barrier_problem
from dist_dl.launch.core import protocol
from dist_dl.launch.core.deadline import Backstop, stage_refusal
from dist_dl.launch.core.errors import failure_from
from dist_dl.launch.core.slots import check_connect_slots
from dist_dl.launch.fork import client as forkserver

__all__ = ["run_connect", "SCHEMA"]

# One row per line of output, and the pickled result of rank 0 in chunks
# (a row's binary value is one Arrow buffer; big results are split).
SCHEMA = "place int, seq int, kind string, data binary"
_CHUNK = 4 << 20
# What a failed task's error carries back: the kinds of report that name the
# failure, and each rank's last lines (what ``failure_from`` attaches).
_REPORTED = ("error", "exit", "timeout", "start")
_TAIL = 40
# How long a task whose workers failed without a signal waits before it
# fails the stage (``_arrow_task``): Spark's time to carry a peer task's
# failure to the driver, with room for a loaded machine.
_DEFER_S = 5.0
# Where a task's reports start in its error's message.
_MARK = "dist_dl reports follow:"
_REPORT = "dist_dl-report:"
_CONTROL = re.compile(re.escape(_REPORT) + r"([A-Za-z0-9+/=]+)")


class _TaskChannel:
    """A task's output, kept for its rows and written to its stderr (the
    executor's log); what ``spark_classic._barrier_task``
    sends to the driver's output server on a classic session."""

    def __init__(self):
        self.lines: list[str] = []
        self.tails: dict[int, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=_TAIL))
        self.reports: list[str] = []
        self._lock = threading.Lock()
        self.go = True

    def opened(self, place: int) -> "_TaskChannel":
        from pyspark import BarrierTaskContext

        # A failed barrier ResultStage (this one) is not resubmitted: Spark's
        # DAGScheduler aborts it ("Could not recover from a failed barrier
        # ResultStage"). A task's own second attempt is refused here.
        self.go = BarrierTaskContext.get().attemptNumber() == 0
        return self

    def send(self, text: str) -> None:
        with self._lock:
            sys.stderr.write(text)
            # Split on newlines only: str.splitlines also splits at the
            # control prefix's record separator.
            for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
                line += "\n"
                self.lines.append(line)
                record = protocol.decode_control(line)
                if record is None:
                    match = re.match(r"\[(\d+)\]<", line)
                    if match:
                        self.tails[int(match.group(1))].append(line)
                elif record.get("kind") in _REPORTED:
                    self.reports.append(line.rstrip("\n"))

    def close(self) -> None:
        sys.stderr.flush()

    def killed_by_a_signal(self) -> bool:
        """Whether one of this task's workers ended by a signal."""
        with self._lock:
            records = [protocol.decode_control(line) for line in self.reports]
        return any(r["kind"] == "exit" and (r.get("code") or 0) < 0 for r in records)

    def failure_text(self) -> str:
        """The reports and last lines, for the task's error message."""
        with self._lock:
            tails = [line.rstrip("\n") for tail in self.tails.values() for line in tail]
            # Control lines first, without their leading control character
            # (an error's message reaches the client without the lines that
            # hold one): the client reads them back from the message.
            reports = [_REPORT + line[len(protocol.CONTROL_PREFIX):] for line in self.reports]
            return "\n".join([_MARK, *reports, *tails])


def _arrow_task(barrier_task: Callable, args: tuple, batches: Iterator) -> Iterator:
    """One barrier task of the stage: the classic barrier task's work
    (``barrier_task``), with its output kept in ``_TaskChannel`` and returned
    as Arrow rows."""
    import pyarrow as pa

    for _ in batches:  # the stage's input: one row per task, unused
        pass
    channel = _TaskChannel()
    try:
        results = list(barrier_task(args[0], channel.opened, None, *args[1:], None))
    except BaseException as exc:
        if not channel.killed_by_a_signal():
            # Only the first failed task's error reaches the client (Spark
            # aborts the barrier stage and kills the other tasks). A worker
            # killed by a signal is the likelier cause: its peers fail because
            # it is gone (Gloo's "connection closed by peer", exit code 1),
            # often within milliseconds. So a task whose workers failed
            # otherwise leaves a signal's task the time to fail the stage first.
            time.sleep(_DEFER_S)
        raise RuntimeError(f"{exc}\n{channel.failure_text()}") from None
    (place, result), = results
    rows = [(place, i, "line", line.encode()) for i, line in enumerate(channel.lines)]
    if result is not None:
        rows += [(place, i, "result", result[at:at + _CHUNK])
                 for i, at in enumerate(range(0, len(result), _CHUNK))]
    columns = list(zip(*rows)) if rows else [[], [], [], []]
    yield pa.RecordBatch.from_arrays(
        [pa.array(columns[0], pa.int32()), pa.array(columns[1], pa.int32()),
         pa.array(columns[2], pa.string()), pa.array(columns[3], pa.binary())],
        names=["place", "seq", "kind", "data"])


def _reports_in(text: str) -> list[str]:
    """The control lines a failed task's error carries, each once, in order
    (the client's error may repeat the task's message)."""
    seen: dict[str, None] = {}
    for found in _CONTROL.findall(text):
        seen.setdefault(protocol.CONTROL_PREFIX + found, None)
    return list(seen)


def _tails_in(text: str) -> list[str]:
    """The output lines (rank-prefixed) after the reports' mark, each once."""
    lines: dict[str, None] = {}
    for block in text.split(_MARK)[1:]:
        for line in block.splitlines():
            if re.match(r"\[\d+\]<std(?:out|err)>:", line):
                lines.setdefault(line, None)
    return list(lines)


def run_connect(backend, spark, fn: Callable[..., Any], kwargs: dict, num_proc: int, options,
                sink, label: str, barrier_task: Callable) -> Any:
    """Run ``fn(**kwargs)`` in the workers of ``num_proc`` barrier tasks of
    ``spark`` (a Connect session), with ``backend``'s engine, layout,
    GPUs and grace, each task's work done by ``barrier_task``
    (``dist_dl.launch.backends.spark_classic._barrier_task``); return rank 0's result.

    Raises:
        RuntimeError: pyspark here cannot start a barrier stage from Connect.
        NotEnoughSlots: the cluster has fewer task slots than ``num_proc``.
        WorkerError: a worker failed (its rank, host and traceback).
        JobTimeout: the job outlived ``options.timeout``.
    """
    problem = connect_barrier_problem()
    if problem is not None:
        raise RuntimeError(f"{label}: {problem}")
    layout = backend.layout or [1] * num_proc
    if len(layout) != num_proc:
        raise ValueError(f"{label}: a layout of {len(layout)} tasks for {num_proc} tasks")
    check_connect_slots(spark, num_proc, label)
    engine = backend.engine
    payload = cloudpickle.dumps((dataclasses.replace(options, engine=engine.name), fn, kwargs))
    args = (payload, options.timeout, backend.grace, label, engine, layout,
            (backend.gpu_resource, backend.worker_gpus), forkserver.driver_switch())
    tag = f"dist_dl-{engine.name}-{options.job_id}"
    backstop = Backstop(options.timeout, backend.grace, lambda: spark.interruptTag(tag))
    spark.addTag(tag)
    try:
        stage = spark.range(0, num_proc, 1, num_proc).mapInArrow(
            lambda batches: _arrow_task(barrier_task, args, batches), SCHEMA, barrier=True)
        with backstop:
            rows = stage.collect()
    except Exception as exc:
        text = str(exc)
        for line in _reports_in(text) + _tails_in(text):
            sink.feed(line + "\n")
        sink.close()
        refused = stage_refusal(text, backstop, sink, label, num_proc, options.timeout,
                                backend.grace, "its Spark stage was interrupted")
        if refused is not None:
            raise refused from exc
        exits = [r for r in sink.records if r["kind"] == "exit" and r.get("code")]
        first_failed = (exits[0]["rank"], exits[0]["code"]) if exits else None
        if first_failed is None and not sink.records:
            raise
        raise failure_from(sink, first_failed, options.timeout, label) from exc
    finally:
        spark.removeTag(tag)
    result = bytearray()
    for row in sorted(rows, key=lambda r: (r.place, r.kind != "line", r.seq)):
        if row.kind == "line":
            sink.feed(bytes(row.data).decode(errors="replace"))
        elif row.kind == "result":
            result += row.data
    sink.close()
    return cloudpickle.loads(bytes(result))
