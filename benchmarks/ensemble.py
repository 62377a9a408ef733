"""Benchmark: an ensemble of n random forests on local[2] Spark against the same
n forests trained one after another in one process, on the same data.

Every setup does the same work: read the same Parquet files, hold out the same
share of rows (20 %), train n forests (one core each, ``n_jobs=1``) on n
random parts of the rest, and score every forest and their vote on the
held-out rows (with the same scoring functions ``train_ensemble`` runs in its
tasks). The setups:

- ``sequential``: all of it in this process, one forest after another (the
  baseline);
- ``spark``: ``train_ensemble`` on ``local[2]`` end to end; it also writes
  the members to files and logs the MLflow run and model (to a temporary
  file store), which the others do not;
- ``2 processes``: the fits and member scoring in two warm plain processes,
  no Spark: what two cores give on this machine at all (its ceiling).

The Spark session and all Python workers are started, and warmed up by one
small ensemble, before any timing, and again right before every Spark run
(Spark stops Python workers idle for a minute, and the setup before it may
take longer; the other setups' processes stay warm), so no Spark run pays
for starting its Python workers.
The setups alternate for ``--rounds`` rounds, in a rotating order. Before
each round (and its warm-up) the script waits while the
machine is busy with other work (1-minute load average above ``--max-load``,
or other processes using more than half a core while this one is idle),
because on a 2-core machine other jobs take cores from the parallel setups
first. The report gives medians, the spread, CPU seconds per wall second of
the whole machine (from /proc/stat) during each run, the load average, and the
time of each phase of ``train_ensemble`` (its Spark jobs, by description),
and where ``train_ensemble``'s CPU went: the JVM, the Python workers (and of
that, the members' fits alone, from the ``member_<i>_fit_seconds`` it logs)
and this driver process.

Each round runs the three setups at every member size of ``--trees`` (two
sizes by default: small members show the fixed cost per call, large ones
amortise it). At the end the speed-ups, the ceilings and the Spark run's
share of the ceiling per size go into ``benchmarks/results.json``
(``ensemble_*`` keys; ``ensemble_vs_ceiling`` and ``ensemble_speedup`` at
the size furthest from the ceiling), the PNG beside it is redrawn, and both
are logged to MLflow (``--tracking-uri``).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/ensemble.py [--models 4] [--rows 200000]
      [--trees 90,200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dist_dl.app.bench.measure import machine_busy_seconds  # noqa: E402 - after the path

VALIDATION_FRACTION = 0.2


def _measure(fn):
    cpu0, t0 = machine_busy_seconds(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    return wall, (machine_busy_seconds() - cpu0) / wall, out


def _others_cpu(seconds: float = 5.0) -> float:
    """CPU seconds per second the machine spends while this benchmark idles:
    what other processes are using now."""
    cpu0 = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - cpu0) / seconds


def wait_for_quiet(max_load: float, max_wait: float) -> tuple[float, float, bool]:
    """Wait (a minute at a time, at most ``max_wait`` seconds) until the
    machine is quiet; returns the load average and others' CPU at the start,
    and whether it was quiet."""
    deadline = time.time() + max_wait
    while True:
        load, others = os.getloadavg()[0], _others_cpu()
        quiet = load <= max_load and others <= 0.5
        if quiet or time.time() >= deadline:
            return load, others, quiet
        print(f"  machine busy (load {load:.1f}, others use {others:.2f} CPU s/s): "
              "waiting 60 s", flush=True)
        time.sleep(60)


def make_factory(trees: int):
    # A closure, so Spark ships it by value (this script is not importable
    # from the Python workers).
    def forest(member):
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(n_estimators=trees, max_depth=12, random_state=member,
                                      n_jobs=1)

    return forest


def _load_and_split(path, feature_cols, n, seed):
    """The Parquet files, a held-out share, and n random training parts."""
    import numpy as np
    import pandas as pd

    pdf = pd.read_parquet(path)
    rng = np.random.default_rng(seed)
    held_out = rng.random(len(pdf)) < VALIDATION_FRACTION
    x = pdf[feature_cols].to_numpy(dtype=np.float64)
    y = pdf["label"].to_numpy()
    x_train, y_train = x[~held_out], y[~held_out]
    part = rng.integers(0, n, len(y_train))
    parts = [(x_train[part == i], y_train[part == i]) for i in range(n)]
    return parts, x[held_out], y[held_out]


def _fit_and_proba(factory, i, x_train, y_train, x_val, num_classes):
    """A member's held-out probabilities, and the seconds of its fit alone
    (what ``train_ensemble`` logs as ``member_<i>_fit_seconds``)."""
    from dist_dl.ensemble.members import member_proba

    model = factory(i)
    start = time.perf_counter()
    model.fit(x_train, y_train)
    return member_proba(model, x_val, num_classes), time.perf_counter() - start


def _scores(fitted, y_val):
    """Each member's accuracy and the vote's, as ``train_ensemble`` scores them
    (labels here are 0..k-1, so class indices are the labels), and the fits'
    seconds, from ``_fit_and_proba``'s results."""
    from dist_dl.ensemble.members import combine

    probas = [p for p, _ in fitted]
    members = [float((p.argmax(axis=1) == y_val).mean()) for p in probas]
    return members, float((combine(probas, "vote") == y_val).mean()), [t for _, t in fitted]


def sequential(path, factory, n, feature_cols, seed, num_classes=3):
    """The same n forests, one after another, in this process."""
    parts, x_val, y_val = _load_and_split(path, feature_cols, n, seed)
    fitted = [_fit_and_proba(factory, i, x, y, x_val, num_classes)
              for i, (x, y) in enumerate(parts)]
    return _scores(fitted, y_val)


def two_processes(pool, path, factory, n, feature_cols, seed, num_classes=3):
    """The machine's own ceiling: the same fits in two warm plain processes,
    no Spark (what two cores give when nothing else is in the way)."""
    parts, x_val, y_val = _load_and_split(path, feature_cols, n, seed)
    futures = [pool.submit(_fit_and_proba, factory, i, x, y, x_val, num_classes)
               for i, (x, y) in enumerate(parts)]
    return _scores([f.result() for f in futures], y_val)


def _warm_worker(_):
    import sklearn.ensemble  # noqa: F401

    import dist_dl.ensemble.members  # noqa: F401

    return True


class _Shipped:
    """A cloudpickled factory, so that the closure reaches spawned processes."""

    def __init__(self, blob):
        self.blob = blob

    def __call__(self, i):
        import cloudpickle

        return cloudpickle.loads(self.blob)(i)


def _phase_seconds(sc, since_ms: float) -> dict:
    """Seconds from first submission to last completion of the Spark jobs of
    each ``train_ensemble`` phase (jobs it names "dist_dl ensemble: ...")
    submitted after ``since_ms``."""
    from dist_dl.ensemble.driver import PHASE_PREFIX

    # The status store is Spark's own record of jobs (what the UI shows); it
    # is kept with the UI off. Not public API: good enough for a benchmark.
    jobs = sc._jsc.sc().statusStore().jobsList(None)
    spans = {}
    for i in range(jobs.length()):
        job = jobs.apply(i)
        desc = job.description()
        if not desc.isDefined() or not desc.get().startswith(PHASE_PREFIX):
            continue
        start = job.submissionTime().get().getTime()
        if start < since_ms or not job.completionTime().isDefined():
            continue
        end = job.completionTime().get().getTime()
        phase = desc.get()[len(PHASE_PREFIX):]
        lo, hi = spans.get(phase, (start, end))
        spans[phase] = (min(lo, start), max(hi, end))
    return {phase: (hi - lo) / 1000 for phase, (lo, hi) in spans.items()}


def _cpu_by_role(sampler, start: float, end: float) -> dict:
    """CPU seconds of the JVM and of the Python workers between ``start`` and
    ``end`` (perf_counter clock), from a ``CpuSampler``."""
    window, seconds = sampler.window(start, end), sampler.span(start, end)
    roles = {"jvm": 0.0, "python workers": 0.0}
    for proc in (window or {}).values():
        cpu = sum(u + s for u, s in proc["threads"].values()) * seconds
        if "java" in proc["command"]:
            roles["jvm"] += cpu
        elif "pyspark" in proc["command"]:
            roles["python workers"] += cpu
    return roles


def _size_report(trees, rows, phases, cpus, fit_seconds):
    """Print one member size's medians; return its per-round speed-ups and
    ceilings (the runs of one round ran back to back, so ratios are per round)."""
    order = ("sequential", "spark", "2 processes")
    walls = {}
    print(f"\n-- {trees} trees per member --")
    for name in order:
        times = [w for _, n, w, _ in rows if n == name]
        utils = [u for _, n, _, u in rows if n == name]
        walls[name] = times
        print(f"{name:11s} median {statistics.median(times):6.1f} s (range {min(times):.1f}-"
              f"{max(times):.1f}), machine CPU {min(utils):.2f}-{max(utils):.2f} s/s")
    for name in order:
        values = fit_seconds[name]
        print(f"  one member's fit alone, {name}: median {statistics.median(values):.2f} s "
              f"(range {min(values):.2f}-{max(values):.2f})")
    for phase in phases[0]:
        values = [p.get(phase, float("nan")) for p in phases]
        print(f"  spark phase '{phase}': median {statistics.median(values):.1f} s "
              f"(range {min(values):.1f}-{max(values):.1f})")
    for role in cpus[0]:
        values = [c[role] for c in cpus]
        print(f"  spark CPU seconds, {role}: median {statistics.median(values):.1f} "
              f"(range {min(values):.1f}-{max(values):.1f})")
    rest = [w - sum(p.values()) for w, p in zip(walls["spark"], phases)]
    print(f"  spark outside its jobs (driver: plan, MLflow run and model): median "
          f"{statistics.median(rest):.1f} s (range {min(rest):.1f}-{max(rest):.1f})")
    # Fixed cost against the ceiling: what the Spark run takes beyond the
    # same fits in two plain processes, in the same round.
    extra = [s - t for s, t in zip(walls["spark"], walls["2 processes"])]
    print(f"  spark beyond the ceiling's wall: median {statistics.median(extra):.1f} s "
          f"(range {min(extra):.1f}-{max(extra):.1f})")
    speed = [s / p for s, p in zip(walls["sequential"], walls["spark"])]
    ceiling = [s / t for s, t in zip(walls["sequential"], walls["2 processes"])]
    print(f"speed-up of spark over sequential: median of rounds {statistics.median(speed):.2f}x "
          f"(per round {', '.join(f'{v:.2f}' for v in speed)})")
    print(f"machine ceiling (2 processes over sequential): median of rounds "
          f"{statistics.median(ceiling):.2f}x "
          f"(per round {', '.join(f'{v:.2f}' for v in ceiling)})")
    print(f"spark / ceiling: median of rounds "
          f"{statistics.median([a / b for a, b in zip(speed, ceiling)]):.2f}")
    return speed, ceiling


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--trees", default="90,200",
                        help="trees per member: one size, or sizes separated by commas, each "
                             "run in every round (default 90,200)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-load", type=float, default=2.5,
                        help="wait before a round while the 1-minute load average is above this")
    parser.add_argument("--max-wait", type=float, default=1800,
                        help="seconds to wait for a quiet machine before a round runs anyway")
    parser.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.json"),
                        help="results file the ensemble keys are merged into ('' for none); "
                             "its PNG is redrawn beside it")
    parser.add_argument("--tracking-uri", default=(Path(__file__).resolve().parents[1] / "runs"
                                                   / "mlruns").as_uri(),
                        help="MLflow store the results file and PNG are logged to")
    args = parser.parse_args(argv)
    sizes = [int(t) for t in str(args.trees).split(",") if t.strip()]
    command = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    print("command: " + command, flush=True)

    import numpy as np
    import pandas as pd
    from sklearn.datasets import make_classification

    from dist_dl.ensemble import train_ensemble
    from dist_dl.core.session import get_spark

    work = Path(tempfile.mkdtemp(prefix="dist_dl-bench-ensemble-"))
    x, y = make_classification(n_samples=args.rows, n_features=args.features,
                               n_informative=args.features // 2, n_classes=3, random_state=0)
    cols = [f"f{i}" for i in range(args.features)]
    pdf = pd.DataFrame(x, columns=cols)
    pdf["label"] = y.astype("int64")
    # Several files, as a table usually is: Spark then reads (and shuffles)
    # with both cores; one file would make that first stage single-threaded.
    path = str(work / "data")
    os.makedirs(path)
    for i, rows_i in enumerate(np.array_split(np.arange(len(pdf)), 8)):
        pdf.iloc[rows_i].to_parquet(os.path.join(path, f"part-{i}.parquet"), index=False)
    del pdf, x, y

    spark = get_spark("local[2]")
    factories = {trees: make_factory(trees) for trees in sizes}
    uri = (work / "mlruns").as_uri()
    out = str(work / "out")  # where the members' files go, until MLflow has them

    def spark_run(factory, seed):
        df = spark.read.parquet(path)
        return train_ensemble(df, factory, num_models=args.models, feature_cols=cols,
                              label_col="label", validation_fraction=VALIDATION_FRACTION,
                              seed=seed, output_dir=out, tracking_uri=uri)

    def warm_up():
        # Starts two Python workers (two tasks at once) and imports pandas,
        # pyarrow and scikit-learn in them. Spark stops a Python worker that
        # has been idle for a minute (PythonWorkerFactory), and waiting for a
        # quiet machine or another setup's run takes longer, so this runs
        # again before every Spark run: the other setups run in processes
        # that stay warm.
        small = spark.read.parquet(path).limit(2000)
        train_ensemble(small, factories[sizes[0]], num_models=2, feature_cols=cols,
                       label_col="label", output_dir=out, tracking_uri=uri)

    warm_up()

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import cloudpickle

    # Spawned (not forked: this process runs the JVM gateway's threads) and
    # warmed before timing, as Spark's Python workers are.
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_warm_worker, range(2)))
    shipped = {trees: _Shipped(cloudpickle.dumps(f)) for trees, f in factories.items()}

    from mlflow.tracking import MlflowClient

    from dist_dl.app.bench import CpuSampler

    # Per member size: (round, setup, wall, machine CPU) rows, phases, CPU by role, fits.
    rows = {t: [] for t in sizes}
    phases = {t: [] for t in sizes}
    cpus = {t: [] for t in sizes}
    fit_seconds = {t: {} for t in sizes}
    starts = []
    order = ("sequential", "spark", "2 processes")
    for r in range(args.rounds):
        load, others, quiet = wait_for_quiet(args.max_load, args.max_wait)
        starts.append((load, others, quiet))
        print(f"round {r}: load {load:.1f}, others {others:.2f} CPU s/s"
              f"{'' if quiet else ' (BUSY: waited the maximum, ran anyway)'}", flush=True)
        for trees in sizes:
            factory = factories[trees]
            for name in order[r % 3:] + order[:r % 3]:
                if name == "spark":
                    # The setup before it may have taken over a minute, and
                    # Spark stops Python workers idle that long: warm them
                    # again (untimed), as the other setups' processes are.
                    warm_up()
                    since = time.time() * 1000
                    driver0 = time.process_time()
                    with CpuSampler(interval=0.5) as sampler:
                        start = time.perf_counter()
                        wall, util, ens = _measure(lambda: spark_run(factory, r))
                        end = time.perf_counter()
                    cpu = _cpu_by_role(sampler, start, end)
                    # This process: the driver's work and the sampler's own reads.
                    cpu["driver"] = time.process_time() - driver0
                    metrics = MlflowClient(tracking_uri=uri).get_run(ens.run_id).data.metrics
                    fits = [metrics[f"member_{i}_fit_seconds"] for i in range(args.models)]
                    cpu["member fits"] = sum(fits)
                    cpus[trees].append(cpu)
                    members, vote = ens.member_scores, ens.score
                    phases[trees].append(_phase_seconds(spark.sparkContext, since))
                    note = (", ".join(f"{k} {v:.1f} s" for k, v in phases[trees][-1].items())
                            + "; CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
                else:
                    run = sequential if name == "sequential" else (
                        lambda *a: two_processes(pool, *a))
                    fac = factory if name == "sequential" else shipped[trees]
                    wall, util, (members, vote, fits) = _measure(
                        lambda: run(path, fac, args.models, cols, r))
                    note = ""
                fit_seconds[trees].setdefault(name, []).extend(fits)
                note = f"fits {min(fits):.1f}-{max(fits):.1f} s; " + note
                rows[trees].append((r, name, wall, util))
                print(f"  {trees:4d} trees {name:11s} {wall:6.1f} s  machine CPU {util:4.2f} s/s"
                      f"  load {os.getloadavg()[0]:4.1f}  vote {vote:.3f}, members "
                      f"{min(members):.3f}..{max(members):.3f}  {note}", flush=True)
    pool.shutdown()

    print(f"\n{args.models} forests x {','.join(map(str, sizes))} trees, {args.rows} rows x "
          f"{args.features} features, {args.rounds} rounds; load average at round starts "
          f"{min(s[0] for s in starts):.1f}-{max(s[0] for s in starts):.1f}, others' CPU "
          f"{min(s[1] for s in starts):.2f}-{max(s[1] for s in starts):.2f} s/s"
          f"{', some rounds BUSY' if not all(s[2] for s in starts) else ''}")
    ratios = {t: _size_report(t, rows[t], phases[t], cpus[t], fit_seconds[t]) for t in sizes}
    if args.results:
        _publish(args, command, sizes, ratios, starts)


def _publish(args, command, sizes, ratios, starts):
    """Merge this run's keys into the results file (both member sizes; the
    headline keys at the size where the Spark run is furthest from the
    ceiling) and log it with its PNG to MLflow."""
    from dist_dl.app.bench import GOALS, publish_results, result_entry

    extra = {"models": args.models, "rows": args.rows,
             "load_at_round_starts": [round(s[0], 2) for s in starts]}
    entries, of_ceiling = {}, {}
    for trees in sizes:
        speed, ceiling = ratios[trees]
        of_ceiling[trees] = [a / b for a, b in zip(speed, ceiling)]
        entries[f"ensemble_speedup.{trees}_trees"] = result_entry(
            speed, command=command, trees=trees, **extra)
        entries[f"ensemble_ceiling.{trees}_trees"] = result_entry(
            ceiling, command=command, trees=trees, **extra)
        entries[f"ensemble_vs_ceiling.{trees}_trees"] = result_entry(
            of_ceiling[trees], command=command, goal=GOALS["ensemble_vs_ceiling"],
            trees=trees, **extra)
    worst = min(sizes, key=lambda t: statistics.median(of_ceiling[t]))
    entries["ensemble_vs_ceiling"] = result_entry(
        of_ceiling[worst], command=command, goal=GOALS["ensemble_vs_ceiling"], trees=worst,
        note=f"the lower of the member sizes {sizes}: {worst} trees", **extra)
    entries["ensemble_speedup"] = result_entry(
        ratios[worst][0], command=command, goal=GOALS["ensemble_speedup"], trees=worst,
        note=f"at {worst} trees (the size furthest from the ceiling)", **extra)
    published = publish_results(args.results, entries, log=bool(args.tracking_uri),
                                tracking_uri=args.tracking_uri or None,
                                experiment_name="dist_dl benchmarks", run_name="ensemble",
                                own_prefixes=("ensemble_",))
    print(f"results: {published['results']}, {published['png']}; MLflow run "
          f"{published['run_id']} ({args.tracking_uri})")


if __name__ == "__main__":
    main()
