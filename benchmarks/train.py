"""Overhead and scaling of train_distributed, and the levers, side by side.

    PYTHONPATH=src .venv/bin/python benchmarks/train.py [--rounds 3] [--steps 20] [--quick]
        [--mixed-precision auto|on|off] [--no-peer] [--no-reader-check]

Runs dist_dl.app.bench.run_benchmark (see its docstring for the setups) for
ResNet50 on 64x64 synthetic images, batch 32 per worker, two workers, with
these levers as extra distributed setups, each against the same ceiling:

- batch64: 64 images per worker per step (learning rate scaled with it);
- fp16: gradients compressed to float16 for the allreduce;
- cycle1, cycle5, cycle10, cycle20: HOROVOD_CYCLE_TIME of 1 (Horovod's
  default), 5 (the library's default on CPU workers), 10 or 20 ms;
- bpps2: gradients of 2 batches accumulated before each allreduce;
- groups1: all gradients in one explicit allreduce group per step (and
  groups1_cycle20: that with a 20 ms cycle);
- pinned: each worker pinned to its own core;
- spark: the workers as Spark tasks on local[2] (horovod.spark.run) instead
  of processes;
- tfdist: engine="tensorflow" (tf.distribute's MultiWorkerMirroredStrategy
  instead of Horovod), run beside TensorFlow's own multi-worker recipe
  (tf_peer): engine against engine, each against its plain recipe.

Every round also runs the peer (Horovod's own Keras recipe launched with
``horovod.spark.run`` on ``local[<num_workers>]``, or the active Spark session)
and one worker's reader alone on the same shards (is training input-bound?).

The same command runs unchanged on a GPU machine: each worker gets the GPU
of its local rank, ``--mixed-precision auto`` computes in float16 there,
Horovod uses NCCL for GPU tensors when it was built with it
(``HOROVOD_GPU_OPERATIONS=NCCL`` at ``pip install horovod``; the report says
whether it was), and the table gives images/s per device as Horovod's
synthetic benchmark does.

Prints a table and writes the full record to benchmarks/train-<time>.json
(not committed); the headline ratios are merged into benchmarks/results.json
(committed, with benchmarks/results.png drawn from it) and logged with the
PNG to MLflow (``--tracking-uri``, default runs/mlruns);
benchmarks/RESULTS.md holds the figures.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from dist_dl.app.bench import run_benchmark
from dist_dl.app.config import BenchConfig

HERE = os.path.dirname(os.path.abspath(__file__))

LEVERS = {
    "batch64": {"batch_size": 64, "learning_rate": 0.025},
    "fp16": {"fp16_allreduce": True},
    "cycle1": {"cycle_time_ms": 1.0},
    "cycle5": {"cycle_time_ms": 5.0},
    "cycle10": {"cycle_time_ms": 10.0},
    "cycle20": {"cycle_time_ms": 20.0},
    "bpps2": {"backward_passes_per_step": 2},
    "groups1": {"allreduce_groups": 1},
    "groups1_cycle20": {"allreduce_groups": 1, "cycle_time_ms": 20.0},
    "pinned": {"pin_cpus": True},
    "spark": {"backend": "spark"},
    "tfdist": {"engine": "tensorflow"},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--num-workers", type=int, default=2,
                        help="workers of the scaled setups (on a GPU machine: its GPUs)")
    parser.add_argument("--levers", default="batch64,fp16,cycle1,bpps2,pinned,spark",
                        help=f"comma-separated subset of {', '.join(LEVERS)} (or 'none')")
    parser.add_argument("--mixed-precision", default="auto", choices=("auto", "on", "off"),
                        help="auto: float16 compute on GPUs, float32 on CPUs")
    parser.add_argument("--no-peer", dest="peer", action="store_false",
                        help="leave out Horovod's own recipe on Spark")
    parser.add_argument("--no-reader-check", dest="reader_check", action="store_false",
                        help="leave out the reader alone")
    parser.add_argument("--device-rate", type=float, default=None,
                        help="images/s one device trains on, to size the input for (e.g. a GPU's "
                             "rate from benchmarks/gpu.py; default: the rate measured here)")
    parser.add_argument("--results", default=os.path.join(HERE, "results.json"),
                        help="results file the headline ratios are merged into ('' for none)")
    parser.add_argument("--tracking-uri",
                        default=Path(HERE).parent.joinpath("runs", "mlruns").as_uri(),
                        help="MLflow store the results file and its PNG are logged to")
    parser.add_argument("--quick", action="store_true",
                        help="small_cnn at 16 px, 3 steps, 1 round: checks the script runs "
                             "(writes no results file)")
    args = parser.parse_args(argv)
    chosen = [] if args.levers == "none" else args.levers.split(",")
    unknown = sorted(set(chosen) - set(LEVERS))
    if unknown:
        parser.error(f"unknown levers {unknown}; choose from {', '.join(LEVERS)}")
    cfg = BenchConfig(model=args.model, image_size=64, batch_size=32, num_workers=args.num_workers,
                      steps=args.steps, warmup_steps=args.warmup_steps, rounds=args.rounds,
                      threads_per_worker=1, mixed_precision=args.mixed_precision,
                      peer=args.peer, reader_check=args.reader_check,
                      device_images_per_second=args.device_rate, results=args.results or None,
                      output=os.path.join(HERE, f"train-{time.strftime('%Y%m%d-%H%M%S')}.json"))
    if args.quick:
        cfg = BenchConfig(model="small_cnn", image_size=16, steps=3, warmup_steps=1, rounds=1,
                          peer=args.peer, reader_check=args.reader_check,
                          device_images_per_second=args.device_rate, output=None)
    spark = None
    if "spark" in chosen:
        from dist_dl.core.session import get_spark

        spark = get_spark(f"local[{args.num_workers}]")
    print(f"load average before: {os.getloadavg()}")
    run_benchmark(cfg, spark=spark, variants={name: LEVERS[name] for name in chosen},
                  log_to_mlflow=bool(args.tracking_uri), tracking_uri=args.tracking_uri or None,
                  experiment_name="dist_dl benchmarks")
    print(f"load average after: {os.getloadavg()}")
    if cfg.output:
        print(f"full record: {cfg.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
