"""Launcher start-up and idle cost, measured side by side in one run.

1. Start-up: time from ``HorovodRunner.run()`` to the first line of the worker
   function on the last rank to get there, for np=-2 (local processes) and
   np=2 (Spark tasks on local[2]), interleaved, several rounds; medians and
   spread. Horovod's own function launcher (``horovod.runner.run``) is run in
   the same rounds as the baseline for np=-2.
2. Idle cost: CPU seconds per wall second of a worker idle after hvd.init(),
   ours (np=-2, with HOROVOD_CYCLE_TIME="(None,)" inherited, as Horovod's
   launcher would hand it) against horovod.runner.run.

Usage: .venv/bin/python benchmarks/launcher.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time


def first_line():
    started = time.time()
    import horovod.tensorflow as hvd

    hvd.init()
    return max(hvd.allgather_object(started))


def idle_cost(seconds: float = 4.0):
    import horovod.tensorflow as hvd

    hvd.init()
    time.sleep(1.0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, wall0 = usage.ru_utime + usage.ru_stime, time.monotonic()
    time.sleep(seconds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return max(hvd.allgather_object(
        (usage.ru_utime + usage.ru_stime - cpu0) / (time.monotonic() - wall0)))


def _summary(values):
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import horovod.runner

    from dist_dl import HorovodRunner
    from dist_dl.core.session import get_spark

    spark = get_spark("local[2]")
    setups = {
        "HorovodRunner(np=-2)": lambda fn: HorovodRunner(np=-2).run(fn),
        "HorovodRunner(np=2), local[2] Spark": lambda fn: HorovodRunner(np=2, spark=spark).run(fn),
        "horovod.runner.run(np=2) (baseline)": lambda fn: horovod.runner.run(
            fn, np=2, use_gloo=True, verbose=0)[0],
    }
    startup = {name: [] for name in setups}
    for _ in range(args.rounds):
        for name, run in setups.items():
            t0 = time.time()
            startup[name].append(run(first_line) - t0)
    os.environ["HOROVOD_CYCLE_TIME"] = "(None,)"
    os.environ["HOROVOD_CACHE_CAPACITY"] = "(None,)"
    idle = {"HorovodRunner(np=-2)": [], "horovod.runner.run(np=2) (baseline)": []}
    for _ in range(max(2, args.rounds // 2)):
        for name in idle:
            idle[name].append(setups[name](idle_cost))
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("\n| setup | seconds from run() to first worker line, median (spread) |\n|---|---|")
    for name, values in startup.items():
        print(f"| {name} | {_summary(values)} |")
    print("\n| setup | idle worker CPU s per wall s, median (spread) |\n|---|---|")
    for name, values in idle.items():
        print(f"| {name} | {_summary(values)} |")


if __name__ == "__main__":
    main()
