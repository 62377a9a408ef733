"""A Spark job that cannot make progress becomes an error, not a hang.

Driver side. When executors cannot start or keep dying (they cannot reach the
driver's address, the worker's Python is broken, memory is short), Spark
keeps asking the cluster manager for new ones and the job waits for ever with
nothing on the screen. `StallWatch` polls the job group's progress and
the executors; when the group has had a job running, no task running or
finished, and no executor alive (or executors lost) for ``timeout`` seconds,
it cancels the group and records what Spark reported: the exit messages of
the lost executors and the driver address they were given.

The timeout is the Spark setting ``spark.dist_dl.stallTimeout`` (seconds,
default 180; 0 turns the watch off), set on the cluster or the session.
"""
from __future__ import annotations

import threading
import time

from dist_dl.core.sparkconf import conf_value

__all__ = ["StallWatch", "SparkStalled", "stall_timeout", "STALL_TIMEOUT_KEY"]

STALL_TIMEOUT_KEY = "spark.dist_dl.stallTimeout"
_DEFAULT_TIMEOUT = 180.0
# Where Spark says that executors were removed or lost. The standalone
# backend logs an executor's end at INFO ("Executor app-.../3 removed:
# Command exited with code 1"), below the level the library's sessions log
# at; the task scheduler logs lost executors at ERROR.
_REPORTERS = ("org.apache.spark.scheduler.cluster.StandaloneSchedulerBackend",
              "org.apache.spark.scheduler.TaskSchedulerImpl")
_CAPTURE = "dist_dl-executor-reports"


class SparkStalled(RuntimeError):
    """A Spark job of the library made no progress because no executor could
    run its tasks."""


def stall_timeout(sc) -> float:
    """The session's ``spark.dist_dl.stallTimeout`` in seconds (0: off).

    Raises:
        ValueError: the setting is not a number >= 0.
    """
    raw = conf_value(sc, STALL_TIMEOUT_KEY, str(_DEFAULT_TIMEOUT))
    try:
        value = float(str(raw).rstrip("s"))
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{STALL_TIMEOUT_KEY} must be a number of seconds >= 0 (0 turns the "
                         f"stall check off), got {raw!r}")
    return value


class _Reports:
    """Spark's own lines about removed and lost executors, captured in the
    driver JVM (log4j 2's WriterAppender into a StringWriter), so the error
    can quote them. Best effort: None where log4j 2 is not Spark's logger."""

    _lock = threading.Lock()
    _writers: dict = {}

    @classmethod
    def writer(cls, sc):
        key = id(sc._jsc)
        with cls._lock:
            if key in cls._writers:
                return cls._writers[key]
            writer = None
            try:
                writer = cls._install(sc._jvm)
            except Exception:  # noqa: BLE001 - diagnostics only; the watch works without
                writer = None
            cls._writers[key] = writer
            return writer

    @staticmethod
    def _install(jvm):
        core = jvm.org.apache.logging.log4j.core
        context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
        config = context.getConfiguration()
        existing = config.getAppenders().get(_CAPTURE)
        if existing is not None:
            return None  # another SparkContext of this JVM captured first
        writer = jvm.java.io.StringWriter()
        layout = core.layout.PatternLayout.newBuilder().withPattern("%m%n").build()
        appender = (core.appender.WriterAppender.newBuilder().setName(_CAPTURE)
                    .setTarget(writer).setLayout(layout).build())
        appender.start()
        config.addAppender(appender)
        info = jvm.org.apache.logging.log4j.Level.INFO
        error = jvm.org.apache.logging.log4j.Level.ERROR
        console = list(config.getRootLogger().getAppenders().values())
        for name in _REPORTERS:
            if config.getLoggerConfig(name).getName() == name:
                continue  # configured by the user: left as it is
            # Not additive, so INFO lines go to the capture only; the
            # console keeps getting this logger's errors as before.
            logger = core.config.LoggerConfig(name, info, False)
            logger.addAppender(appender, info, None)
            for app in console:
                logger.addAppender(app, error, None)
            config.addLogger(name, logger)
        context.updateLoggers()
        return writer


def executor_reports(sc) -> list[str]:
    """Spark's lines so far about executors removed or lost, oldest first."""
    writer = _Reports.writer(sc)
    if writer is None:
        return []
    lines = str(writer.toString()).splitlines()
    return [line for line in lines
            if " removed: " in line or line.startswith("Lost executor")]


def live_executors(sc) -> list[str]:
    """host:port of the executors registered now (the driver left out)."""
    driver = conf_value(sc, "spark.driver.host", "")
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    out = [f"{info.host()}:{info.port()}" for info in infos]
    # The driver is listed first (its own block manager).
    return out[1:] if out and out[0].startswith(driver) else out


class StallWatch:
    """Watches one job group from a daemon thread; see the module's text.

    Args:
        sc: The SparkContext.
        group: The job group to watch.
        description: What the jobs do, for the message.
        timeout: Seconds without progress before the group is cancelled
            (default: `stall_timeout()`).
        poll: Seconds between looks.
    """

    def __init__(self, sc, group: str, description: str, timeout: float | None = None,
                 poll: float = 2.0):
        self.sc = sc
        self.group = group
        self.description = description
        self.timeout = stall_timeout(sc) if timeout is None else timeout
        if sc.master.startswith("local"):
            self.timeout = 0.0  # one process: no executor to lose
        self.poll = poll
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dist_dl-stall-{group}",
                                        daemon=True)
        self._reports_before = 0

    @property
    def stalled(self) -> bool:
        return self.message is not None

    def __enter__(self) -> "StallWatch":
        if self.timeout > 0:
            self._reports_before = len(executor_reports(self.sc))
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _progress(self) -> tuple[int, int, bool]:
        """(tasks finished, tasks running, a job of the group is running)."""
        tracker = self.sc.statusTracker()
        done = running = 0
        any_running = False
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None or job.status != "RUNNING":
                continue
            any_running = True
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks + stage.numFailedTasks
                    running += stage.numActiveTasks
        return done, running, any_running

    def _run(self) -> None:
        last_done, since = -1, time.monotonic()
        while not self._stop.wait(self.poll):
            try:
                done, running, waiting = self._progress()
                if running or done != last_done or not waiting:
                    last_done, since = done, time.monotonic()
                    continue
                if time.monotonic() - since < self.timeout:
                    continue
                alive = live_executors(self.sc)
                lost = executor_reports(self.sc)[self._reports_before:]
                if alive and not lost:
                    continue  # executors are there, busy with other jobs: waiting is fine
                self.message = (f"{self.description}: no task ran or finished for "
                                f"{self.timeout:g} s ({STALL_TIMEOUT_KEY}), so its Spark jobs "
                                f"were cancelled. " + self.describe(alive, lost))
                self.sc.cancelJobGroup(self.group)
                return
            except Exception:  # noqa: BLE001 - the context went away under us
                if self._stop.is_set():
                    return
                raise

    def describe(self, alive: list[str] | None = None, lost: list[str] | None = None) -> str:
        """What Spark reports now about the executors, and what to check."""
        alive = live_executors(self.sc) if alive is None else alive
        lost = executor_reports(self.sc)[self._reports_before:] if lost is None else lost
        driver = (f"{conf_value(self.sc, 'spark.driver.host', '?')}:"
                  f"{conf_value(self.sc, 'spark.driver.port', '?')}")
        if lost:
            shown = "\n".join(f"  {line}" for line in lost[-5:])
            state = (f"{len(lost)} executor(s) were removed or lost, the last ones:\n{shown}\n"
                     f"{len(alive)} executor(s) are registered now.")
        else:
            state = f"{len(alive)} executor(s) are registered with the driver."
        return (
            f"On master {self.sc.master}, {state}\nThe executors were told to reach the driver "
            f"at {driver} (spark.driver.host:spark.driver.port). Executors that cannot reach "
            "that address exit at start: set spark.driver.host to an address of this machine "
            "the worker hosts can reach (dist_dl picks the interface that routes to the "
            "master), check the executors' stderr on the worker hosts, or raise "
            f"{STALL_TIMEOUT_KEY} if executors are only slow to start.")
