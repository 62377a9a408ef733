"""Benchmark: an ensemble of n random forests on local[2] Spark against the same
n forests trained one after another in one process, on the same data.

Both sides read the same Parquet files, hold out the same fraction of rows,
train n forests (one core each, ``n_jobs=1``) on n random parts of the rest,
and score every forest on the held-out rows. A third setup, the same fits in
two warm plain processes without Spark, measures what two cores give on this
machine at all (its ceiling). The Spark side is
``train_ensemble`` end to end (so it also pays for its shuffle, the MLflow
run and the model it logs, to a temporary store); the Spark session and its
Python workers are started, and warmed up by one small ensemble, before any
timing. The two setups alternate for ``--rounds`` rounds; the report gives
medians, the spread, and CPU seconds per wall second of the whole machine
(from /proc/stat) during each run, since other load skews a 2-core machine.

Run:  PYTHONPATH=src .venv/bin/python benchmarks/ensemble.py [--models 4] [--rows 200000]
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


def _cpu_busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [float(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _measure(fn):
    cpu0, t0 = _cpu_busy_seconds(), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    return wall, (_cpu_busy_seconds() - cpu0) / wall, out


def make_factory(trees: int):
    # A closure, so Spark ships it by value (this script is not importable
    # from the Python workers).
    def forest(member):
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(n_estimators=trees, max_depth=12, random_state=member,
                                      n_jobs=1)

    return forest


def sequential(path, factory, n, feature_cols, validation_fraction, seed):
    """The same n forests, one after another, in this process."""
    import numpy as np
    import pandas as pd

    pdf = pd.read_parquet(path)
    rng = np.random.default_rng(seed)
    held_out = rng.random(len(pdf)) < validation_fraction
    x = pdf[feature_cols].to_numpy(dtype=np.float64)
    y = pdf["label"].to_numpy()
    x_train, y_train, x_val, y_val = x[~held_out], y[~held_out], x[held_out], y[held_out]
    part = rng.integers(0, n, len(y_train))
    scores = []
    for i in range(n):
        model = factory(i).fit(x_train[part == i], y_train[part == i])
        scores.append(float((model.predict(x_val) == y_val).mean()))
    return scores


def _fit_and_score(factory, i, x_train, y_train, x_val, y_val):
    model = factory(i).fit(x_train, y_train)
    return float((model.predict(x_val) == y_val).mean())


def two_processes(pool, path, factory, n, feature_cols, validation_fraction, seed):
    """The machine's own ceiling: the same fits in two warm plain processes,
    no Spark (what two cores give when nothing else is in the way)."""
    import numpy as np
    import pandas as pd

    pdf = pd.read_parquet(path)
    rng = np.random.default_rng(seed)
    held_out = rng.random(len(pdf)) < validation_fraction
    x = pdf[feature_cols].to_numpy(dtype=np.float64)
    y = pdf["label"].to_numpy()
    x_train, y_train, x_val, y_val = x[~held_out], y[~held_out], x[held_out], y[held_out]
    part = rng.integers(0, n, len(y_train))
    futures = [pool.submit(_fit_and_score, factory, i, x_train[part == i], y_train[part == i],
                           x_val, y_val) for i in range(n)]
    return [f.result() for f in futures]


def _warm_worker(_):
    import sklearn.ensemble  # noqa: F401

    return True


class _Shipped:
    """A cloudpickled factory, so that the closure reaches spawned processes."""

    def __init__(self, blob):
        self.blob = blob

    def __call__(self, i):
        import cloudpickle

        return cloudpickle.loads(self.blob)(i)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--trees", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import numpy as np
    import pandas as pd
    from sklearn.datasets import make_classification

    from dist_dl.ensemble import train_ensemble
    from dist_dl.session import get_spark

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
    factory = make_factory(args.trees)
    uri = (work / "mlruns").as_uri()

    def spark_run():
        df = spark.read.parquet(path)
        return train_ensemble(df, factory, num_models=args.models, feature_cols=cols,
                              label_col="label", tracking_uri=uri)

    # Warm-up: start the Python workers and import scikit-learn in them.
    small = spark.read.parquet(path).limit(2000)
    train_ensemble(small, factory, num_models=2, feature_cols=cols, label_col="label",
                   tracking_uri=uri)

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import cloudpickle

    # Spawned (not forked: this process runs the JVM gateway's threads) and
    # warmed before timing, as Spark's Python workers are.
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_warm_worker, range(2)))
    ship = cloudpickle.dumps(factory)

    rows = []
    order = ("sequential", "spark", "2 processes")
    for r in range(args.rounds):
        for name in order[r % 3:] + order[:r % 3]:
            if name == "2 processes":
                wall, util, scores = _measure(lambda: two_processes(
                    pool, path, _Shipped(ship), args.models, cols, 0.2, r))
                note = f"members {min(scores):.3f}..{max(scores):.3f}"
            elif name == "spark":
                wall, util, ens = _measure(spark_run)
                note = (f"ensemble acc {ens.score:.3f}, members {min(ens.member_scores):.3f}.."
                        f"{max(ens.member_scores):.3f}")
            else:
                wall, util, scores = _measure(lambda: sequential(
                    path, factory, args.models, cols, 0.2, r))
                note = f"members {min(scores):.3f}..{max(scores):.3f}"
            rows.append((r, name, wall, util))
            # The load average shows how much else ran: on a shared 2-core
            # machine other jobs take cores from the parallel side first.
            print(f"round {r} {name:10s} {wall:7.1f} s  machine CPU {util:4.2f} s/s  "
                  f"load {os.getloadavg()[0]:4.1f}  {note}", flush=True)

    seq = [w for _, n, w, _ in rows if n == "sequential"]
    par = [w for _, n, w, _ in rows if n == "spark"]
    two = [w for _, n, w, _ in rows if n == "2 processes"]
    pool.shutdown()
    print(f"\n{args.models} forests x {args.trees} trees, {args.rows} rows x {args.features} "
          f"features, {args.rounds} rounds, load average now {os.getloadavg()[0]:.1f}")
    for name, times in (("sequential", seq), ("spark local[2]", par), ("2 processes", two)):
        print(f"{name}: median {statistics.median(times):.1f} s "
              f"(range {min(times):.1f}-{max(times):.1f})")
    # Per round: the runs of one round ran back to back.
    speed = [s / p for s, p in zip(seq, par)]
    ceiling = [s / t for s, t in zip(seq, two)]
    print(f"speed-up of spark over sequential: median of rounds {statistics.median(speed):.2f}x "
          f"(per round {', '.join(f'{v:.2f}' for v in speed)})")
    print(f"machine ceiling (2 processes over sequential): median of rounds "
          f"{statistics.median(ceiling):.2f}x "
          f"(per round {', '.join(f'{v:.2f}' for v in ceiling)})")
    print(f"spark / ceiling: "
          f"{statistics.median(speed) / statistics.median(ceiling):.2f}")


if __name__ == "__main__":
    main()
