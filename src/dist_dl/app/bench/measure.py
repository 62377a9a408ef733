"""What the benchmark records beside throughput: memory peaks and where each
worker's CPU went (`CpuSampler`), and the time of each training step
(`StepRecorder`)."""
from __future__ import annotations

import json
import os
import statistics

from dist_dl.core import compat

__all__ = ["MemoryPeaks", "CpuSampler", "thread_split", "StepRecorder", "rates_from_recorders",
           "machine_busy_seconds"]


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (``/proc/stat``:
    every state but idle and I/O wait)."""
    with open("/proc/stat") as f:
        fields = [float(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


class _Sampler:
    """A background thread that calls `_sample()` every ``interval``
    seconds (and once at the start) while the ``with`` block runs."""

    def __init__(self, interval: float, name: str):
        import threading

        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class MemoryPeaks(_Sampler):
    """Peak resident memory of this process's descendants (on Spark the JVM
    and its Python workers), read through psutil every ``interval`` seconds
    by a background thread while the ``with`` block runs.

    Attributes:
        peaks: ``{pid: (command, peak RSS in bytes)}``.
        peak_total: Largest sum, over one sample, of the RSS of the
            processes `kind()` puts in each kind: ``{kind: bytes}``.
    """

    def __init__(self, interval: float = 0.2):
        super().__init__(interval, "dist_dl-memory-sampler")
        self.peaks: dict[int, tuple[str, int]] = {}
        self.peak_total: dict[str, int] = {}

    @staticmethod
    def kind(command: str) -> str:
        """``"jvm"``, ``"python_worker"`` (PySpark's daemon and workers) or ``"other"``."""
        if "pyspark.daemon" in command or "pyspark.worker" in command:
            return "python_worker"
        if command.split(" ", 1)[0].endswith("java"):
            return "jvm"
        return "other"

    def _sample(self) -> None:
        import psutil

        totals: dict[str, int] = {}
        for proc in psutil.Process().children(recursive=True):
            try:
                command = " ".join(proc.cmdline()[:4])
                rss = proc.memory_info().rss
            except psutil.Error:  # ended between listing and reading
                continue
            previous = self.peaks.get(proc.pid, (command, 0))[1]
            self.peaks[proc.pid] = (command, max(previous, rss))
            kind = self.kind(command)
            totals[kind] = totals.get(kind, 0) + rss
        for kind, total in totals.items():
            self.peak_total[kind] = max(self.peak_total.get(kind, 0), total)

    def peak(self, kind: str) -> int:
        """Largest peak of one process of ``kind`` (0 if none was seen)."""
        return max((rss for command, rss in self.peaks.values() if self.kind(command) == kind),
                   default=0)


class CpuSampler(_Sampler):
    """CPU time of every thread of this process's descendants (the workers,
    and on Spark the JVM and its Python workers), read through psutil every
    ``interval`` seconds by a background thread while the ``with`` block runs.

    `window()` turns two samples into CPU seconds per wall second, per
    process and thread, on the ``time.perf_counter`` clock (the clock of
    ``StepTimes``: on Linux one monotonic clock for every process).
    """

    def __init__(self, interval: float = 1.0):
        super().__init__(interval, "dist_dl-cpu-sampler")
        # (when the snapshot began, when it ended, the snapshot): reading every
        # descendant's threads takes a while on a loaded machine, and a process
        # may end within it, so a sample belongs to a window only whole.
        self.samples: list[tuple[float, float, dict]] = []

    @staticmethod
    def _snapshot() -> dict:
        """{pid: (command, {tid: (user, system)})} of all descendants now."""
        import psutil

        out = {}
        for proc in psutil.Process().children(recursive=True):
            try:
                name = " ".join(proc.cmdline()[:3])
                out[proc.pid] = (name, {t.id: (t.user_time, t.system_time)
                                        for t in proc.threads()})
            except psutil.Error:  # ended between listing and reading
                continue
        return out

    def _sample(self) -> None:
        import time

        began = time.perf_counter()
        snapshot = self._snapshot()
        self.samples.append((began, time.perf_counter(), snapshot))

    def _inside(self, start: float, end: float) -> list:
        """(the snapshot's middle, the snapshot) of each sample taken wholly
        inside ``[start, end]``."""
        return [((began + ended) / 2, snap) for began, ended, snap in self.samples
                if start <= began and ended <= end]

    def span(self, start: float, end: float) -> float:
        """Seconds that `window()` covers (0.0 when it gives None)."""
        inside = self._inside(start, end)
        return inside[-1][0] - inside[0][0] if len(inside) >= 2 else 0.0

    def window(self, start: float, end: float) -> dict | None:
        """CPU s/s between the first and last samples taken wholly inside
        ``[start, end]``: ``{pid: {"command": str, "threads": {tid: (user,
        system)}}}`` for threads alive at the last (one started after the
        first counts all its CPU time; one ended before the last is missed);
        None with fewer than two samples inside (a window shorter than
        ``interval``)."""
        inside = self._inside(start, end)
        if len(inside) < 2:
            return None
        (t0, first), (t1, last) = inside[0], inside[-1]
        seconds = t1 - t0
        out = {}
        for pid, (command, threads) in last.items():
            before = first.get(pid, (None, {}))[1]
            out[pid] = {"command": command, "threads": {
                tid: ((u - before.get(tid, (0.0, 0.0))[0]) / seconds,
                      (s - before.get(tid, (0.0, 0.0))[1]) / seconds)
                for tid, (u, s) in threads.items()}}
        return out


def thread_split(window: dict | None, processes: int) -> dict | None:
    """Where the CPU of the ``processes`` busiest processes of a
    `CpuSampler.window()` went: ``{"main": ..., "other_user": ...,
    "other_sys": ...}``, medians over those processes of the busiest thread's
    CPU s/s (in a training worker with one TensorFlow thread: the compute) and
    of all its other threads' user and system CPU s/s (input pipeline; with
    Horovod also the background thread and Gloo's socket loop)."""
    if not window:
        return None
    busiest = sorted(window.values(), key=lambda p: -sum(u + s for u, s in p["threads"].values()))
    main, other_user, other_sys = [], [], []
    for proc in busiest[:processes]:
        threads = sorted(proc["threads"].values(), key=lambda us: -(us[0] + us[1]))
        if not threads:
            continue
        main.append(sum(threads[0]))
        other_user.append(sum(u for u, _ in threads[1:]))
        other_sys.append(sum(s for _, s in threads[1:]))
    if not main:
        return None
    return {"main": statistics.median(main), "other_user": statistics.median(other_user),
            "other_sys": statistics.median(other_sys)}


class StepRecorder:
    """Callbacks factory (runs in each worker): writes the training steps'
    ends (wall and CPU clocks) to ``<prefix>-rank<r>.json`` when training ends."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self) -> list:
        keras = compat.keras()

        from dist_dl.train.timing import StepTimes

        prefix = self.prefix

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times = StepTimes()

            def on_train_batch_end(self, batch, logs=None):
                self.times.record()

            def on_train_end(self, logs=None):
                from dist_dl.core.placement import process_rank

                rank = process_rank()  # Horovod's, or the index in TF_CONFIG
                with open(f"{prefix}-rank{rank}.json", "w") as f:
                    json.dump(self.times.to_dict(), f)

        return [Recorder()]


def rates_from_recorders(prefix: str, ranks: int, images_per_step: int, warmup: int, together: bool):
    """(images/s, CPU s per wall s of rank 0, (start, end) of rank 0's timed
    steps on the perf_counter clock) from the recorders' files.

    ``together``: one synchronous job (every rank's step is a global step, so
    rank 0's clock times ``images_per_step`` of all ranks); otherwise
    independent processes, whose rates add up.
    """
    from dist_dl.train.timing import StepTimes

    rates, cpus, window = [], [], None
    for rank in range(ranks):
        with open(f"{prefix}-rank{rank}.json") as f:
            raw = json.load(f)
        times = StepTimes()
        times.wall, times.cpu = raw["wall"], raw["cpu"]
        rates.append(times.rate(images_per_step, skip=warmup))
        cpus.append(times.cpu_per_second(skip=warmup))
        if window is None and len(times.wall) > warmup:
            window = (times.wall[warmup - 1], times.wall[-1])
        if together:
            break
    if any(r is None for r in rates):
        raise RuntimeError(f"{prefix}: too few steps were timed; raise bench.steps")
    return sum(rates), cpus[0], window
