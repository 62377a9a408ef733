"""Reader throughput: images/s from make_dataset (one rank) against in-memory decoding.

Writes JPEG shards of ImageNet-like photographs (``--images photos``, the
default: cuts of scikit-learn's two sample photographs with their longer side
500 px, quality 90, as benchmarks/max_side.py makes them) or of synthetic
images (``--images synthetic``, ``--image-size`` square), cropped to 224,
then, in interleaved rounds within one process, times on the same shards:

- petastorm, arrow: ``make_dataset(url, rank=0, num_workers=1, ...)`` with each
            reader (``ReaderConfig(reader=...)``), the training pipeline as
            train_distributed's workers read (reader -> shuffle -> decode +
            random resized crop + resize + flip to uint8 pixels -> batch ->
            prefetch; ``normalize=False``: the model normalises); petastorm
            is left out where it does not import;
- normalized: the arrow (or auto) reader with ``normalize=True`` (the
            images normalised to float32 on the CPU, make_dataset's
            default): what ending at uint8 saves;
- baseline: the same JPEG bytes held in memory, through the same transform
            with the same parallelism (``tf.data`` from tensors, map with
            AUTOTUNE, batch, prefetch): what the reader would reach if reading
            Parquet cost nothing. The goal is reader >= 0.8 x baseline,
            for each reader;
- torch:    the torch reader, ``make_loader(url, 0, 1, ...)`` decoding on
            the CPU in threads (nvimgcodec's region decode, else simplejpeg,
            and torch's resize; else Pillow: ``imaging.decoder_name()``),
            where torch imports;
- eager:    a plain Python loop of ``tf.io.decode_jpeg`` over the same bytes
            (one thread, decode only): the decode limit per core;
- pillow:   a plain Python loop of Pillow's decode + random resized crop +
            flip (``dist_dl.read.imaging.decode_into`` held to Pillow, one
            thread);
- simplejpeg: the same loop on decode_into's simplejpeg + torch path,
            where both import;
- region:   the same loop on decode_into's nvimgcodec region decode +
            torch path, where nvimgcodec imports.

Before the rounds, the cost of reading the shards themselves: one file of
them rewritten by pyarrow in four layouts (Snappy or none, with or without
a dictionary for the image column; the library writes "none, no
dictionary", ``dist_dl.prepare.schema.PARQUET_OPTIONS``), each read row
group by row group as the arrow reader does (``read_row_group`` then
``to_numpy()`` of the image column), best of four passes: microseconds of
CPU per image (``parquet_read_us_per_image.<layout>``).

Reports medians over rounds, the spread, CPU seconds per wall second, and
images per CPU-second (each pipeline's rate over the CPU it used). Writes
``reader_ratio`` (goal 0.8), ``reader_per_core`` and ``reader_vs_decode``
(images per CPU-second against the decode-only loop's; goal 0.8), with
``.torch`` keys for the torch reader and ``.normalized`` ones for the
pipeline that normalises on the CPU.

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
    parser.add_argument("--images", choices=("photos", "synthetic"), default="photos")
    parser.add_argument("--image-size", type=int, default=256,
                        help="stored image side (--images synthetic)")
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
    if args.images == "photos":
        import sys

        from dist_dl.prepare.synthetic import write_image_shards

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from max_side import make_photos

        write_image_shards(url, make_photos(args.rows, 500), [i % 10 for i in range(args.rows)],
                           10, mode="overwrite", source="photo", rows_per_row_group=128)
    else:
        make_synthetic_images(url, rows=args.rows, image_size=args.image_size, classes=10,
                              rows_per_row_group=128, mode="overwrite")
    write_s = time.perf_counter() - t0
    # As train_distributed's workers read: uint8 pixels, the model normalises.
    config = ReaderConfig(image_size=args.crop, normalize=False)

    jpegs = []
    paths = [f[len("file://"):] for f in resolve_files(url)]
    for path in paths:
        jpegs += pq.read_table(path, columns=["image"])["image"].to_pylist()
    mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1024
    layouts = _parquet_layouts(paths[0], workdir)
    print(json.dumps({"parquet_read_us_per_image": layouts}), flush=True)

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

    import numpy as np

    from dist_dl.read.imaging import crop_draws, decode_into

    pillow_out = np.empty((args.crop, args.crop, 3), np.uint8)
    pillow_rng = np.random.default_rng(0)

    from dist_dl.read import imaging

    fast_path, region_decoder = imaging._fast_path, imaging._region_decoder

    class _Pillow:
        fast = region = False

        def __next__(self):
            draws = crop_draws(pillow_rng, args.batch_size)
            # decode_into picks its implementation per image through
            # imaging._fast_path and imaging._region_decoder: held to one here.
            imaging._fast_path = fast_path if self.fast else (lambda: None)
            imaging._region_decoder = region_decoder if self.region else (lambda: None)
            try:
                for i, b in enumerate(jpegs[:args.batch_size]):
                    decode_into(pillow_out, b, config, draws[i], bool(i % 2))
            finally:
                imaging._fast_path, imaging._region_decoder = fast_path, region_decoder

    class _Simplejpeg(_Pillow):
        fast = True

    class _Region(_Pillow):
        fast = region = True

    has_region = fast_path() is not None and region_decoder() is not None
    torch_loader = _torch_reader(url, config, args.batch_size)
    def normalised():
        chosen = dataclasses.replace(config, reader=auto, normalize=True)
        return iter(make_dataset(url, 0, 1, args.batch_size, training=True, config=chosen))

    pipelines = ([(name, reader(name)) for name in readers] + [("baseline", baseline)]
                 + [("normalized", normalised)])
    if torch_loader is not None:
        pipelines.append(("torch", torch_loader))
    rounds = []
    for r in range(args.rounds):
        # Rotate which pipeline goes first, so none always runs on a cold or warm machine.
        order = (pipelines[r % len(pipelines):] + pipelines[:r % len(pipelines)]
                 + [("eager", _Eager), ("pillow", _Pillow)]
                 + ([("simplejpeg", _Simplejpeg)] if fast_path() is not None else [])
                 + ([("region", _Region)] if has_region else []))
        row = {}
        for name, it in order:
            row[name], row[name + "_cpu"] = _rate(it, args.warmup, args.batches, args.batch_size)
            row[name + "_per_cpu_s"] = row[name] / max(row[name + "_cpu"], 1e-9)
        for name in readers:
            row[name + "_ratio"] = row[name] / row["baseline"]
        for name in readers + ["normalized"] + (["torch"] if torch_loader is not None else []):
            row[name + "_vs_decode"] = row[name + "_per_cpu_s"] / row["eager_per_cpu_s"]
        rounds.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)

    def med(key):
        return statistics.median(r[key] for r in rounds)

    summary = {
        "rows": args.rows, "images": args.images,
        "stored_px": args.image_size if args.images == "synthetic" else "longer side 500",
        "crop_px": args.crop,
        "mean_jpeg_kb": round(mean_kb, 1), "batch_size": args.batch_size,
        "images_per_window": args.batches * args.batch_size, "rounds": args.rounds,
        "write_s": round(write_s, 1), "cores": os.cpu_count(),
        "baseline_img_s": round(med("baseline"), 1),
        "eager_decode_img_s": round(med("eager"), 1),
        "eager_decode_per_cpu_s": round(med("eager_per_cpu_s"), 1),
        "pillow_img_s": round(med("pillow"), 1),
        "pillow_per_cpu_s": round(med("pillow_per_cpu_s"), 1),
        **({"simplejpeg_per_cpu_s": round(med("simplejpeg_per_cpu_s"), 1)}
           if fast_path() is not None else {}),
        **({"region_per_cpu_s": round(med("region_per_cpu_s"), 1)} if has_region else {}),
        "torch_decoder": imaging.decoder_name(),
        "baseline_cpu_per_s": round(med("baseline_cpu"), 2),
        "baseline_per_cpu_s": round(med("baseline_per_cpu_s"), 1),
    }
    for name in readers:
        summary.update({
            f"{name}_img_s": round(med(name), 1),
            f"{name}_ratio_median": round(med(name + "_ratio"), 3),
            f"{name}_ratio_min": round(min(r[name + "_ratio"] for r in rounds), 3),
            f"{name}_ratio_max": round(max(r[name + "_ratio"] for r in rounds), 3),
            f"{name}_cpu_per_s": round(med(name + "_cpu"), 2),
        })
    for name in readers + ["normalized"] + (["torch"] if torch_loader is not None else []):
        summary.update({
            f"{name}_img_s": round(med(name), 1),
            f"{name}_cpu_per_s": round(med(name + "_cpu"), 2),
            f"{name}_per_cpu_s": round(med(name + "_per_cpu_s"), 1),
            f"{name}_vs_decode_median": round(med(name + "_vs_decode"), 3),
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
        # Per core: the pipeline's images per CPU-second, and that against the
        # decode-only loop's (issue 31's goal: 0.8), on these images.
        images = {"images": args.images, "mean_jpeg_kb": summary["mean_jpeg_kb"]}
        variants = ([(auto, "", "uint8")] + [("normalized", ".normalized", "float32")]
                    + ([("torch", ".torch", "uint8")] if torch_loader else []))
        for name, suffix, pixels in variants:
            reader_name = auto if name == "normalized" else name
            entries[f"reader_per_core{suffix}"] = result_entry(
                [r[name + "_per_cpu_s"] for r in rounds], reader=reader_name, output=pixels,
                **images)
            decoder = {"decoder": summary["torch_decoder"]} if name == "torch" else {}
            entries[f"reader_vs_decode{suffix}"] = result_entry(
                [r[name + "_vs_decode"] for r in rounds], goal=0.8, reader=reader_name,
                output=pixels,
                decode_images_per_cpu_second=summary["eager_decode_per_cpu_s"],
                pillow_images_per_cpu_second=summary["pillow_per_cpu_s"], **decoder, **images)
        # The decode loops per CPU-second against the decode-only loop's, by decoder.
        for name in ("pillow", "simplejpeg", "region"):
            if name + "_per_cpu_s" in rounds[0]:
                entries[f"decode_vs_decode.{name}"] = result_entry(
                    [r[name + "_per_cpu_s"] / r["eager_per_cpu_s"] for r in rounds], **images)
        for layout, micros in layouts.items():
            entries[f"parquet_read_us_per_image.{layout}"] = result_entry(
                [micros], **images)
        published = publish_results(args.results, entries)
        print(f"results: {published['results']}, {published['png']}")
    return summary


def _parquet_layouts(path, workdir, passes=4):
    """CPU microseconds per image to read the file at ``path`` rewritten in
    each layout (best of ``passes``), as the arrow reader reads a row group."""
    import pyarrow.parquet as pq

    from dist_dl.prepare.schema import PARQUET_OPTIONS

    table = pq.read_table(path)
    rows_per_group = pq.ParquetFile(path).metadata.row_group(0).num_rows
    others = [c for c in table.column_names if c != "image"]
    layouts = {
        "snappy_dictionary": {"compression": "snappy", "use_dictionary": True},
        "snappy_plain": {"compression": "snappy", "use_dictionary": others},
        "none_dictionary": {"compression": "none", "use_dictionary": True},
        "none_plain": PARQUET_OPTIONS,   # what the library writes
    }
    micros = {}
    for name, options in layouts.items():
        copy = os.path.join(workdir, f"layout-{name}.parquet")
        pq.write_table(table, copy, row_group_size=rows_per_group, **options)
        best = float("inf")
        for _ in range(passes):
            reader = pq.ParquetFile(copy)
            start = time.process_time()
            for group in range(reader.num_row_groups):
                reader.read_row_group(group, columns=["image"],
                                      use_threads=False).column("image").to_numpy()
            best = min(best, time.process_time() - start)
        micros[name] = round(best / table.num_rows * 1e6, 1)
    return micros


def _torch_reader(url, config, batch_size):
    """The torch reader's batches, epoch after epoch (None without torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from dist_dl.read.torchdata import make_loader

    def batches():
        loader = make_loader(url, 0, 1, batch_size, training=True, config=config, seed=0)
        while True:
            yield from loader

    return batches


if __name__ == "__main__":
    main()
