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
- ``peer``: what a user would otherwise write, side by side: Horovod's own
  Keras recipe as its documentation writes it (``hvd.init()``, the learning
  rate scaled by ``hvd.size()``, ``hvd.DistributedOptimizer``,
  ``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback``, one GPU
  per local rank), with ``tf.data`` batches of the same shards, launched with
  ``horovod.spark.run`` on the same Spark session: ``dist / peer`` is the
  library against the plain recipe (``cfg.peer``);
- ``reader_alone``: the same reader on one worker's shard, nothing else
  (``cfg.reader_check``): ``reader_alone / (dist / workers)`` says whether
  reading and decoding keep up with training (:func:`input_verdict`);
- any ``variants``: ``dist`` with some settings changed (the levers);
- ``tf_peer``, when a variant trains with ``engine="tensorflow"``
  (tf.distribute's MultiWorkerMirroredStrategy): TensorFlow's own
  multi-worker Keras recipe (strategy first, model and optimizer compiled
  under ``strategy.scope()``, the learning rate scaled by the number of
  workers, each worker's batches through
  ``distribute_datasets_from_function``) on the same shards, launched as
  local processes with ``TF_CONFIG`` set (``TFDistributeRunner(np=-workers)``:
  the recipe has no launcher of its own). ``<variant> / tf_peer`` is that
  engine against its plain recipe, and ``<variant> / dist`` engine against
  engine.

The setups run interleaved, in a rotated order each round, and the report
gives medians and ranges of the per-round ratios: on a shared machine the
same process can run at half speed minutes later.

Beside throughput, each run records where its workers' CPU went over the
timed steps (:class:`CpuSampler`): the busiest thread of each worker (with
one TensorFlow thread per worker, the compute) against all its other threads
(input pipeline; in the distributed setups also Horovod's background thread
and Gloo's socket loop, whose time is mostly system time on loopback).

The report also gives images/s per device (per GPU on a GPU machine, per
worker on CPU), in the terms of Horovod's synthetic benchmark, so that
figures compare with published ones. With ``cfg.results`` set, the headline
ratios go into a shared results file (:func:`publish_results`): merged into
``benchmarks/results.json`` (or wherever it points), drawn as a PNG beside
it, and logged with it to MLflow.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import tempfile
from typing import Callable

from dist_dl.core import compat
from dist_dl.app.config import BenchConfig
from dist_dl.core.locations import file_url
from dist_dl.train.config import TrainConfig

__all__ = ["run_benchmark", "StepRecorder", "CpuSampler", "MemoryPeaks", "thread_split", "input_verdict",
           "result_entry", "merge_results", "plot_results", "publish_results", "GOALS"]


class _Sampler:
    """A background thread that calls :meth:`_sample` every ``interval``
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
            processes :meth:`kind` puts in each kind: ``{kind: bytes}``.
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

    :meth:`window` turns two samples into CPU seconds per wall second, per
    process and thread, on the ``time.perf_counter`` clock (the clock of
    ``StepTimes``: on Linux one monotonic clock for every process).
    """

    def __init__(self, interval: float = 1.0):
        super().__init__(interval, "dist_dl-cpu-sampler")
        self.samples: list[tuple[float, dict]] = []

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

        self.samples.append((time.perf_counter(), self._snapshot()))

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
                from dist_dl.core.placement import process_rank

                rank = process_rank()  # Horovod's, or the index in TF_CONFIG
                with open(f"{prefix}-rank{rank}.json", "w") as f:
                    json.dump(self.times.to_dict(), f)

        return [Recorder()]


def _reader_config(config: TrainConfig):
    """The reader settings a training worker of ``config`` uses."""
    from dist_dl.read import ReaderConfig

    return ReaderConfig(image_size=config.image_size, flip=config.flip,
                        area_range=(config.min_crop_area, 1.0),
                        shuffle_buffer=config.shuffle_buffer,
                        reader_threads=config.reader_threads)


def _batches(files: list, config: TrainConfig, rank: int, size: int):
    """Shard ``rank`` of ``size``, batched as a training worker reads it."""
    from dist_dl.read import make_dataset

    return make_dataset(files, rank, size, config.batch_size, training=config.augment,
                        shuffle=config.shuffle, config=_reader_config(config), with_weights=True)


def _compiled(tf, config: TrainConfig, learning_rate: float, gpus: list, wrap=None):
    """The worker's model (float32 logits under mixed precision, as the
    library builds it), compiled with SGD at ``learning_rate``; ``wrap``
    turns the optimizer into a distributed one."""
    from dist_dl.train.models import build_model

    keras = compat.keras()
    mixed = config.mixed_precision == "on" or (config.mixed_precision == "auto" and bool(gpus))
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    model = build_model(config.model, (config.image_size, config.image_size, 3), 10)
    if mixed:
        logits = keras.layers.Activation("linear", dtype="float32")(model.outputs[0])
        model = keras.Model(model.inputs, logits)
    optimizer = keras.optimizers.SGD(learning_rate, momentum=config.momentum)
    if wrap is not None:
        optimizer = wrap(optimizer)
    if mixed:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    return model


def _plain_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder) -> None:
    """One independent process: the worker's model, optimizer, loss and
    reader, without Horovod (the launcher shows it one GPU, if any)."""
    import tensorflow as tf

    keras = compat.keras()
    keras.utils.set_random_seed(config.seed)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    model = _compiled(tf, config, config.learning_rate, gpus)
    model.fit(_batches(files, config, 0, 1), epochs=1, steps_per_epoch=steps,
              callbacks=recorder(), verbose=0)


def _peer_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder,
              threads: int) -> dict:
    """The peer: Horovod's Keras recipe as Horovod's documentation writes it,
    run in each Spark task by ``horovod.spark.run``. Only the model, the
    shards, the batch and the thread count are the library's, so that both
    sides do the same work on the same cores."""
    # Horovod 0.28's Keras integration needs Keras 2 (horovod#4290): where
    # Keras 3 is the default (TensorFlow 2.16, runtime 15.4), the task starts
    # with TF_USE_LEGACY_KERAS=1 (the env given to horovod.spark.run) and
    # Horovod's Keras modules get Keras 2's backend, as a user of that runtime
    # must do too; a no-op on TensorFlow lines with Keras 2.
    compat.patch_horovod_keras()
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    # The library's workers get these threads from their launcher (see
    # launch.device.plan_devices); set here so the compute is the same.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    hvd.init()
    # The recipe: one GPU per process, chosen by local rank.
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        gpus = [gpus[hvd.local_rank() % len(gpus)]]
        tf.config.set_visible_devices(gpus, "GPU")
    keras = compat.keras()
    keras.utils.set_random_seed(config.seed + hvd.rank())
    # The recipe: learning rate scaled by the number of workers, the
    # optimizer wrapped, initial weights broadcast from rank 0, metrics averaged.
    model = _compiled(tf, config, config.learning_rate * hvd.size(), gpus,
                      wrap=hvd.DistributedOptimizer)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()] + recorder()
    # verbose=0 where the recipe prints a progress bar on rank 0: printing is
    # not what is compared (the library's workers print none per step either).
    model.fit(_batches(files, config, hvd.rank(), hvd.size()), epochs=1, steps_per_epoch=steps,
              callbacks=callbacks, verbose=0)
    return {"cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"), "nccl": bool(hvd.nccl_built()),
            "size": hvd.size()}


def _tf_peer_fit(files: list, config: TrainConfig, steps: int, recorder: StepRecorder) -> None:
    """The tf.distribute peer: TensorFlow's multi-worker Keras recipe, in
    each worker ``TFDistributeRunner`` started (its ``TF_CONFIG`` set). Only
    the model, the shards, the batch and the threads are the library's."""
    import tensorflow as tf

    from dist_dl.launch.tfdist import multi_worker_strategy

    # The recipe: the strategy first (its collectives: RING on CPU, NCCL on GPUs).
    strategy = multi_worker_strategy()
    rank = strategy.cluster_resolver.task_id
    size = strategy.num_replicas_in_sync
    keras = compat.keras()
    keras.utils.set_random_seed(config.seed + rank)
    gpus = tf.config.list_physical_devices("GPU")
    # The recipe: model and optimizer under the scope, the rate scaled by workers.
    with strategy.scope():
        model = _compiled(tf, config, config.learning_rate * size, gpus)
    data = strategy.distribute_datasets_from_function(
        lambda context: _batches(files, config, context.input_pipeline_id,
                                 context.num_input_pipelines))
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=recorder(), verbose=0)


def _reader_rate(files: list, config: TrainConfig, size: int, warmup: int, batches: int):
    """Images/s and CPU s per wall s of shard 0 of ``size`` read, decoded
    and batched as a training worker does, with no model: the input
    pipeline alone (runs in a launched worker, with a worker's threads)."""
    import time

    iterator = iter(_batches(files, config, 0, size))
    for _ in range(max(1, warmup)):
        next(iterator)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    wall = time.perf_counter() - wall0
    return batches * config.batch_size / wall, (time.process_time() - cpu0) / wall


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
                  workdir: str | None = None, out: Callable[[str], None] = print,
                  log_to_mlflow: bool = False, tracking_uri: str | None = None,
                  experiment: str | None = None, command: str | None = None) -> dict:
    """Run the setups of the module docstring, ``cfg.rounds`` times interleaved.

    Args:
        cfg: The benchmark's settings.
        spark: For the peer (``horovod.spark.run``) and variants with
            ``backend="spark"``; default the active session, else
            ``local[<workers>]`` when the peer runs.
        variants: Name -> ``TrainConfig`` fields changed from the ``dist`` setup.
        workdir: Scratch folder (default: a temporary one, removed afterwards).
        out: Where progress and the report go.
        log_to_mlflow: Log the results file and its PNG (``cfg.results``)
            as artifacts of an MLflow run, in ``experiment`` at ``tracking_uri``
            (default: MLflow's current one).
        command: The command line recorded with the results (default: this
            process's).

    Returns:
        ``{"setups": {name: {"images_per_second": [...], "cpu_per_second":
        [...], "threads": [thread_split(...) or None, ...]}}, "ratios":
        {"overhead": [...], "scaling": [...], <variant>: [...]}, "summary":
        {ratio: {"median", "min", "max"}}, "input": input_verdict(...) or
        None, "horovod": what the peer's workers ran with, "config": ...}``;
        also written to ``cfg.output`` as JSON when set, and its headline
        ratios merged into ``cfg.results`` (:func:`publish_results`).
    """
    from dist_dl.launch import HorovodRunner, TFDistributeRunner
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
                           mixed_precision=cfg.mixed_precision,
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

        # What each of the scaled setup's workers gets (launch.device.plan_devices).
        worker_threads = (scaled.threads_per_worker
                          or max(1, (os.cpu_count() or 1) // cfg.workers))
        peer_info: dict = {}

        def peer():
            import horovod.spark

            from dist_dl.launch.spark import cluster_nics

            prefix = os.path.join(scratch, f"t{next(counter)}")
            with CpuSampler() as sampler:
                ranks = horovod.spark.run(_peer_fit, args=(files, scaled, steps,
                                                           StepRecorder(prefix), worker_threads),
                                          num_proc=cfg.workers, verbose=0,
                                          env=dict(os.environ, **compat.worker_env()),
                                          # The interface the library's own Spark
                                          # backend gives Horovod (separate hosts).
                                          nics=cluster_nics(spark))
            peer_info.update(ranks[0])
            return _measure(prefix, cfg.workers, cfg.batch_size * cfg.workers,
                            cfg.warmup_steps, True) + (sampler, cfg.workers)

        def tf_peer():
            prefix = os.path.join(scratch, f"t{next(counter)}")
            with CpuSampler() as sampler:
                TFDistributeRunner(np=-cfg.workers, threads_per_worker=worker_threads,
                                   driver_log_verbosity="log_callback_only").run(
                    _tf_peer_fit, files=files, config=scaled, steps=steps,
                    recorder=StepRecorder(prefix))
            return _measure(prefix, cfg.workers, cfg.batch_size * cfg.workers,
                            cfg.warmup_steps, True) + (sampler, cfg.workers)

        def reader_alone():
            rate, cpu = HorovodRunner(np=-1, threads_per_worker=worker_threads).run(
                _reader_rate, files=files, config=scaled, size=cfg.workers,
                warmup=cfg.warmup_steps, batches=cfg.steps)
            return rate, cpu, None, None, 1

        setups = {"plain_1": plain(single, 1, False), "dist_1": distributed(single),
                  "ceiling": plain(dataclasses.replace(
                      scaled, threads_per_worker=cfg.threads_per_worker), cfg.workers, True),
                  "dist": distributed(scaled)}
        devices = {"plain_1": 1, "dist_1": 1, "ceiling": cfg.workers, "dist": cfg.workers}
        if cfg.peer:
            if spark is None:
                from pyspark.sql import SparkSession

                from dist_dl.core.session import get_spark

                spark = SparkSession.getActiveSession() or get_spark(f"local[{cfg.workers}]")
            setups["peer"], devices["peer"] = peer, cfg.workers
        if cfg.reader_check:
            setups["reader_alone"], devices["reader_alone"] = reader_alone, 1
        for name, changes in variants.items():
            setups[name] = distributed(dataclasses.replace(scaled, **changes))
            devices[name] = cfg.workers
        if _tf_engine_variants(variants):
            setups["tf_peer"], devices["tf_peer"] = tf_peer, cfg.workers
        results = {name: {"images_per_second": [], "cpu_per_second": [], "threads": [],
                          "devices": devices[name]} for name in setups}
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
        report["horovod"] = peer_info or None
        if cfg.reader_check:
            report["input"] = input_verdict(
                statistics.median(results["reader_alone"]["images_per_second"]),
                statistics.median(results["dist"]["images_per_second"]) / cfg.workers,
                reader_threads=scaled.reader_threads, rows_per_row_group=_row_group_rows(files),
                cached=scaled.cache_dir is not None)
        for line in _table(report):
            out(line)
        if cfg.output:
            with open(cfg.output, "w") as f:
                json.dump(report, f, indent=1)
        if cfg.results:
            published = publish_results(cfg.results, _entries(report, command), log=log_to_mlflow,
                                        tracking_uri=tracking_uri, experiment=experiment,
                                        run_name="bench", own_prefixes=("images_per_second.",))
            out(f"results: {published['results']} and {published['png']}"
                + (f"; MLflow run {published['run_id']}" if published["run_id"] else ""))
        return report
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _tf_engine_variants(variants: dict) -> list[str]:
    """The variants that train on the tf.distribute engine (each is also
    compared with ``tf_peer`` and with ``dist``)."""
    return [name for name, changes in variants.items() if changes.get("engine") == "tensorflow"]


def _report(results: dict, variants: dict, cfg: BenchConfig) -> dict:
    def per_round(a: str, b: str, per: float = 1.0) -> list[float]:
        return [x / (y / per) for x, y in zip(results[a]["images_per_second"],
                                              results[b]["images_per_second"])]

    ratios = {"overhead": per_round("dist_1", "plain_1"), "scaling": per_round("dist", "ceiling")}
    if "peer" in results:
        ratios["scaling_vs_peer"] = per_round("dist", "peer")
    if "reader_alone" in results:
        # One worker's reader alone against what each worker consumes.
        ratios["input_headroom"] = per_round("reader_alone", "dist", per=cfg.workers)
    for name in variants:
        ratios[name] = per_round(name, "ceiling")
    for name in _tf_engine_variants(variants):
        ratios[f"{name}_vs_tf_peer"] = per_round(name, "tf_peer")
        ratios[f"{name}_vs_dist"] = per_round(name, "dist")
    summary = {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for name, v in ratios.items()}
    return {"setups": results, "ratios": ratios, "summary": summary,
            "variants": variants, "config": dataclasses.asdict(cfg)}


def _table(report: dict) -> list[str]:
    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    lines = ["", f"{'setup':>12s}  images/s median (min-max)   per device   CPU s/s median   "
                 "per worker: main thread, other threads user + system"]
    for name, values in report["setups"].items():
        rates = values["images_per_second"]
        splits = [s for s in values.get("threads", []) if s]
        per_device = statistics.median(rates) / values.get("devices", 1)
        lines.append(f"{name:>12s}  {statistics.median(rates):8.1f} ({min(rates):.1f}-"
                     f"{max(rates):.1f})   {per_device:10.1f}   "
                     f"{median(values['cpu_per_second']):14.2f}   "
                     f"{median(s['main'] for s in splits):.2f}, "
                     f"{median(s['other_user'] for s in splits):.2f} + "
                     f"{median(s['other_sys'] for s in splits):.2f}")
    lines.append("")
    labels = {"overhead": "dist_1 / plain_1", "scaling": "dist / ceiling",
              "scaling_vs_peer": "dist / peer",
              "input_headroom": "reader alone / per worker"}
    for name in _tf_engine_variants(report["variants"]):
        labels.update({f"{name}_vs_tf_peer": f"{name} / tf_peer",
                       f"{name}_vs_dist": f"{name} / dist"})
    for name, s in report["summary"].items():
        goal = GOALS.get(name)
        lines.append(f"{labels.get(name, name + ' / ceiling'):>25s}: median {s['median']:.3f} "
                     f"({s['min']:.3f}-{s['max']:.3f})"
                     + (f", goal {goal}" if goal is not None else ""))
    # In the terms of Horovod's synthetic benchmark (tensorflow2_synthetic_benchmark.py).
    dist = report["setups"]["dist"]
    rates = [r / dist["devices"] for r in dist["images_per_second"]]
    spread = 1.96 * statistics.stdev(rates) if len(rates) > 1 else 0.0
    lines.append(f"dist: Img/sec per device: {statistics.mean(rates):.1f} +-{spread:.1f}; "
                 f"Total img/sec on {dist['devices']} device(s): "
                 f"{statistics.mean(dist['images_per_second']):.1f}")
    if report.get("horovod"):
        lines.append(f"peer's Horovod: HOROVOD_CYCLE_TIME={report['horovod']['cycle_time']!r}, "
                     f"NCCL built: {report['horovod']['nccl']}")
    if report.get("input"):
        lines.append("input: " + report["input"]["message"])
    return lines


def _row_group_rows(files: list) -> int | None:
    """Rows per row group of the first shard (None if it cannot be read)."""
    try:
        import pyarrow.parquet as pq

        from dist_dl.core.locations import local_path

        meta = pq.ParquetFile(local_path(files[0], "shard")).metadata
        return meta.num_rows // max(1, meta.num_row_groups)
    except Exception:  # remote storage: the advice goes without the figure
        return None


def input_verdict(reader_rate: float, train_rate: float, *, reader_threads: int,
                  rows_per_row_group: int | None, cached: bool = False) -> dict:
    """Whether one worker's reader keeps up with what one worker trains on.

    ``reader_rate``: images/s of one worker's shard read, decoded and
    batched with nothing else running; ``train_rate``: images/s each worker
    trains on. Returns ``{"headroom": reader / train, "input_bound": bool,
    "message": str}``; the message says by how much and what to change.
    """
    headroom = reader_rate / train_rate
    figures = (f"one worker's reader alone delivers {reader_rate:.0f} images/s; each worker "
               f"trains on {train_rate:.0f} images/s")
    if headroom < 1.0:
        groups = (f" (now {rows_per_row_group} rows)" if rows_per_row_group else "")
        message = (f"INPUT-BOUND: {figures}, so reading and decoding are "
                   f"{100 * (1 - headroom):.0f}% short and training waits on them. To change: "
                   + ("" if cached else "train.cache_dir (later epochs read a local copy, "
                                        "not storage); ")
                   + f"more reader threads (train.reader_threads, now {reader_threads}); "
                   f"larger row groups{groups}, e.g. data.rows_per_row_group >= 256 (Petastorm "
                   "reads whole row groups); smaller stored images (decoding scales with "
                   "pixels).")
    elif headroom < 1.5:
        message = (f"keeps up, narrowly: {figures} ({headroom:.2f}x). Where the reader and "
                   "the model share CPU cores, as on CPU workers, that margin is part of the "
                   "same cores; more reader threads or train.cache_dir widen it.")
    else:
        message = f"not input-bound: {figures} ({headroom:.1f}x headroom)."
    return {"headroom": headroom, "input_bound": headroom < 1.0, "message": message,
            "reader_images_per_second": reader_rate, "train_images_per_second": train_rate}


# ------------------------------------------------ the shared results file

# Goals of the headline ratios (issues 4-16): what the PNG draws them against.
GOALS = {"overhead": 0.95, "scaling": 0.85, "scaling_vs_peer": 1.0, "input_headroom": 1.0,
         "ensemble_speedup": 1.7, "ensemble_vs_ceiling": 0.9, "reader_ratio": 0.8}


def _machine() -> str:
    """Cores, memory, GPUs and the stack, in one line."""
    import platform

    parts = [f"{os.cpu_count()} cores"]
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        parts.append(f"{pages / 2 ** 30:.0f} GiB")
    except (ValueError, OSError):
        pass
    from dist_dl.launch.device import visible_gpus

    gpus = visible_gpus()
    parts.append(f"{len(gpus)} GPU(s)" if gpus else "no GPU")
    parts.append(f"{platform.system()} {platform.machine()}, Python {platform.python_version()}")
    from importlib.metadata import PackageNotFoundError, version

    for name in ("tensorflow", "tensorflow-cpu", "horovod", "pyspark"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return ", ".join(parts)


def _command() -> str:
    import shlex
    import sys

    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):
        return shlex.join(["python", os.path.relpath(argv[0]), *argv[1:]])
    return shlex.join([os.path.basename(argv[0]) if argv else "python", *argv[1:]])


def result_entry(rounds: list, *, command: str | None = None, goal: float | None = None,
                 **extra) -> dict:
    """One key of the results file: the median of ``rounds`` as ``value``,
    the rounds, the command, the date (UTC), the machine, the load average."""
    import time

    values = [float(v) for v in rounds]
    return {"value": statistics.median(values), "rounds": values,
            "command": command or _command(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": _machine(), "load_average": [round(v, 2) for v in os.getloadavg()],
            **({"goal": goal} if goal is not None else {}), **extra}


def _entries(report: dict, command: str | None) -> dict:
    entries = {}
    for name in ("overhead", "scaling", "scaling_vs_peer", "input_headroom"):
        if name in report["ratios"]:
            entries[name] = result_entry(report["ratios"][name], command=command,
                                         goal=GOALS[name])
    # The tf.distribute engine against its plain recipe (goal as Horovod's
    # against its peer) and against the Horovod engine.
    for name in _tf_engine_variants(report["variants"]):
        entries["scaling_vs_tf_peer"] = result_entry(
            report["ratios"][f"{name}_vs_tf_peer"], command=command,
            goal=GOALS["scaling_vs_peer"])
        entries["tf_engine_vs_horovod"] = result_entry(report["ratios"][f"{name}_vs_dist"],
                                                       command=command)
    if report.get("input"):
        entries["input_headroom"]["note"] = report["input"]["message"]
    for name, values in report["setups"].items():
        entries[f"images_per_second.{name}"] = result_entry(
            values["images_per_second"], command=command, devices=values["devices"])
    return entries


def merge_results(path: str, entries: dict, own_prefixes: tuple = ()) -> dict:
    """Merge ``entries`` into the JSON results file at ``path`` and return
    the whole file: keys of ``entries`` are replaced, keys starting with one
    of ``own_prefixes`` (this benchmark's, from an earlier run) are dropped,
    every other key is kept. Written to a temporary file and renamed over the
    old one, under an exclusive lock on the folder, so concurrent benchmarks
    neither tear the file nor lose each other's keys."""
    import fcntl

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {}
        if os.path.exists(path):
            with open(path) as f:
                try:
                    merged = json.load(f)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} is not valid JSON ({exc}); fix or remove it, and "
                                     "rerun the benchmarks whose keys it held") from exc
        merged = {k: v for k, v in merged.items()
                  if not any(k.startswith(p) for p in own_prefixes)}
        merged.update(entries)
        fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dict(sorted(merged.items())), f, indent=1)
                f.write("\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return merged
    finally:
        os.close(lock)


def plot_results(results: dict, path: str) -> str:
    """Draw a results file as a PNG at ``path``: images/s per setup (median
    bar, the rounds as dots, min-max whiskers; per device where a setup has
    several) and every ratio that has a goal (median, the rounds' range, the
    goal as a red mark). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters and CI
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    # The reader alone is not a training setup (and would dwarf them): it is
    # drawn as its ratio, input_headroom.
    rates = {k[len("images_per_second."):]: v for k, v in results.items()
             if k.startswith("images_per_second.") and not k.endswith(".reader_alone")}
    ratios = {k: v for k, v in results.items() if "goal" in v}
    panels = [p for p in (rates, ratios) if p]
    height = max(3.0, 0.45 * max((len(p) for p in panels), default=1) + 1.5)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), height),
                             squeeze=False)
    axes = list(axes[0])
    if rates:
        ax = axes.pop(0)
        names = list(rates)
        for y, name in enumerate(names):
            entry, rounds = rates[name], rates[name]["rounds"]
            ax.barh(y, entry["value"], color="#9db9d9")
            ax.plot([min(rounds), max(rounds)], [y, y], color="black", lw=1)
            ax.plot(rounds, [y] * len(rounds), "o", color="black", ms=3)
            devices = entry.get("devices", 1)
            ax.text(max(rounds), y, f"  {entry['value']:.1f}"
                    + (f" ({entry['value'] / devices:.1f}/device)" if devices > 1 else ""),
                    va="center", fontsize=8)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("images/s (bar: median; dots: rounds)")
        ax.set_xlim(0, 1.35 * max(max(v["rounds"]) for v in rates.values()))
        ax.set_title("Training throughput per setup", fontsize=10)
    if ratios:
        ax = axes.pop(0)
        names = sorted(ratios)
        top, bottom = 0.0, float("inf")
        for y, name in enumerate(names):
            entry, rounds = ratios[name], ratios[name]["rounds"]
            met = entry["value"] >= entry["goal"]
            colour = "#2a7d2a" if met else "#c46a00"
            ax.plot([min(rounds), max(rounds)], [y, y], color=colour, lw=2, alpha=0.5)
            ax.plot([entry["value"]], [y], "D", color=colour)
            ax.plot([entry["goal"]], [y], "|", color="red", ms=16, mew=2)
            ax.text(max(max(rounds), entry["goal"]), y,
                    f"  {entry['value']:.2f} / goal {entry['goal']}", va="center", fontsize=8)
            top = max(top, max(rounds), entry["goal"])
            bottom = min(bottom, min(rounds), entry["goal"])
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        # Log scale: ratios near 1 stay readable beside a headroom of 10x.
        ax.set_xscale("log")
        ax.set_xlim(bottom / 1.3, top * 2.2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("ratio, log scale (diamond: median; line: rounds' range; red: goal)")
        ax.set_title("Ratios against their goals (green: met)", fontsize=10)
    dates = sorted(v["date"] for v in results.values() if "date" in v)
    machines = sorted({v.get("machine", "") for v in results.values()})
    fig.suptitle(f"dist_dl benchmarks, {dates[0][:16]} to {dates[-1][:16]} UTC" if dates
                 else "dist_dl benchmarks", fontsize=11)
    fig.text(0.01, 0.01, "; ".join(machines)[:160], fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def publish_results(path: str, entries: dict, *, log: bool = False,
                    tracking_uri: str | None = None, experiment: str | None = None,
                    run_name: str = "benchmark", own_prefixes: tuple = ()) -> dict:
    """Merge ``entries`` into the results file ``path`` (:func:`merge_results`),
    redraw its PNG beside it (same name, ``.png``), and with ``log`` log both
    as artifacts of a new MLflow run (``entries``' values as its metrics).
    Returns ``{"results": path, "png": ..., "run_id": ... or None}``."""
    merged = merge_results(path, entries, own_prefixes)
    png = plot_results(merged, os.path.splitext(path)[0] + ".png")
    run_id = None
    if log:
        import mlflow

        from dist_dl.tracking.target import mlflow_target

        with mlflow_target(tracking_uri, experiment) as experiment_id, \
                mlflow.start_run(run_name=run_name, experiment_id=experiment_id,
                                 nested=mlflow.active_run() is not None) as run:
            commands = sorted({e["command"] for e in entries.values()})
            mlflow.set_tag("commands", " | ".join(commands)[:5000])
            mlflow.log_metrics({k: v["value"] for k, v in entries.items()})
            mlflow.log_artifact(path)
            mlflow.log_artifact(png)
            run_id = run.info.run_id
    return {"results": path, "png": png, "run_id": run_id}
