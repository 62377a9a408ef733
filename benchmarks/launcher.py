"""Launcher start-up and idle cost, measured side by side in one run.

1. Start-up: time from ``HorovodRunner.run()`` to the first line of the worker
   function on the last rank to get there, for np=-2 (local processes) and
   np=2 (Spark tasks on local[2]), interleaved, several rounds; medians and
   spread. Horovod's own function launcher (``horovod.runner.run``) is run in
   the same rounds as the baseline for np=-2.
2. Idle cost: CPU seconds per wall second of a worker idle after hvd.init(),
   ours (np=-2, with HOROVOD_CYCLE_TIME="(None,)" inherited, as Horovod's
   launcher would hand it) against horovod.runner.run.
3. Worker start, forked against new interpreters: a whole
   ``HorovodRunner(np=-2).run()`` of a function that initialises Horovod and
   allreduces once, its workers forked from the fork server
   (``dist_dl.launch.fork.client``, the default) and started as new
   interpreters (``DIST_DL_FORK_WORKERS=0``), interleaved; the wall seconds
   and the machine's CPU seconds (``/proc/stat``) of each job. The same for
   ``HorovodRunner(np=2)`` on local[2] Spark, whose workers fork from a
   server in each task's Python worker (``dist_dl.launch.horovod.sparkfork``). The
   servers' own start is left out (a warm-up job of each before the rounds):
   it is paid once per driver process (or Python worker) and environment.
   Written to ``--results`` (``worker_start.*``, ``worker_start.spark.*``).

Usage: .venv/bin/python benchmarks/launcher.py [--rounds 5] [--results benchmarks/results.json]
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


def allreduce_once():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    return float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy()[0])


def worker_start(rounds: int, np: int, spark=None) -> dict:
    """Wall and CPU seconds of a 2-worker job (``np=-2``: local processes;
    ``np=2``: Spark tasks), forked and new interpreters."""
    import tensorflow  # noqa: F401 - the driver of a Keras job has imported it

    from dist_dl import HorovodRunner
    from dist_dl.app.bench.measure import machine_busy_seconds
    from dist_dl.launch.fork.client import SWITCH

    setups = {"forked": "1", "new_interpreter": "0"}
    found = {name: {"wall": [], "cpu": []} for name in setups}
    os.environ[SWITCH] = "1"
    HorovodRunner(np=np, spark=spark).run(allreduce_once)  # the fork servers start
    for _ in range(rounds):
        for name, switch in setups.items():
            os.environ[SWITCH] = switch
            cpu0, t0 = machine_busy_seconds(), time.monotonic()
            assert HorovodRunner(np=np, spark=spark).run(allreduce_once) == 2.0
            found[name]["wall"].append(time.monotonic() - t0)
            found[name]["cpu"].append(machine_busy_seconds() - cpu0)
    os.environ.pop(SWITCH)
    return found


def _summary(values):
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results", default=os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "results.json"), help="results file ('' for none)")
    args = parser.parse_args()
    import horovod.runner

    from dist_dl import HorovodRunner
    from dist_dl.core.session import get_spark

    spark = get_spark("local[2]")
    local, on_spark = "HorovodRunner(np=-2)", "HorovodRunner(np=2), local[2] Spark"
    # Section 3's jobs: the label of each in the table, the prefix of its keys.
    jobs = {local: ("", -2), on_spark: ("spark.", 2)}
    starts = {label: worker_start(args.rounds, np, spark if np > 0 else None)
              for label, (_, np) in jobs.items()}
    setups = {
        local: lambda fn: HorovodRunner(np=-2).run(fn),
        on_spark: lambda fn: HorovodRunner(np=2, spark=spark).run(fn),
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
    print("\n| 2-worker job | workers | job wall s | machine CPU s per job |\n|---|---|---|---|")
    for label, found in starts.items():
        for name, values in found.items():
            print(f"| {label} | {name} | {_summary(values['wall'])} | {_summary(values['cpu'])} |")
    if args.results:
        from dist_dl.app.bench.results import merge_results, result_entry

        entries = {}
        for label, found in starts.items():
            prefix = jobs[label][0]
            new, forked = found["new_interpreter"], found["forked"]
            entries.update({f"worker_start.{prefix}{kind}_s.{name}": result_entry(values[kind])
                            for name, values in found.items() for kind in ("wall", "cpu")})
            # Per round, side by side: how many times the forked job is faster / cheaper.
            for kind in ("wall", "cpu"):
                entries[f"worker_start.{prefix}{kind}_ratio"] = result_entry(
                    [n / f for n, f in zip(new[kind], forked[kind])])
        merge_results(args.results, entries)


if __name__ == "__main__":
    main()
