"""Scoring throughput: the served model's image decoding, and score_dataframe
end to end on local[2] Spark.

In interleaved rounds within one process, on the same encoded images:

- graph:    ``decode_images`` as the logged model runs it (one ``tf.function``
            over the batch: decode, crop, resize in TensorFlow's graph);
- eager:    the same ops image by image in eager mode (``_decode_one_by_one``,
            what ``decode_images`` did before, and still does to name an image
            that cannot be decoded): the baseline;

for two kinds of images: 8x8 digits (PNG, the model takes 8x8: per-image
overhead dominates) and photos (JPEG, 256-400 px, centre crop 0.875 and
resize to 224: the ImageNet evaluation transform). The two give the same
pixels (checked each round). The logged model's forward pass on batches of
64 decoded digits, the same way: ``traced`` (the one ``tf.function`` the
served model calls) against ``eager`` (the Keras model called directly,
the baseline); the same outputs (checked). Then ``score_dataframe`` of ``--rows`` rows of
digits on local[2] with a small CNN, rows/s, per round (the model loaded in
the Python workers by a warm-up first).

Then the Python workers' preparation (``dist_dl.core.pyworker``: PySpark's
per-task import-cache reset and full garbage collection, made cheap): in
each round, in alternating order, two fresh processes score ``--prep-rows``
rows in ``--partitions`` tasks on local[2], one as the library runs
(``on``) and one with ``DIST_DL_PREPARE_PYTHON_WORKER=0`` (``off``, the
baseline); each warms its Python workers first and times one job.

Writes ``scoring_decode_speedup.<kind>`` (graph / eager images per second),
``scoring_forward_speedup`` (traced / eager batches per second),
``scoring_forward_batches_per_second.<setup>``,
``scoring_rows_per_second``, ``decode_images_per_second.<kind>.<setup>``,
``scoring_worker_prep_speedup`` (on / off rows per second, per round) and
``scoring_rows_per_second.<n>_tasks.<on|off>`` to ``benchmarks/results.json``.

    PYTHONPATH=src .venv/bin/python benchmarks/scoring.py [--rounds 3] [--rows 200000] \
        [--partitions 64] [--prep-rows 100000]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _digits(count: int) -> list[bytes]:
    from PIL import Image
    from sklearn.datasets import load_digits

    out = []
    for pixels in load_digits().images[:count]:
        buffer = io.BytesIO()
        Image.fromarray((pixels * 255 / 16).astype("uint8"), mode="L").save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def _photos(count: int) -> list[bytes]:
    """JPEG crops of scikit-learn's two sample photos, 256 to 400 px a side."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = load_sample_images().images
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        h, w = (int(v) for v in rng.integers(256, 401, size=2))
        top = int(rng.integers(0, photo.shape[0] - h + 1))
        left = int(rng.integers(0, photo.shape[1] - w + 1))
        buffer = io.BytesIO()
        Image.fromarray(photo[top:top + h, left:left + w]).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def _rate(fn, images, spec, batch: int, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        for i in range(0, len(images), batch):
            fn(images[i:i + batch], spec)
    return repeat * len(images) / (time.perf_counter() - start)


def _forward_setups(uri: str, images: list) -> dict:
    """The served model's forward pass on one batch of decoded ``images``:
    ``traced`` as the logged model runs it, ``eager`` the Keras model
    called directly; checks that both give the same outputs."""
    import mlflow.pyfunc
    import numpy as np

    from dist_dl.tracking.preprocess import decode_images

    served = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    batch = decode_images(images, served.preprocessing)
    served._probabilities(images, list(range(len(images))))  # builds and traces the function
    setups = {"traced": lambda: served._forward(batch).numpy(),
              "eager": lambda: served._model(batch, training=False).numpy()}
    np.testing.assert_allclose(setups["traced"](), setups["eager"](), rtol=1e-5, atol=1e-6)
    return setups


def _calls_per_second(fn, seconds: float = 1.0) -> float:
    """Calls of ``fn`` per second over at least ``seconds``."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 10:
        fn()
        calls += 1
    return calls / elapsed


def _score_rate(spark, uri: str, rows: int, images, partitions: int | None = None) -> float:
    from pyspark.sql import functions as F

    from dist_dl.score import score_dataframe

    frame = (spark.range(0, rows, 1, partitions).withColumn("k", F.col("id") % 64)
             .join(F.broadcast(images), "k"))
    scored = score_dataframe(frame, uri, image_col="image", batch_size=256)
    start = time.perf_counter()
    count = scored.agg(F.count("prediction")).first()[0]
    seconds = time.perf_counter() - start
    assert count == rows, (count, rows)
    return rows / seconds


def _digit_scorer(spark):
    """A small CNN over 8x8 digits logged to a temporary store (its model
    URI), and a table of 64 digit PNGs keyed 0-63."""
    import mlflow

    from dist_dl.core import compat
    from dist_dl.tracking import ImagePreprocessing, log_keras_classifier

    spec = ImagePreprocessing(image_size=8, channels=1, mean=0.5, std=0.25)
    keras = compat.keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(spec.input_shape),
                              keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    mlflow.set_tracking_uri("file://" + os.path.join(tempfile.mkdtemp(), "mlruns"))
    uri = log_keras_classifier(model, spec).model_uri
    table = spark.createDataFrame(list(enumerate(_digits(64))), "k long, image binary")
    return uri, table


def _prep_child(rows: int, partitions: int) -> None:
    """One process's timed scoring job (see the module's docstring)."""
    from dist_dl.core.session import get_spark

    spark = get_spark("local[2]")
    uri, table = _digit_scorer(spark)
    _score_rate(spark, uri, 20_000, table, partitions)  # Python workers start, load the model
    print(json.dumps({"rows_per_second": _score_rate(spark, uri, rows, table, partitions)}),
          flush=True)


def _prep_rate(on: bool, rows: int, partitions: int) -> float:
    import subprocess

    from dist_dl.core.pyworker import SWITCH

    env = {k: v for k, v in os.environ.items() if k != SWITCH}
    if not on:
        env[SWITCH] = "0"
    done = subprocess.run([sys.executable, __file__, "--prep-child", str(rows), str(partitions)],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the scoring process ({'on' if on else 'off'}) failed: "
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["rows_per_second"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=64,
                        help="tasks of the worker-preparation comparison's job")
    parser.add_argument("--prep-rows", type=int, default=100_000)
    parser.add_argument("--prep-child", nargs=2, type=int, metavar=("ROWS", "PARTITIONS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--results", default=str(Path(__file__).resolve().parent / "results.json"),
                        help="results file to merge into ('' to skip)")
    args = parser.parse_args(argv)
    if args.prep_child:
        _prep_child(*args.prep_child)
        return {}

    import numpy as np

    from dist_dl.core.session import get_spark
    from dist_dl.tracking import ImagePreprocessing
    from dist_dl.tracking.preprocess import _decode_one_by_one, decode_images

    def graph(images, spec):
        return decode_images(images, spec)

    def eager(images, spec):
        # decode_images' normalisation, so both do the same work.
        batch = _decode_one_by_one(images, spec)
        return (batch * np.float32(spec.rescale) - np.float32(spec.mean)) / np.float32(spec.std)

    kinds = {
        "digits": (_digits(1024), ImagePreprocessing(image_size=8, channels=1, mean=0.5, std=0.25)),
        "photos": (_photos(128), ImagePreprocessing(image_size=224, channels=3, mean=0.5,
                                                    std=0.25, crop_fraction=0.875)),
    }
    for images, spec in kinds.values():  # trace the graphs; check the pixels agree
        np.testing.assert_array_equal(graph(images[:64], spec), eager(images[:64], spec))

    spark = get_spark("local[2]")
    uri, table = _digit_scorer(spark)
    forward = _forward_setups(uri, kinds["digits"][0][:64])

    rounds = []
    for r in range(args.rounds):
        # Python workers start and load the model, right before each timed
        # job: Spark ends a worker idle for a minute, and the comparison
        # below takes longer than that (in a run without this, the timed
        # jobs after it ran at 0.63-0.71 of the first round's rate).
        _score_rate(spark, uri, 20_000, table)
        row = {"score_rows_per_second": _score_rate(spark, uri, args.rows, table)}
        time.sleep(5.0)  # the Spark job's tail (JVM, Python workers) off the cores
        order = ["graph", "eager"] if r % 2 == 0 else ["eager", "graph"]
        for kind, (images, spec) in kinds.items():
            for setup in order:
                fn = graph if setup == "graph" else eager
                # Work of at least a second for each, on this machine.
                row[f"{kind}.{setup}"] = (_rate(fn, images, spec, batch=256, repeat=8)
                                          if kind == "digits" else
                                          _rate(fn, images, spec, batch=32, repeat=4))
            row[f"{kind}.speedup"] = row[f"{kind}.graph"] / row[f"{kind}.eager"]
        for setup in order:
            row[f"forward.{'traced' if setup == 'graph' else 'eager'}"] = _calls_per_second(
                forward["traced" if setup == "graph" else "eager"])
        row["forward.speedup"] = row["forward.traced"] / row["forward.eager"]
        for on in ([True, False] if r % 2 == 0 else [False, True]):
            row["prep_on" if on else "prep_off"] = _prep_rate(on, args.prep_rows, args.partitions)
        row["prep_speedup"] = row["prep_on"] / row["prep_off"]
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
        rounds.append(row)

    def med(key):
        return statistics.median(r[key] for r in rounds)

    summary = {key: round(med(key), 2) for key in rounds[0]}
    summary["load_average"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(summary, indent=1))
    if args.results:
        from dist_dl.app.bench import publish_results, result_entry

        entries = {}
        for kind in kinds:
            entries[f"scoring_decode_speedup.{kind}"] = result_entry(
                [r[f"{kind}.speedup"] for r in rounds], baseline="eager, image by image")
            for setup in ("graph", "eager"):
                entries[f"decode_images_per_second.{kind}.{setup}"] = result_entry(
                    [r[f"{kind}.{setup}"] for r in rounds])
        entries["scoring_forward_speedup"] = result_entry(
            [r["forward.speedup"] for r in rounds], baseline="the Keras model called eagerly",
            note="batches of 64 decoded 8x8 digits, a small CNN")
        for setup in ("traced", "eager"):
            entries[f"scoring_forward_batches_per_second.{setup}"] = result_entry(
                [r[f"forward.{setup}"] for r in rounds])
        entries["scoring_rows_per_second"] = result_entry(
            [r["score_rows_per_second"] for r in rounds], rows=args.rows,
            note="score_dataframe on local[2], 8x8 PNG digits, a small CNN, batch_size=256")
        tasks = f"{args.partitions}_tasks"
        entries["scoring_worker_prep_speedup"] = result_entry(
            [r["prep_speedup"] for r in rounds], baseline="DIST_DL_PREPARE_PYTHON_WORKER=0",
            rows=args.prep_rows, tasks=args.partitions,
            note="score_dataframe on local[2], a fresh process per setup and round")
        for setup in ("on", "off"):
            entries[f"scoring_rows_per_second.{tasks}.{setup}"] = result_entry(
                [r[f"prep_{setup}"] for r in rounds], rows=args.prep_rows)
        published = publish_results(args.results, entries)
        print(f"results: {published['results']}, {published['png']}")
    return summary


if __name__ == "__main__":
    main()
