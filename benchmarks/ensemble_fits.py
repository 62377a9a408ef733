"""Is a fit slower inside a Spark task? The same random-forest fits, two at a
time, in two Spark tasks on local[2] and in two plain spawned processes.

Each task or process fits its half of one table (24,000 rows x 40 features)
three times: column-major (as Arrow hands a task its rows), row-major, and
column-major again; each fit is timed alone (wall and CPU seconds).

    PYTHONPATH=src .venv/bin/python benchmarks/ensemble_fits.py [--rounds 2] [--trees 60]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def fits(x, y, trees: int) -> dict:
    """{layout: (wall s, CPU s)} of the same fit on three copies of x."""
    import numpy as np
    from sklearn.ensemble import RandomForestClassifier

    out = {}
    for layout in ("F", "C", "F again"):
        data = np.ascontiguousarray(x) if layout == "C" else np.asfortranarray(x)
        model = RandomForestClassifier(n_estimators=trees, max_depth=12, random_state=0, n_jobs=1)
        wall, cpu = time.perf_counter(), time.process_time()
        model.fit(data, y)
        out[layout] = (time.perf_counter() - wall, time.process_time() - cpu)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trees", type=int, default=60)
    args = parser.parse_args(argv)

    import numpy as np
    import pandas as pd
    from sklearn.datasets import make_classification

    from dist_dl.core.session import get_spark

    x, y = make_classification(n_samples=48_000, n_features=40, n_informative=20, n_classes=3,
                               random_state=0)
    pdf = pd.DataFrame(x, columns=[f"f{i}" for i in range(40)])
    pdf["label"] = y
    trees = args.trees

    def task(batches):
        frame = pd.concat(list(batches))
        features = frame[[c for c in frame.columns if c.startswith("f")]]
        result = fits(features.to_numpy(dtype=np.float64), frame["label"].to_numpy(), trees)
        yield pd.DataFrame([{"fits": json.dumps(result)}])

    spark = get_spark("local[2]")
    # A local pandas frame becomes defaultParallelism (2) slices of
    # consecutive rows: the tasks get exactly the processes' halves.
    df = spark.createDataFrame(pdf).cache()
    if df.rdd.getNumPartitions() != 2:
        raise SystemExit("expected two partitions: run with local[2]")
    df.count()
    half = len(pdf) // 2
    halves = [(x[:half], y[:half]), (x[half:], y[half:])]
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(abs, range(2)))  # both processes started before timing
    seconds = {"spark tasks": [], "plain processes": []}
    for r in range(args.rounds):
        rows = df.mapInPandas(task, "fits string").collect()
        seconds["spark tasks"] += [w for row in rows for w, _ in json.loads(row.fits).values()]
        results = list(pool.map(fits, [h[0] for h in halves], [h[1] for h in halves],
                                [trees, trees]))
        seconds["plain processes"] += [w for res in results for w, _ in res.values()]
        print(f"round {r + 1}: spark tasks {rows[0].fits} {rows[1].fits}; "
              f"plain processes {results}", flush=True)
    pool.shutdown()
    spark.stop()
    for name, values in seconds.items():
        print(f"{name}: one fit {min(values):.2f}-{max(values):.2f} s, "
              f"median {sorted(values)[len(values) // 2]:.2f} s")


if __name__ == "__main__":
    main()
