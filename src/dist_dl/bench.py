"""Throughput and scaling of data-parallel training, measured side by side.

Driver side (``dist-dl bench``, ``benchmarks/train.py``, the benchmark
notebook). Every setup trains the same model on the same synthetic shards
through the same reader, and times the same training steps (after
``warmup_steps``) with the same callback, so the ratios compare like with like:

- ``plain_1``: plain Keras ``model.fit`` in one process (no Horovod, no
  callbacks of ours), ``threads_per_worker`` threads;
- ``dist_1``: ``train_distributed`` with one worker, the same threads:
  ``dist_1 / plain_1`` is the library's overhead;
- ``ceiling``: ``workers`` independent plain processes, each pinned to its
  own cores: what the machine can do at all (no communication);
- ``dist``: ``train_distributed`` with ``workers`` workers and the library's
  defaults: ``dist / ceiling`` is the scaling efficiency;
- any ``variants``: ``dist`` with some settings changed (the levers).

The setups run interleaved, in a rotated order each round, and the report
gives medians and ranges of the per-round ratios: on a shared machine the
same process can run at half speed minutes later.

Beside throughput, each run records where its workers' CPU went over the
timed steps (:class:`CpuSampler`): the busiest thread of each worker (with
one TensorFlow thread per worker, the compute) against all its other threads
(input pipeline; in the distributed setups also Horovod's background thread
and Gloo's socket loop, whose time is mostly system time on loopback).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import tempfile
from typing import Callable

from dist_dl import compat
from dist_dl.config import BenchConfig
from dist_dl.locations import file_url
from dist_dl.train.config import TrainConfig

__all__ = ["run_benchmark", "StepRecorder", "CpuSampler", "thread_split"]


class CpuSampler:
    """CPU time of every thread of this process's descendants (the workers,
    and on Spark the JVM and its Python workers), read through psutil every
    ``interval`` seconds by a background thread while the ``with`` block runs.

    :meth:`window` turns two samples into CPU seconds per wall second, per
    process and thread, on the ``time.perf_counter`` clock (the clock of
    ``StepTimes``: on Linux one monotonic clock for every process).
    """

    def __init__(self, interval: float = 1.0):
        import threading

        self.interval = interval
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dist_dl-cpu-sampler",
                                        daemon=True)

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

    def _run(self) -> None:
        import time

        while True:
            self.samples.append((time.perf_counter(), self._snapshot()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _inside(self, start: float, end: float) -> list:
        return [(t, snap) for t, snap in self.samples if start <= t <= end]

    def span(self, start: float, end: float) -> float:
        """Seconds that :meth:`window` covers (0.0 when it gives None)."""
        inside = self._inside(start, end)
        return inside[-1][0] - inside[0][0] if len(inside) >= 2 else 0.0

    def window(self, start: float, end: float) -> dict | None:
        """CPU s/s between the first and last samples taken inside
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
    :meth:`CpuSampler.window` went: ``{"main": ..., "other_user": ...,
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
                rank = int(os.environ.get("HOROVOD_RANK", "0"))
                with open(f"{prefix}-rank{rank}.json", "w") as f:
                    json.dump(self.times.to_dict(), f)

        return [Recorder()]


def _plain_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder) -> None:
    """One independent process: the worker's model, optimizer, loss and
    reader, without Horovod."""
    keras = compat.keras()

    from dist_dl.read import ReaderConfig, make_dataset
    from dist_dl.train.models import build_model

    keras.utils.set_random_seed(config.seed)
    reader = ReaderConfig(image_size=config.image_size, flip=config.flip,
                          area_range=(config.min_crop_area, 1.0),
                          shuffle_buffer=config.shuffle_buffer,
                          reader_threads=config.reader_threads)
    data = make_dataset(files, 0, 1, config.batch_size, training=config.augment,
                        shuffle=config.shuffle, config=reader, with_weights=True)
    model = build_model(config.model, (config.image_size, config.image_size, 3), 10)
    model.compile(keras.optimizers.SGD(config.learning_rate, momentum=config.momentum),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=recorder(), verbose=0)


def _measure(prefix: str, ranks: int, images_per_step: int, warmup: int, together: bool):
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


def run_benchmark(cfg: BenchConfig, *, spark=None, variants: dict | None = None,
                  workdir: str | None = None, out: Callable[[str], None] = print) -> dict:
    """Run the setups of the module docstring, ``cfg.rounds`` times interleaved.

    Args:
        cfg: The benchmark's settings.
        spark: Only for variants with ``backend="spark"``.
        variants: Name -> ``TrainConfig`` fields changed from the ``dist`` setup.
        workdir: Scratch folder (default: a temporary one, removed afterwards).
        out: Where progress and the report go.

    Returns:
        ``{"setups": {name: {"images_per_second": [...], "cpu_per_second":
        [...], "threads": [thread_split(...) or None, ...]}}, "ratios":
        {"overhead": [...], "scaling": [...], <variant>: [...]}, "summary":
        {ratio: {"median", "min", "max"}}, "config": ...}``;
        also written to ``cfg.output`` as JSON when set.
    """
    from dist_dl.launch import HorovodRunner
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.read.resolve import resolve_files
    from dist_dl.train import train_distributed

    variants = dict(variants or {})
    scratch = workdir or tempfile.mkdtemp(prefix="dist_dl-bench-")
    steps = cfg.warmup_steps + cfg.steps
    try:
        shards = os.path.join(scratch, "shards")
        rows = steps * cfg.batch_size * max(2, cfg.workers)
        if not os.path.exists(shards):
            make_synthetic_images(shards, rows=rows, image_size=cfg.image_size, classes=10,
                                  rows_per_row_group=cfg.batch_size)
        files = resolve_files(shards)
        base = TrainConfig(model=cfg.model, image_size=cfg.image_size, batch_size=cfg.batch_size,
                           epochs=1, max_steps_per_epoch=steps, warmup_epochs=0,
                           lr_schedule="constant", validation_fraction=0.0,
                           fp16_allreduce=cfg.fp16_allreduce, backend="local",
                           output_dir=os.path.join(scratch, "runs"), keep_checkpoints=1)
        tracking = file_url(os.path.join(scratch, "mlruns"))
        single = dataclasses.replace(base, num_workers=1, threads_per_worker=cfg.threads_per_worker)
        scaled = dataclasses.replace(base, num_workers=cfg.workers)
        counter = iter(range(10 ** 6))

        def plain(config: TrainConfig, ranks: int, pin: bool):
            def run():
                prefix = os.path.join(scratch, f"t{next(counter)}")
                with CpuSampler() as sampler:
                    runner = HorovodRunner(np=-ranks, threads_per_worker=config.threads_per_worker,
                                           pin_cpus=pin, driver_log_verbosity="log_callback_only")
                    runner.run(_plain_fit, files=files, config=config, steps=steps,
                               recorder=StepRecorder(prefix))
                return _measure(prefix, ranks, config.batch_size, cfg.warmup_steps,
                                False) + (sampler, ranks)
            return run

        def distributed(config: TrainConfig):
            def run():
                prefix = os.path.join(scratch, f"t{next(counter)}")
                with CpuSampler() as sampler:
                    train_distributed(shards, config=config, tracking_uri=tracking,
                                      callbacks=StepRecorder(prefix), spark=spark)
                return _measure(prefix, config.num_workers,
                                config.batch_size * config.num_workers, cfg.warmup_steps,
                                True) + (sampler, config.num_workers)
            return run

        setups = {"plain_1": plain(single, 1, False), "dist_1": distributed(single),
                  "ceiling": plain(dataclasses.replace(
                      scaled, threads_per_worker=cfg.threads_per_worker), cfg.workers, True),
                  "dist": distributed(scaled)}
        for name, changes in variants.items():
            setups[name] = distributed(dataclasses.replace(scaled, **changes))
        results = {name: {"images_per_second": [], "cpu_per_second": [], "threads": []}
                   for name in setups}
        names = list(setups)
        for round_index in range(cfg.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                rate, cpu, window, sampler, ranks = setups[name]()
                split = thread_split(sampler.window(*window) if window else None, ranks)
                results[name]["images_per_second"].append(rate)
                results[name]["cpu_per_second"].append(cpu)
                results[name]["threads"].append(split)
                threads = ("" if split is None else
                           f"; per worker: main thread {split['main']:.2f}, others "
                           f"{split['other_user']:.2f} user + {split['other_sys']:.2f} system")
                out(f"round {round_index + 1}/{cfg.rounds} {name:>12s}: {rate:8.1f} images/s, "
                    f"{cpu if cpu is not None else float('nan'):.2f} CPU s/s (rank 0){threads}")
        report = _report(results, variants, cfg)
        for line in _table(report):
            out(line)
        if cfg.output:
            with open(cfg.output, "w") as f:
                json.dump(report, f, indent=1)
        return report
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _report(results: dict, variants: dict, cfg: BenchConfig) -> dict:
    def per_round(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(results[a]["images_per_second"],
                                      results[b]["images_per_second"])]

    ratios = {"overhead": per_round("dist_1", "plain_1"), "scaling": per_round("dist", "ceiling")}
    for name in variants:
        ratios[name] = per_round(name, "ceiling")
    summary = {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for name, v in ratios.items()}
    return {"setups": results, "ratios": ratios, "summary": summary,
            "variants": variants, "config": dataclasses.asdict(cfg)}


def _table(report: dict) -> list[str]:
    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    lines = ["", f"{'setup':>12s}  images/s median (min-max)   CPU s/s median   "
                 "per worker: main thread, other threads user + system"]
    for name, values in report["setups"].items():
        rates = values["images_per_second"]
        splits = [s for s in values.get("threads", []) if s]
        lines.append(f"{name:>12s}  {statistics.median(rates):8.1f} ({min(rates):.1f}-"
                     f"{max(rates):.1f})   {median(values['cpu_per_second']):14.2f}   "
                     f"{median(s['main'] for s in splits):.2f}, "
                     f"{median(s['other_user'] for s in splits):.2f} + "
                     f"{median(s['other_sys'] for s in splits):.2f}")
    lines.append("")
    labels = {"overhead": "dist_1 / plain_1", "scaling": "dist / ceiling"}
    for name, s in report["summary"].items():
        lines.append(f"{labels.get(name, name + ' / ceiling'):>24s}: median {s['median']:.3f} "
                     f"({s['min']:.3f}-{s['max']:.3f})")
    return lines
