"""Reader throughput: images/s from make_dataset (one rank) against in-memory decoding.

Writes synthetic JPEG shards (typical stored ImageNet size: 256 px, cropped
to 224), then, in interleaved rounds within one process, times on the same
shards:

- petastorm, arrow: ``make_dataset(url, rank=0, num_workers=1, ...)`` with each
            reader (``ReaderConfig(reader=...)``), the training pipeline
            (reader -> shuffle -> decode + random resized crop + flip ->
            normalise -> batch -> prefetch); petastorm is left out where it
            does not import;
- baseline: the same JPEG bytes held in memory, through the same transform
            with the same parallelism (``tf.data`` from tensors, map with
            AUTOTUNE, batch, prefetch): what the reader would reach if reading
            Parquet cost nothing. The goal is reader >= 0.8 x baseline,
            for each reader;
- eager:    a plain Python loop of ``tf.io.decode_jpeg`` over the same bytes
            (one thread, decode only), for scale.

Reports medians over rounds, the spread, and CPU seconds per wall second.

    PYTHONPATH=src .venv/bin/python benchmarks/reader.py
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time


def _rate(make_iterator, warmup, batches, batch_size):
    """Images/s and CPU s per wall s of ``batches`` batches from a fresh iterator.

    Each window gets its own iterator, deleted afterwards: a live tf.data
    iterator keeps decoding in background threads to refill its (autotuned)
    prefetch buffers, which stole the cores from whichever pipeline was timed
    next and, after a pause, let it serve whole windows from memory.
    """
    iterator = make_iterator()
    for _ in range(warmup):
        next(iterator)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(iterator)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    del iterator
    gc.collect()
    return batches * batch_size / wall, cpu / wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=256, help="stored image side")
    parser.add_argument("--crop", type=int, default=224, help="output image side")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=24, help="batches per timed window")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches per window")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--results", default=os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "results.json"),
        help="results file reader_ratio is merged into ('' for none)")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dataclasses

    import pyarrow.parquet as pq
    import tensorflow as tf

    from dist_dl.prepare import make_synthetic_images
    from dist_dl.read import ReaderConfig, choose_reader, make_dataset, resolve_files
    from dist_dl.read.augment import train_transform

    workdir = args.workdir or tempfile.mkdtemp(prefix="dist_dl-bench-reader-")
    url = os.path.join(workdir, "shards")
    t0 = time.perf_counter()
    make_synthetic_images(url, rows=args.rows, image_size=args.image_size, classes=10,
                          rows_per_row_group=128, mode="overwrite")
    write_s = time.perf_counter() - t0
    config = ReaderConfig(image_size=args.crop)

    jpegs = []
    for f in resolve_files(url):
        jpegs += pq.read_table(f[len("file://"):], columns=["image"])["image"].to_pylist()
    mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1024

    def reader(name):
        chosen = dataclasses.replace(config, reader=name)
        return lambda: iter(make_dataset(url, 0, 1, args.batch_size, training=True,
                                         config=chosen))

    auto = choose_reader("auto")  # what make_dataset reads with here by default
    readers = ["arrow"] if auto == "arrow" else ["petastorm", "arrow"]

    def baseline():
        return iter(tf.data.Dataset.from_tensor_slices(tf.constant(jpegs)).repeat()
                    .shuffle(config.shuffle_buffer)
                    .map(lambda b: train_transform(b, config),
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
                    .batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))

    eager_batch = [tf.constant(b) for b in jpegs[:args.batch_size]]

    class _Eager:
        def __next__(self):
            for b in eager_batch:
                tf.io.decode_jpeg(b, channels=3)

    rounds = []
    for r in range(args.rounds):
        order = [(name, reader(name)) for name in readers] + [("baseline", baseline)]
        # Rotate which pipeline goes first, so none always runs on a cold or warm machine.
        order = order[r % len(order):] + order[:r % len(order)] + [("eager", _Eager)]
        row = {}
        for name, it in order:
            row[name], row[name + "_cpu"] = _rate(it, args.warmup, args.batches, args.batch_size)
        for name in readers:
            row[name + "_ratio"] = row[name] / row["baseline"]
        rounds.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)

    def med(key):
        return statistics.median(r[key] for r in rounds)

    summary = {
        "rows": args.rows, "stored_px": args.image_size, "crop_px": args.crop,
        "mean_jpeg_kb": round(mean_kb, 1), "batch_size": args.batch_size,
        "images_per_window": args.batches * args.batch_size, "rounds": args.rounds,
        "write_s": round(write_s, 1), "cores": os.cpu_count(),
        "baseline_img_s": round(med("baseline"), 1),
        "eager_decode_img_s": round(med("eager"), 1),
        "baseline_cpu_per_s": round(med("baseline_cpu"), 2),
    }
    for name in readers:
        summary.update({
            f"{name}_img_s": round(med(name), 1),
            f"{name}_ratio_median": round(med(name + "_ratio"), 3),
            f"{name}_ratio_min": round(min(r[name + "_ratio"] for r in rounds), 3),
            f"{name}_ratio_max": round(max(r[name + "_ratio"] for r in rounds), 3),
            f"{name}_cpu_per_s": round(med(name + "_cpu"), 2),
        })
    print(json.dumps(summary, indent=1))
    if args.results:
        from dist_dl.app.bench import GOALS, publish_results, result_entry

        # reader_ratio: the reader reader="auto" picks here (Petastorm where it
        # imports), as the training benchmark's workers read; each reader also
        # under its own key, and arrow against Petastorm on the same shards.
        entries = {f"reader_ratio.{name}": result_entry(
            [r[name + "_ratio"] for r in rounds], goal=GOALS["reader_ratio"],
            reader_images_per_second=summary[f"{name}_img_s"],
            baseline_images_per_second=summary["baseline_img_s"]) for name in readers}
        entries["reader_ratio"] = dict(entries[f"reader_ratio.{auto}"], reader=auto)
        if "petastorm" in readers:
            entries["reader_arrow_vs_petastorm"] = result_entry(
                [r["arrow"] / r["petastorm"] for r in rounds])
        published = publish_results(args.results, entries)
        print(f"results: {published['results']}, {published['png']}")
    return summary


if __name__ == "__main__":
    main()
