"""The one channel from workers to the driver: their stdout and stderr.

Every backend already carries each worker's output to the driver (local: our
own pipes; Spark with Horovod: its task service streams it back; Spark with
tf.distribute or torch: each barrier task's connection to the driver,
``backends/spark_classic.py``). Workers prefix every line with their rank and send
structured records (``log_to_driver`` messages, errors, timeouts) as control
lines in the same stream, so the driver needs no second connection into the
cluster.

Used on both sides: ``encode_*`` in workers, ``DriverSink`` on the driver.
"""
from __future__ import annotations

import base64
import collections
import re
import json
import sys
import threading
import time
from typing import Any, Callable, TextIO

__all__ = ["CONTROL_PREFIX", "encode_control", "decode_control", "DriverSink", "line_prefix"]

# Starts with a character that ordinary output never has at a line start.
CONTROL_PREFIX = "\x1edist_dl:"
VERBOSITIES = ("all", "log_callback_only")


def line_prefix(rank: int, stream: str) -> str:
    # The format Horovod's own launchers use, so that mixed output reads alike.
    return f"[{rank}]<{stream}>:"


# Gloo's message when a collective waited past its timeout for another rank
# (HOROVOD_GLOO_TIMEOUT_SECONDS, 30 s by default); Horovod's background loop
# then ends the process. Kept per rank apart from the tail, which a long
# Python traceback after it would push it out of.
GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms for \w+ operation(?: to complete)?")
# TensorFlow's coordination service, when a task stops sending heartbeats
# (its host cut off, its process stopped), tells every other task, which
# prints the tasks' names one per line after it, and ends (exit code 1).
TF_UNHEALTHY = "stopped sending heartbeats"
_TF_TASK = re.compile(r"^/job:worker/replica:\d+/task:(\d+)\s*$")
# A line's rank prefix (`line_prefix()`).
_RANK_PREFIX = r"\[\d+\]<std(?:out|err)>:"
_PREFIX = re.compile("^" + _RANK_PREFIX)
# Horovod's Spark task service prefixes each line of a worker's output once
# more (with the task index); ours, inside it, is the one that names the rank.
_OUTER_PREFIX = re.compile(f"^{_RANK_PREFIX}(?={_RANK_PREFIX}|\x1e)")


def encode_control(kind: str, rank: int, **fields: Any) -> str:
    """One control line (with trailing newline); the JSON is base64-encoded so
    that no payload (a traceback, a message) can break the line."""
    body = json.dumps({"kind": kind, "rank": rank, **fields}, default=str)
    return CONTROL_PREFIX + base64.b64encode(body.encode()).decode() + "\n"


def decode_control(line: str) -> dict | None:
    """The record in a control line, or None for ordinary output."""
    start = line.find(CONTROL_PREFIX)
    if start < 0:
        return None
    try:
        return json.loads(base64.b64decode(line[start + len(CONTROL_PREFIX):].strip()))
    except ValueError:
        return None


class DriverSink:
    """Receives worker output on the driver, line by line.

    ``log_to_driver`` messages are always printed; ordinary output is printed
    only with verbosity ``"all"`` (already rank-prefixed by the worker). Error
    and timeout records are kept for the runner, with the last lines of every
    rank's output to attach to an error.

    Writers may hand in partial lines from several threads at once (Horovod's
    Spark backend streams each rank from its own thread), so partial lines are
    buffered per writing thread.
    """

    def __init__(self, verbosity: str, out: TextIO | None = None, tail_lines: int = 40):
        if verbosity not in VERBOSITIES:
            raise ValueError(f"driver_log_verbosity must be one of {VERBOSITIES}, got {verbosity!r}")
        self.verbosity = verbosity
        self._out = out
        self._lock = threading.Lock()
        self._partial: dict[int, str] = {}
        self.records: list[dict] = []
        self.tails: dict[int, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=tail_lines))
        # rank -> the last Gloo collective timeout it printed (GLOO_TIMEOUT).
        self.gloo_timeouts: dict[int, str] = {}
        # rank -> the host it said it runs on in its "start" record.
        self.hosts: dict[int, str] = {}
        # rank -> the tasks (tf.distribute's worker index: the rank) that
        # TensorFlow told it stopped sending heartbeats (TF_UNHEALTHY).
        self.unhealthy: dict[int, set[int]] = {}
        self._listing: set[int] = set()  # ranks printing such a list now

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def feed(self, text: str) -> None:
        key = threading.get_ident()
        with self._lock:
            text = self._partial.pop(key, "") + text
            *lines, rest = text.split("\n")
            if rest:
                self._partial[key] = rest
            for line in lines:
                self._line(line)

    def close(self) -> None:
        with self._lock:
            for rest in self._partial.values():
                self._line(rest)
            self._partial.clear()

    def _line(self, line: str) -> None:
        line = _OUTER_PREFIX.sub("", line)
        record = decode_control(line)
        if record is None:
            rank = _rank_of(line)
            if rank is not None:
                self.tails[rank].append(line)
                timed_out = GLOO_TIMEOUT.search(line)
                if timed_out:
                    self.gloo_timeouts[rank] = timed_out.group(0)
                self._unhealthy_tasks(rank, line)
            if self.verbosity == "all":
                print(line, file=self.out, flush=True)
            return
        record["received"] = time.time()
        self.records.append(record)
        if record["kind"] == "start":
            self.hosts[record["rank"]] = str(record.get("host") or "")
        if record["kind"] == "log":
            print(f"[{record['rank']}] {record['message']}", file=self.out, flush=True)

    def _unhealthy_tasks(self, rank: int, line: str) -> None:
        if TF_UNHEALTHY in line:
            self._listing.add(rank)
            return
        if rank in self._listing:
            task = _TF_TASK.match(_PREFIX.sub("", line))
            if task is None:
                self._listing.discard(rank)
            else:
                self.unhealthy.setdefault(rank, set()).add(int(task.group(1)))

    def first(self, kind: str, prefer: Callable[[dict], bool] = lambda r: True) -> dict | None:
        """The earliest record of a kind, preferring those ``prefer`` accepts."""
        with self._lock:
            found = [r for r in self.records if r["kind"] == kind]
        preferred = [r for r in found if prefer(r)]
        return (preferred or found or [None])[0]

    def stream(self) -> "_SinkStream":
        """A file-like object that feeds this sink (for Horovod's ``stdout=``)."""
        return _SinkStream(self)


class _SinkStream:
    def __init__(self, sink: DriverSink):
        self._sink = sink

    def write(self, text) -> int:
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        self._sink.feed(text)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        # Horovod closes the stream of each rank when its command ends; the
        # sink lives on for the other ranks.
        pass


def _rank_of(line: str) -> int | None:
    if line.startswith("[") and "]" in line:
        head = line[1:line.index("]")]
        if head.isdigit():
            return int(head)
    return None
