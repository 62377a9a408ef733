"""Throughput and scaling of data-parallel training, measured side by side.

Driver side (``dist-dl bench``, ``benchmarks/train.py``, the benchmark
notebook). Every setup trains the same model on the same synthetic shards
through the same reader, and times the same training steps (after
``warmup_steps``) with the same callback, so the ratios compare like with like:

- ``plain_1``: plain Keras ``model.fit`` in one process (no Horovod, no
  callbacks of ours), ``threads_per_worker`` threads;
- ``dist_1``: ``train_distributed`` with one worker, the same threads:
  ``dist_1 / plain_1`` is the library's overhead;
- ``ceiling``: ``num_workers`` independent plain processes, each pinned to its
  own cores: what the machine can do at all (no communication);
- ``dist``: ``train_distributed`` with ``num_workers`` workers and the library's
  defaults: ``dist / ceiling`` is the scaling efficiency;
- ``peer``: what a user would otherwise write, side by side: Horovod's own
  Keras recipe as its documentation writes it (``hvd.init()``, the learning
  rate scaled by ``hvd.size()``, ``hvd.DistributedOptimizer``,
  ``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback``, one GPU
  per local rank), with ``tf.data`` batches of the same shards, launched with
  ``horovod.spark.run`` on the same Spark session: ``dist / peer`` is the
  library against the plain recipe (``cfg.peer``);
- ``reader_alone``: the same reader on one worker's shard, nothing else
  (``cfg.reader_check``): ``reader_alone / (dist / num_workers)`` says whether
  reading and decoding keep up with training (`input_verdict()`);
- any ``variants``: ``dist`` with some settings changed (the levers);
- ``tf_peer``, when a variant trains with ``engine="tensorflow"``
  (tf.distribute's MultiWorkerMirroredStrategy): TensorFlow's own
  multi-worker Keras recipe (strategy first, model and optimizer compiled
  under ``strategy.scope()``, the learning rate scaled by the number of
  workers, each worker's batches through
  ``distribute_datasets_from_function``) on the same shards, launched as
  local processes with ``TF_CONFIG`` set (``TFDistributeRunner(np=-num_workers)``:
  the recipe has no launcher of its own). ``<variant> / tf_peer`` is that
  engine against its plain recipe, and ``<variant> / dist`` engine against
  engine.

The setups run interleaved, in a rotated order each round, and the report
gives medians and ranges of the per-round ratios: on a shared machine the
same process can run at half speed minutes later.

Beside throughput, each run records where its workers' CPU went over the
timed steps (`CpuSampler`): the busiest thread of each worker (with
one TensorFlow thread per worker, the compute) against all its other threads
(input pipeline; in the distributed setups also Horovod's background thread
and Gloo's socket loop, whose time is mostly system time on loopback).

The report also gives images/s per device (per GPU on a GPU machine, per
worker on CPU), in the terms of Horovod's synthetic benchmark, so that
figures compare with published ones. With ``cfg.results`` set, the headline
ratios go into a shared results file (`publish_results()`): merged into
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

from dist_dl.app.bench.fits import peer_fit, plain_fit, reader_rate, tf_peer_fit
from dist_dl.app.bench.measure import CpuSampler, StepRecorder, rates_from_recorders, thread_split
from dist_dl.app.bench.results import GOALS, publish_results, report_entries, tf_engine_variants
from dist_dl.app.config import BenchConfig
from dist_dl.core import compat
from dist_dl.core.deprecation import renamed_parameters
from dist_dl.core.locations import file_url
from dist_dl.train.config import TrainConfig
from dist_dl.train.timing import input_levers

__all__ = ["run_benchmark", "input_verdict", "cores_per_device"]


@renamed_parameters({"experiment": "experiment_name"})
def run_benchmark(cfg: BenchConfig, *, spark=None, variants: dict | None = None,
                  workdir: str | None = None, out: Callable[[str], None] = print,
                  log_to_mlflow: bool = False, tracking_uri: str | None = None,
                  experiment_name: str | None = None, command: str | None = None) -> dict:
    """Run the setups of the module docstring, ``cfg.rounds`` times interleaved.

    Args:
        cfg: The benchmark's settings.
        spark: For the peer (``horovod.spark.run``) and variants with
            ``backend="spark"``; default the active session, else
            ``local[<num_workers>]`` when the peer runs.
        variants: Name -> ``TrainConfig`` fields changed from the ``dist`` setup.
        workdir: Scratch folder (default: a temporary one, removed afterwards).
        out: Where progress and the report go.
        log_to_mlflow: Log the results file and its PNG (``cfg.results``)
            as artifacts of an MLflow run, in experiment ``experiment_name``
            at ``tracking_uri`` (default: MLflow's current one).
        command: The command line recorded with the results (default: this
            process's).

    Returns:
        ``{"setups": {name: {"images_per_second": [...], "cpu_per_second":
        [...], "threads": [thread_split(...) or None, ...]}}, "ratios":
        {"overhead": [...], "scaling": [...], <variant>: [...]}, "summary":
        {ratio: {"median", "min", "max"}}, "input": input_verdict(...) or
        None, "horovod": what the peer's workers ran with, "config": ...}``;
        also written to ``cfg.output`` as JSON when set, and its headline
        ratios merged into ``cfg.results`` (`publish_results()`).
    """
    from dist_dl.core.optional import require_installed
    from dist_dl.launch import HorovodRunner, TFDistributeRunner
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.read.resolve import resolve_files
    from dist_dl.train import train_distributed

    require_installed("tensorflow", "the benchmark (Keras models on Horovod and tf.distribute)")
    variants = dict(variants or {})
    scratch = workdir or tempfile.mkdtemp(prefix="dist_dl-bench-")
    steps = cfg.warmup_steps + cfg.steps
    try:
        shards = os.path.join(scratch, "shards")
        rows = steps * cfg.batch_size * max(2, cfg.num_workers)
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
        scaled = dataclasses.replace(base, num_workers=cfg.num_workers)
        counter = iter(range(10 ** 6))

        def plain(config: TrainConfig, ranks: int, pin: bool):
            def run():
                prefix = os.path.join(scratch, f"t{next(counter)}")
                with CpuSampler() as sampler:
                    # Independent processes by design (the machine's ceiling): each
                    # trains its own copy, which the weights check would refuse.
                    runner = HorovodRunner(np=-ranks, threads_per_worker=config.threads_per_worker,
                                           pin_cpus=pin, driver_log_verbosity="log_callback_only",
                                           check_weights=False)
                    runner.run(plain_fit, files=files, config=config, steps=steps,
                               recorder=StepRecorder(prefix))
                return rates_from_recorders(prefix, ranks, config.batch_size, cfg.warmup_steps,
                                False) + (sampler, ranks)
            return run

        def distributed(config: TrainConfig):
            def run():
                prefix = os.path.join(scratch, f"t{next(counter)}")
                with CpuSampler() as sampler:
                    train_distributed(shards, config=config, tracking_uri=tracking,
                                      callbacks=StepRecorder(prefix), spark=spark)
                return rates_from_recorders(prefix, config.num_workers,
                                config.batch_size * config.num_workers, cfg.warmup_steps,
                                True) + (sampler, config.num_workers)
            return run

        # What each of the scaled setup's workers gets (launch.core.device.plan_devices).
        worker_threads = (scaled.threads_per_worker
                          or max(1, (os.cpu_count() or 1) // cfg.num_workers))
        peer_info: dict = {}

        def peer():
            import horovod.spark

            from dist_dl.launch.horovod.spark import cluster_nics

            prefix = os.path.join(scratch, f"t{next(counter)}")
            with CpuSampler() as sampler:
                ranks = horovod.spark.run(peer_fit, args=(files, scaled, steps,
                                                           StepRecorder(prefix), worker_threads),
                                          num_proc=cfg.num_workers, verbose=0,
                                          env=dict(os.environ, **compat.worker_env()),
                                          # The interface the library's own Spark
                                          # backend gives Horovod (separate hosts).
                                          nics=cluster_nics(spark))
            peer_info.update(ranks[0])
            return rates_from_recorders(prefix, cfg.num_workers, cfg.batch_size * cfg.num_workers,
                            cfg.warmup_steps, True) + (sampler, cfg.num_workers)

        def tf_peer():
            prefix = os.path.join(scratch, f"t{next(counter)}")
            with CpuSampler() as sampler:
                TFDistributeRunner(np=-cfg.num_workers, threads_per_worker=worker_threads,
                                   driver_log_verbosity="log_callback_only").run(
                    tf_peer_fit, files=files, config=scaled, steps=steps,
                    recorder=StepRecorder(prefix))
            return rates_from_recorders(prefix, cfg.num_workers, cfg.batch_size * cfg.num_workers,
                            cfg.warmup_steps, True) + (sampler, cfg.num_workers)

        def reader_alone():
            rate, cpu = HorovodRunner(np=-1, threads_per_worker=worker_threads).run(
                reader_rate, files=files, config=scaled, size=cfg.num_workers,
                warmup=cfg.warmup_steps, batches=cfg.steps)
            return rate, cpu, None, None, 1

        setups = {"plain_1": plain(single, 1, False), "dist_1": distributed(single),
                  "ceiling": plain(dataclasses.replace(
                      scaled, threads_per_worker=cfg.threads_per_worker), cfg.num_workers, True),
                  "dist": distributed(scaled)}
        devices = {"plain_1": 1, "dist_1": 1, "ceiling": cfg.num_workers, "dist": cfg.num_workers}
        if cfg.peer:
            if spark is None:
                from pyspark.sql import SparkSession

                from dist_dl.core.session import get_spark

                spark = SparkSession.getActiveSession() or get_spark(f"local[{cfg.num_workers}]")
            setups["peer"], devices["peer"] = peer, cfg.num_workers
        if cfg.reader_check:
            setups["reader_alone"], devices["reader_alone"] = reader_alone, 1
        for name, changes in variants.items():
            setups[name] = distributed(dataclasses.replace(scaled, **changes))
            devices[name] = cfg.num_workers
        if tf_engine_variants(variants):
            setups["tf_peer"], devices["tf_peer"] = tf_peer, cfg.num_workers
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
                statistics.median(results["dist"]["images_per_second"]) / cfg.num_workers,
                reader_threads=scaled.reader_threads, rows_per_row_group=_row_group_rows(files),
                cached=scaled.cache_dir is not None)
            reader = results["reader_alone"]
            per_cpu_second = [rate / cpu for rate, cpu in zip(reader["images_per_second"],
                                                              reader["cpu_per_second"]) if cpu]
            if per_cpu_second:
                report["input"]["cores"] = cores_per_device(
                    statistics.median(per_cpu_second),
                    cfg.device_images_per_second or report["input"]["train_images_per_second"],
                    cores=os.cpu_count() or 1, devices=cfg.num_workers,
                    measured_device=cfg.device_images_per_second is None)
        for line in _table(report):
            out(line)
        if cfg.output:
            with open(cfg.output, "w") as f:
                json.dump(report, f, indent=1)
        if cfg.results:
            published = publish_results(cfg.results, report_entries(report, command), log=log_to_mlflow,
                                        tracking_uri=tracking_uri, experiment_name=experiment_name,
                                        run_name="bench", own_prefixes=("images_per_second.",))
            out(f"results: {published['results']} and {published['png']}"
                + (f"; MLflow run {published['run_id']}" if published["run_id"] else ""))
        return report
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _report(results: dict, variants: dict, cfg: BenchConfig) -> dict:
    def per_round(a: str, b: str, per: float = 1.0) -> list[float]:
        return [x / (y / per) for x, y in zip(results[a]["images_per_second"],
                                              results[b]["images_per_second"])]

    ratios = {"overhead": per_round("dist_1", "plain_1"), "scaling": per_round("dist", "ceiling")}
    if "peer" in results:
        ratios["scaling_vs_peer"] = per_round("dist", "peer")
    if "reader_alone" in results:
        # One worker's reader alone against what each worker consumes.
        ratios["input_headroom"] = per_round("reader_alone", "dist", per=cfg.num_workers)
    for name in variants:
        ratios[name] = per_round(name, "ceiling")
    for name in tf_engine_variants(variants):
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
    for name in tf_engine_variants(report["variants"]):
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
        if report["input"].get("cores"):
            lines.append("input: " + report["input"]["cores"]["message"])
    return lines


def cores_per_device(per_cpu_second: float, device_rate: float, *, cores: int, devices: int,
                     measured_device: bool = True) -> dict:
    """How many CPU cores one device needs to be fed, and whether the node has them.

    ``per_cpu_second``: images one CPU-second of the input pipeline delivers
    (read, decode, crop, batch); ``device_rate``: images/s one device trains
    on (``measured_device``: measured here, else given); ``cores`` and
    ``devices``: the node's CPU cores and the training devices (GPUs, or
    workers on CPUs) that share them. Returns ``{"cores_needed",
    "cores_per_device", "enough": bool, "message": str}``; the message gives
    the figures and, where the cores fall short, the levers.
    """
    if per_cpu_second <= 0 or device_rate <= 0:
        raise ValueError(f"rates must be positive: {per_cpu_second!r} images per CPU-second, "
                         f"{device_rate!r} images/s per device")
    if cores < 1 or devices < 1:
        raise ValueError(f"cores and devices must be >= 1, got {cores} and {devices}")
    needed = device_rate / per_cpu_second
    have = cores / devices
    source = "measured here" if measured_device else "as given"
    figures = (f"the input pipeline delivers {per_cpu_second:.0f} images per CPU-second; one device "
               f"trains on {device_rate:.0f} images/s ({source}), so each device needs "
               f"{needed:.1f} cores of input work; this node has {have:.1f} per device "
               f"({cores} cores, {devices} devices)")
    if needed <= have:
        message = f"cores per device: enough: {figures}."
    else:
        message = (f"cores per device: SHORT by {needed - have:.1f}: {figures}. Levers: "
                   + "; ".join(input_levers()) + ".")
    return {"cores_needed": needed, "cores_per_device": have, "enough": needed <= have,
            "message": message}


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
