"""Pre-resized shards: decode rate and preparation cost at max_side = N.

Makes ImageNet-like JPEGs (about 500x375, quality 90) cut from the two real
photographs scikit-learn ships (640x427: random windows of 40 to 100 % of
the area, aspect 3:4 to 4:3, scaled to a longer side of ``--long-side``,
flipped at random), then:

- prepares them as ``prepare_image_dataset`` does
  (:func:`dist_dl.prepare.images.encode_image`) unchanged and with
  ``max_side`` = 500, 320 and 256, in interleaved rounds: CPU seconds per
  1,000 images (unchanged: the validating decode every image gets; with a
  cap: decode, resize, re-encode; one thread);
- times, in interleaved rounds within one process, a decode-only loop over
  each setting's stored bytes: ``tf.io.decode_jpeg`` one image at a time on
  one thread (the decode-only loop of benchmarks/reader.py), or Pillow's
  decode where TensorFlow is not installed. Images per CPU-second (the loop
  is one thread, so this is the rate of one core, and other processes on
  the machine change it little) and per second of wall time; the gain of
  each N is its rate per CPU-second over the unchanged one in the same
  round (median of the rounds). The preparation pays for itself after
  ``break_even_epochs``: its extra CPU time over the unchanged write,
  divided by the decode time it saves per epoch.

Writes ``max_side.decode_gain_<N>``,
``max_side.decode_images_per_cpu_second.<N>`` and
``max_side.prepare_cpu_s_per_1000.<N>`` (``unchanged`` for no cap) to
``benchmarks/results.json``.

    PYTHONPATH=src .venv/bin/python benchmarks/max_side.py
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time

SETTINGS = (None, 500, 320, 256)


def _name(cap) -> str:
    return "unchanged" if cap is None else str(cap)


def make_photos(count: int, long_side: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEGs (quality 90) cut from scikit-learn's sample photographs."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(a) for a in load_sample_images().images]
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        area = photo.width * photo.height * rng.uniform(0.4, 1.0)
        aspect = rng.choice([4 / 3, 3 / 2, 3 / 4, 2 / 3]) if rng.random() < 0.8 \
            else rng.uniform(3 / 4, 4 / 3)
        w = min(photo.width, round((area * aspect) ** 0.5))
        h = min(photo.height, round((area / aspect) ** 0.5))
        x, y = rng.integers(0, photo.width - w + 1), rng.integers(0, photo.height - h + 1)
        window = photo.crop((x, y, x + w, y + h))
        scale = long_side / max(w, h)
        window = window.resize((max(1, round(w * scale)), max(1, round(h * scale))),
                               Image.Resampling.BICUBIC)
        if rng.random() < 0.5:
            window = window.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        window.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _decoder():
    """(name, function decoding a list of JPEG bytes once)."""
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
    except ImportError:
        from PIL import Image

        def pillow(images):
            for raw in images:
                with Image.open(io.BytesIO(raw)) as img:
                    img.load()

        return "Pillow decode", lambda images: (lambda: pillow(images))

    def decode(images):
        for raw in images:
            tf.io.decode_jpeg(raw, channels=3)

    def prepared(images):
        # Tensors made beforehand, as reader.py's decode-only loop does.
        tensors = [tf.constant(raw) for raw in images]
        return lambda: decode(tensors)

    return "tf.io.decode_jpeg", prepared


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--long-side", type=int, default=500,
                        help="longer side of the generated JPEGs (ImageNet's are mostly 500)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved decode rounds")
    parser.add_argument("--passes", type=int, default=2,
                        help="passes over the images per timed decode window")
    parser.add_argument("--prepare-rounds", type=int, default=3)
    parser.add_argument("--results", default=os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "results.json"), help="results file ('' for none)")
    args = parser.parse_args(argv)

    from PIL import Image

    from dist_dl.prepare.images import encode_image

    t0 = time.perf_counter()
    originals = make_photos(args.images, args.long_side)
    sizes = [Image.open(io.BytesIO(raw)).size for raw in originals]
    print(f"{len(originals)} JPEGs, mean sides {statistics.mean(map(max, sizes)):.0f} and "
          f"{statistics.mean(map(min, sizes)):.0f} px, "
          f"{statistics.mean(map(len, originals)) / 1024:.1f} KB, made in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)

    stored, prepare = {}, {_name(c): [] for c in SETTINGS}
    for r in range(args.prepare_rounds):
        order = SETTINGS[r % len(SETTINGS):] + SETTINGS[:r % len(SETTINGS)]
        for cap in order:
            cpu0 = time.process_time()
            out = [encode_image(raw, max_side=cap) for raw in originals]
            prepare[_name(cap)].append((time.process_time() - cpu0) / len(originals) * 1000)
            stored[_name(cap)] = [e.data for e in out]
    kept = {name: sum(a is b or a == b for a, b in zip(data, originals)) / len(originals)
            for name, data in stored.items()}

    label, prepared = _decoder()
    loops = {name: prepared(data) for name, data in stored.items()}
    for loop in loops.values():
        loop()  # warm up (first-call costs, caches)
    rounds = []
    names = list(loops)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        row = {}
        for name in order:
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.passes):
                loops[name]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            row[name] = args.passes * len(stored[name]) / cpu
            row[name + "_per_wall_s"] = args.passes * len(stored[name]) / wall
        rounds.append(row)
        print(json.dumps({k: round(v, 1) for k, v in row.items()}), flush=True)

    def med(key):
        return statistics.median(row[key] for row in rounds)

    summary = {"images": len(originals), "long_side": args.long_side, "decoder": label,
               "rounds": args.rounds, "cores": os.cpu_count(), "settings": {}}
    for name in names:
        gains = [row[name] / row["unchanged"] for row in rounds]
        extra = statistics.median(prepare[name]) - statistics.median(prepare["unchanged"])
        saved = 1000 / med("unchanged") - 1000 / med(name)  # decode CPU s per 1,000 per epoch
        summary["settings"][name] = {
            "mean_kb": round(statistics.mean(map(len, stored[name])) / 1024, 1),
            "kept_byte_for_byte": round(kept[name], 3),
            "decode_img_per_cpu_s": round(med(name), 1),
            "decode_img_per_wall_s": round(med(name + "_per_wall_s"), 1),
            "decode_gain": round(statistics.median(gains), 3),
            "decode_gain_range": [round(min(gains), 3), round(max(gains), 3)],
            "prepare_cpu_s_per_1000": round(statistics.median(prepare[name]), 2),
            "break_even_epochs": round(extra / saved, 1) if saved > 0 and extra > 0 else None,
        }
    print(json.dumps(summary, indent=1))
    if args.results:
        from dist_dl.app.bench import publish_results, result_entry

        entries = {}
        for name in names:
            s = summary["settings"][name]
            entries[f"max_side.decode_images_per_cpu_second.{name}"] = result_entry(
                [row[name] for row in rounds], decoder=label,
                images_per_wall_second=s["decode_img_per_wall_s"], mean_kb=s["mean_kb"])
            entries[f"max_side.prepare_cpu_s_per_1000.{name}"] = result_entry(
                prepare[name], kept_byte_for_byte=s["kept_byte_for_byte"])
            if name != "unchanged":
                entries[f"max_side.decode_gain_{name}"] = result_entry(
                    [row[name] / row["unchanged"] for row in rounds], decoder=label,
                    long_side=args.long_side, break_even_epochs=s["break_even_epochs"])
        published = publish_results(args.results, entries, own_prefixes=("max_side.",))
        print(f"results: {published['results']}, {published['png']}")
    return summary


if __name__ == "__main__":
    main()
