"""The output of a Spark task's workers on its way to the driver: the
driver's `OutputServer` (a TCP server at ``spark.driver.host``,
authenticated by a random token per job, that feeds the
`DriverSink`) and each task's
`DriverChannel` to it, so output arrives rank-prefixed and live, as
with the other backends. Each rank may connect once per job: a retried
barrier stage is told not to run again.
"""
from __future__ import annotations

import hmac
import secrets
import socket
import threading
from typing import Callable

from dist_dl.launch.core import protocol
from dist_dl.launch.core.protocol import DriverSink

__all__ = ["OutputServer", "DriverChannel"]


class OutputServer:
    """The driver's end of the tasks' output: a TCP server that accepts
    connections presenting the job's token and feeds their lines to ``sink``.

    A task sends ``exit`` control records when its worker ends; the first
    non-zero one is kept as ``first_failed`` and reported to ``on_failure``
    (which cancels the Spark job, so that Spark does not retry the barrier
    stage with the surviving ranks waiting on a dead peer).
    """

    def __init__(self, host: str, sink: DriverSink, on_failure: Callable[[], None]):
        self.token = secrets.token_hex(16)
        self.first_failed: tuple[int, int] | None = None
        self._sink = sink
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._server = socket.create_server((host, 0))
        self.address = (host, self._server.getsockname()[1])
        self._closed = False
        self._started: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True,
                                          name="dist_dl-output-server")
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                      name="dist_dl-output")
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            conn.settimeout(30)  # for the token line only
            try:
                presented = stream.readline().strip()
            except OSError:
                return
            if not hmac.compare_digest(presented, self.token.encode()):
                return
            # Each rank runs once per job: Spark resubmits a failed barrier
            # stage (a lost executor ends a task without an exit record), and
            # a half-run training job must not start again on its own.
            try:
                rank = int(stream.readline())
            except (OSError, ValueError):
                return
            with self._lock:
                again = rank in self._started
                self._started.add(rank)
            conn.sendall(b"no\n" if again else b"go\n")
            conn.settimeout(None)
            for raw in stream:
                line = raw.decode(errors="replace")
                record = protocol.decode_control(line)
                if record is not None and record.get("kind") == "exit" and record.get("code"):
                    with self._lock:
                        first = self.first_failed is None
                        if first:
                            self.first_failed = (record["rank"], record["code"])
                    if first:
                        self._on_failure()
                self._sink.feed(line)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # Wakes the accepting thread (close alone leaves it blocked in accept).
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        self._accepter.join(5)
        for thread in self._threads:
            thread.join(5)


class DriverChannel:
    """A task's connection to the driver's output server: whole lines, from
    several threads."""

    def __init__(self, address: tuple[str, int], token: str, rank: int):
        try:
            self._sock = socket.create_connection(address, timeout=30)
        except OSError as exc:
            raise ConnectionError(
                f"this Spark task cannot reach the driver's output server at "
                f"{address[0]}:{address[1]} ({exc}); executors must be able to connect to "
                "spark.driver.host on any port (check firewalls, and that spark.driver.host is "
                "the driver's cluster address)") from exc
        self._lock = threading.Lock()
        self.send(f"{token}\n{rank}\n")
        with self._sock.makefile("rb") as reply:
            self.go = reply.readline().strip() == b"go"
        self._sock.settimeout(None)

    def send(self, line: str) -> None:
        with self._lock:
            try:
                self._sock.sendall(line.encode())
            except OSError:
                pass  # the driver went away; the job is over

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._sock.close()
