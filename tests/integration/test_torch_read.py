"""The torch loader (dist_dl.read.make_loader) on shards written through
Spark: the plan's steps, every row once per epoch across the ranks with its
label, the rows and order the TensorFlow reader gives each rank; its
transforms against the TensorFlow reader's on the same photographs; and the
torch path in a Python without TensorFlow."""
from __future__ import annotations

import collections
import dataclasses
import io
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra: "
                                    "profiles dbr-16.4-ml and dbr-17.3-ml)")

from imagedata import seen_once, write_tree_shards  # noqa: E402
from no_tensorflow import env_without_tensorflow  # noqa: E402

from dist_dl.prepare import load_label_index  # noqa: E402
from dist_dl.read import Normalize, ReaderConfig, make_loader, steps_per_epoch  # noqa: E402

pytestmark = [pytest.mark.profile_subset_164, pytest.mark.profile_dbr19]

SMALL = ReaderConfig(image_size=16, shuffle_buffer=8, reader="arrow")
NEEDS_TF = "the comparison with the TensorFlow reader needs TensorFlow (profile dbr-17.3-ml)"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """An ImageNet-layout tree (15 images, 3 classes) as Parquet shards of
    2-row row groups, written through Spark."""
    return write_tree_shards(str(tmp_path_factory.mktemp("tree")))


def _epochs(loader, count):
    """``count`` epochs of a loader made with weights and source ids: per
    epoch, the batches as numpy."""
    return [[(x.numpy(), y.numpy(), w.numpy(), ids) for x, y, w, ids in loader]
            for _ in range(count)]


def _once(batches):
    """source_id -> label of the rows with weight 1, each seen once."""
    return seen_once((sid, y, w) for _, ys, ws, ids in batches for sid, y, w in zip(ids, ys, ws))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("training", [True, False])
def test_every_row_once_per_epoch_with_its_label_in_the_plan_s_steps(shards, training):
    import torch

    url, written = shards
    index = load_label_index(url)
    expected = {sid: index[wnid] for sid, wnid in written.items()}
    size, batch = 2, 3
    steps = steps_per_epoch(url, size, batch)
    loaders = [make_loader(url, rank, size, batch, training=training, config=SMALL, seed=5,
                           with_weights=True, include_source_id=True) for rank in range(size)]
    epochs = [_epochs(loader, 2) for loader in loaders]
    for rank, loader in enumerate(loaders):
        assert len(loader) == steps and [len(e) for e in epochs[rank]] == [steps, steps]
        assert loader.epoch == 2
    for epoch in range(2):
        assert _once(epochs[0][epoch] + epochs[1][epoch]) == expected
    orders = [[ids for *_, ids in e] for e in epochs[0]]
    assert (orders[0] != orders[1]) == training  # shuffled afresh each epoch in training only
    images, labels = next(iter(make_loader(url, 0, size, batch, training=training, config=SMALL)))
    assert images.shape == (batch, 3, 16, 16) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dtype == torch.int64
    normalised = Normalize(SMALL)(images)
    assert normalised.dtype == torch.float32 and -3 < normalised.mean().item() < 3


@pytest.mark.timeout(120)
def test_synthetic_decoding_keeps_the_rows_and_replaces_only_the_pixels(shards):
    import torch

    url, _ = shards
    made = {decode: list(make_loader(url, 0, 2, 3, config=SMALL, seed=5, decode=decode,
                                     with_weights=True, include_source_id=True))
            for decode in ("cpu", "synthetic")}
    assert len(made["cpu"]) == len(made["synthetic"])
    assert all(torch.equal(c[1], s[1]) and torch.equal(c[2], s[2]) and c[3] == s[3]
               for c, s in zip(made["cpu"], made["synthetic"]))
    images = [b[0] for b in made["synthetic"]]
    assert all(torch.equal(images[0], x) for x in images)  # made once, not per batch
    assert images[0].dtype == torch.uint8 and images[0].shape == (3, 3, 16, 16)
    assert images[0].is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(images[0], made["cpu"][0][0])


@pytest.mark.timeout(120)
def test_a_loader_closed_early_stops_its_thread_and_an_error_reaches_the_consumer(shards):
    import threading

    url, _ = shards
    batches = iter(make_loader(url, 0, 1, 2, config=SMALL, prefetch=1))
    next(batches)
    batches.close()
    assert not [t for t in threading.enumerate() if t.name == "dist_dl-loader"]
    broken = make_loader(url, 0, 1, 2, config=SMALL, prefetch=1)
    broken._batches = lambda epoch: (_ for _ in ()).throw(OSError("the shard went away"))
    with pytest.raises(OSError, match="the shard went away"):
        next(iter(broken))


def _reaped_and_unmapped(pids):
    """The decoding processes ``pids`` are reaped (no longer children of
    this process, not even as zombies), and no shared memory of theirs is
    still mapped or open here or left in /dev/shm."""
    import gc
    import os

    import psutil

    gc.collect()  # the frames of tracebacks in reference cycles, and the ring's views in them
    assert pids and not set(pids) & {p.pid for p in psutil.Process().children()}
    maps = open("/proc/self/maps").read()
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    assert "dist_dl-loader-batches" not in maps + "".join(fds)
    assert not [name for name in os.listdir("/dev/shm") if "dist_dl" in name]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("training", [True, False])
def test_decoding_processes_give_the_decoding_threads_batches_byte_for_byte(shards, training):
    url, _ = shards
    options = dict(training=training, config=SMALL, seed=7, with_weights=True,
                   include_source_id=True, prefetch=1)
    threads = make_loader(url, 0, 2, 2, threads=2, **options)
    expected = _epochs(threads, 1)
    threads.set_epoch(2)
    expected += _epochs(threads, 1)
    with make_loader(url, 0, 2, 2, decode_processes=2, **options) as loader:
        # The batches are kept as they come (numpy views, not copies): a
        # batch yielded out of a slot that the next batches overwrite would
        # differ from the threads' by the epoch's end.
        got = _epochs(loader, 1)
        pids, counted = loader.decode_pids, collections.Counter(loader.decoded)
        batches = iter(loader)  # epoch 1, left after its first batch
        next(batches)
        # Still under way: of its 4 batches, the second is queued (prefetch=1)
        # and the third waits for room, its iteration's slots in use.
        assert len(loader) == 4
        with pytest.raises(RuntimeError, match="rank 0: this loader is already being iterated"):
            next(iter(loader))
        batches.close()
        loader.set_epoch(2)  # the refused iteration took epoch 2's number
        before = collections.Counter(loader.decoded)
        got += _epochs(loader, 1)  # epoch 2, the same processes and slots
        assert loader.decode_pids == pids and len(pids) == 2
        counted += loader.decoded - before
        batches = iter(loader)
        next(batches)
        loader.close()  # under way: what is decoded comes, then the error; no crash, no hang
        try:
            assert len(list(batches)) <= 3
        except RuntimeError as exc:
            assert "rank 0: the loader's decoding processes are closed" in str(exc)
        assert loader.decode_pids == ()
    for want, have in zip(expected, got, strict=True):
        for (x, y, w, ids), (x2, y2, w2, ids2) in zip(want, have, strict=True):
            assert ids == ids2 and np.array_equal(y, y2) and np.array_equal(w, w2)
            assert x.dtype == x2.dtype and x.shape == x2.shape and x.tobytes() == x2.tobytes()
    assert counted == threads.decoded  # in epochs 0 and 2, image by image
    _reaped_and_unmapped(pids)


@pytest.mark.timeout(120)
def test_a_decoding_process_that_dies_stops_the_loader_with_an_error_naming_it(shards):
    import os
    import signal

    url, _ = shards
    loader = make_loader(url, 0, 1, 2, config=SMALL, seed=1, decode_processes=1, prefetch=1)
    batches = iter(loader)
    next(batches)
    (pid,) = loader.decode_pids
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"rank 0: decoding process 1 of 1 \(pid \d+\) was "
                                           r"killed by signal SIGKILL; the loader stops"):
        for _ in batches:
            pass
    with pytest.raises(RuntimeError, match="was killed by signal SIGKILL"):
        next(iter(loader))  # and stays stopped
    loader.close()
    _reaped_and_unmapped((pid,))


@pytest.mark.timeout(120)
def test_an_image_that_does_not_decode_in_a_process_is_named_as_by_the_threads(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from dist_dl.prepare.schema import arrow_schema

    good = io.BytesIO()
    Image.fromarray(np.full((20, 20, 3), 90, np.uint8)).save(good, "JPEG")
    rows = {"image": [good.getvalue(), b"not a jpeg"], "label": [0, 1], "label_name": ["a", "b"],
            "source_id": ["good.jpg", "broken.jpg"], "height": [20, 0], "width": [20, 0]}
    pq.write_table(pa.table(rows, schema=arrow_schema()), tmp_path / "part-0.parquet")
    errors, counts = [], []
    for options in ({}, {"decode_processes": 1}):
        loader = make_loader(str(tmp_path), 0, 1, 2, training=False, config=SMALL, **options)
        with loader, pytest.raises(ValueError, match="rank 0: the image of row 'broken.jpg' "
                                                     r"does not decode \(UnidentifiedImageError"
                                   ) as raised:
            next(iter(loader))
        # Pillow's message names its BytesIO object by its address.
        errors.append(re.sub(r"0x[0-9a-f]+", "0x...", str(raised.value)))
        counts.append(loader.decoded)
    assert errors[0] == errors[1] and counts[0] == counts[1] and sum(counts[0].values()) == 1


@pytest.mark.timeout(300)
def test_each_rank_reads_the_rows_of_the_tensorflow_reader_in_its_order(shards):
    pytest.importorskip("tensorflow", reason=NEEDS_TF)
    from dist_dl.read import make_dataset

    url, _ = shards
    # A one-row shuffle buffer keeps the seeded row-group order visible: both
    # readers then give a rank the same rows in the same order, epoch by epoch
    # (fill rows of weight 0 included).
    config = dataclasses.replace(SMALL, shuffle_buffer=1)
    for rank in range(2):
        ds = make_dataset(url, rank, 2, 2, config=config, seed=11, num_epochs=2,
                          with_weights=True, include_source_id=True)
        tf_ids = [[sid.decode() for sid in x["source_id"].numpy()] for x, _, _ in ds]
        loader = make_loader(url, rank, 2, 2, config=config, seed=11, with_weights=True,
                             include_source_id=True)
        torch_ids = [ids for epoch in _epochs(loader, 2) for *_, ids in epoch]
        assert torch_ids == tf_ids, rank
        assert torch_ids[:len(loader)] != torch_ids[len(loader):]  # a new order in epoch 1


def _photographs():
    """JPEGs (quality 90) of scikit-learn's two sample photographs (427 x 640)
    and of crops of them: landscape, portrait, halved, small."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    jpegs = []
    for photo in load_sample_images().images:
        for part in (photo, photo[:300, :200], photo[50:, 100:300], photo[::2, ::2],
                     photo[:97, :131]):
            out = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(part)).save(out, "JPEG", quality=90)
            jpegs.append(out.getvalue())
    return jpegs


@pytest.mark.timeout(120)
def test_eval_transform_matches_the_tensorflow_reader_within_the_stated_tolerance():
    tf = pytest.importorskip("tensorflow", reason=NEEDS_TF)
    from dist_dl.read.augment import eval_transform, eval_window
    from dist_dl.read.imaging import decode_into

    config = ReaderConfig()  # 224 pixels, 0.875 of the short side
    mean, std = np.array(config.mean) * 255, np.array(config.std) * 255
    for jpeg in _photographs():
        ours = np.zeros((224, 224, 3), np.uint8)
        decode_into(ours, jpeg, config)
        ours = ours.astype(np.float64)
        theirs = eval_transform(tf.constant(jpeg), config).numpy() * std + mean
        # The same window resized with antialiasing, as Pillow's bilinear filter does.
        shape = tf.io.extract_jpeg_shape(jpeg)
        crop = tf.io.decode_and_crop_jpeg(jpeg, tf.stack(eval_window(shape[0], shape[1], config)),
                                          channels=3)
        smooth = tf.image.resize(crop, [224, 224], method="bilinear", antialias=True).numpy()
        # Tolerances, in levels of 0..255 (measured on these images: mean 0.16
        # to 0.31, 99th percentile at most 0.86 against the antialiased resize;
        # mean up to 4.4 and 99th percentile up to 32 against the reader's).
        # Against the same window resized with antialiasing, both decode with
        # libjpeg's fast integer IDCT (decode_jpeg's default, dct_method='');
        # what is left is the resizes' rounding. (With the accurate IDCT, as
        # Pillow decodes: mean about 1, 99th percentile about 3.)
        error = np.abs(ours - smooth)
        assert error.mean() < 0.5 and np.percentile(error, 99) < 1.5, error.mean()
        # Against the TensorFlow reader, tf.image.resize without antialiasing
        # samples 2 x 2 pixels where Pillow averages the whole footprint: the
        # difference grows with the shrink (1.7 x for the whole photograph's
        # 373-pixel crop) at sharp edges, and stays at the decoders' ~1 where
        # the crop is enlarged or barely shrunk.
        error = np.abs(ours - theirs)
        assert error.mean() < 6 and np.percentile(error, 99) < 40, error.mean()


@pytest.mark.timeout(120)
def test_the_region_decoder_gives_tensorflows_decode_and_crop_pixels():
    """nvimgcodec's decode of a crop's window against TensorFlow's
    ``decode_and_crop_jpeg`` of the same window, both resized alike, on the
    evaluation window and on train crops; a JPEG it refuses goes on to the
    whole-image decoders."""
    tf = pytest.importorskip("tensorflow", reason=NEEDS_TF)
    pytest.importorskip("nvidia.nvimgcodec", reason="nvimgcodec is not installed (the `torch` "
                                                    "extra installs it on Linux)")
    from dist_dl.read import imaging
    from dist_dl.read.augment import eval_window
    from dist_dl.read.imaging import crop_draws, decode_into, train_window

    assert imaging.decoder_name().startswith("nvimgcodec")
    rng = np.random.default_rng(1)
    compared = 0
    for size in (224, 128):
        config = ReaderConfig(image_size=size)
        for jpeg in _photographs():
            shape = tf.io.extract_jpeg_shape(jpeg).numpy()
            for draws in (None, *crop_draws(rng, 2)):
                window = (eval_window(shape[0], shape[1], config) if draws is None
                          else train_window(shape[0], shape[1], draws, config))
                if imaging._dct_factor(shape[0], shape[1], window[2], window[3], size) > 1:
                    continue  # a scaled decode: Pillow's path, not this one
                ours = np.zeros((size, size, 3), np.uint8)
                assert decode_into(ours, jpeg, config, draws) == "region"
                crop = tf.io.decode_and_crop_jpeg(jpeg, list(window), channels=3)
                theirs = tf.image.resize(crop, [size, size], method="bilinear",
                                         antialias=True).numpy()
                # The stated tolerance, in levels of 0..255: mean below 0.5, 99th
                # percentile below 1.5 (measured on these images: as simplejpeg's,
                # the resizes' rounding; the decoded windows themselves differ
                # only at their edges, by chroma upsampling across the window's
                # border).
                error = np.abs(ours.astype(np.float64) - theirs)
                assert error.mean() < 0.5 and np.percentile(error, 99) < 1.5, \
                    (size, window, error.mean())
                compared += 1
    assert compared >= 30, compared
    # A JPEG cut off inside the window: refused by the region decoder, then
    # decoded whole by simplejpeg (refused too: strict) and Pillow, whose
    # error is the one raised.
    jpeg = _photographs()[0]
    cut = jpeg[:len(jpeg) // 2]
    assert imaging._decode_region(imaging._region_decoder(), imaging._fast_path()[1], cut, 224,
                                  ReaderConfig(), None) is imaging._REJECTED
    with pytest.raises(OSError, match="truncated"):
        decode_into(np.zeros((224, 224, 3), np.uint8), cut, ReaderConfig())


@pytest.mark.timeout(120)
def test_simplejpeg_and_torch_give_pillows_pixels_and_are_the_path_taken(monkeypatch):
    simplejpeg = pytest.importorskip(
        "simplejpeg", reason="simplejpeg is not installed (the `torch` extra installs it)")
    from PIL import Image
    from sklearn.datasets import load_sample_images

    from dist_dl.read import imaging
    from dist_dl.read.imaging import crop_draws, decode_into

    jpegs = _photographs()
    out = io.BytesIO()
    Image.fromarray(load_sample_images().images[0]).convert("L").save(out, "JPEG", quality=90)
    jpegs.append(out.getvalue())   # a grayscale JPEG comes out RGB on both paths
    monkeypatch.setattr(imaging, "_region_decoder", lambda: None)  # simplejpeg's path
    decoded, real = [], simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg",
                        lambda *a, **k: decoded.append(1) or real(*a, **k))
    rng = np.random.default_rng(0)
    for size in (224, 64):
        config = ReaderConfig(image_size=size)
        for k, jpeg in enumerate(jpegs):
            for draws in (None, crop_draws(rng, 1)[0]):
                fast, pillow = (np.zeros((size, size, 3), np.uint8) for _ in range(2))
                decode_into(fast, jpeg, config, draws, flip=bool(k % 2))
                with monkeypatch.context() as m:
                    m.setattr(imaging, "_fast_path", lambda: None)
                    decode_into(pillow, jpeg, config, draws, flip=bool(k % 2))
                # simplejpeg decodes with libjpeg's fast integer IDCT (as
                # TensorFlow's reader), Pillow with the accurate one (it offers
                # no other). Measured on these images: mean at most 1.09 levels,
                # 99th percentile at most 4. The same inputs every run (seeded
                # draws).
                error = np.abs(fast.astype(int) - pillow)
                assert error.mean() < 1.5 and np.percentile(error, 99) <= 5, (size, k)
    # Every full-scale decode went through simplejpeg; crops small enough for a
    # scaled decode (size 64 of these photographs) through Pillow's draft mode.
    assert len(decoded) >= len(jpegs) * 2, len(decoded)
    # torch resizes in pixel order and returns it: the copy into the batch is a
    # plain one (a planar result costs a strided copy as dear as the resize).
    resized = imaging._decode_fast(imaging._fast_path(), jpegs[0], 224, ReaderConfig(), None)
    assert resized.shape == (224, 224, 3) and resized.flags.c_contiguous, resized.strides


@pytest.mark.timeout(120)
def test_train_crops_are_drawn_as_the_tensorflow_reader_draws_them():
    tf = pytest.importorskip("tensorflow", reason=NEEDS_TF)
    from dist_dl.read.imaging import crop_draws, train_window

    config = ReaderConfig()
    count = 2000
    for height, width in ((427, 640), (300, 200)):
        ours = np.array([train_window(height, width, d, config)[2:]
                         for d in crop_draws(np.random.default_rng(0), count)])
        # Each of TensorFlow's draws from an op seed of its own: the same
        # 2000 draws in every run, so the comparison cannot flake.
        tf.random.set_seed(0)
        theirs = np.array([tf.image.sample_distorted_bounding_box(
            [height, width, 3], bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=i + 1,
            min_object_covered=0.1, aspect_ratio_range=config.aspect_ratio_range,
            area_range=config.area_range, max_attempts=10,
            use_image_if_no_bounding_boxes=True)[1].numpy()[:2] for i in range(count)])
        for name, stat in (("area", lambda hw: hw[:, 0] * hw[:, 1] / (height * width)),
                           ("aspect ratio", lambda hw: hw[:, 1] / hw[:, 0])):
            a, b = stat(ours), stat(theirs)
            # 2000 draws: between samples of either (other seeds), the means
            # moved by up to 0.01 and the deciles by up to 0.02 (4 seeds each,
            # both shapes). The extremes of a sample vary more; the unit
            # tests check the ranges.
            assert abs(a.mean() - b.mean()) < 0.03, (name, a.mean(), b.mean())
            assert np.allclose(np.percentile(a, [10, 50, 90]), np.percentile(b, [10, 50, 90]),
                               atol=0.05), name


_WITHOUT_TF = """
import sys

from dist_dl.read import Normalize, ReaderConfig, make_loader

config = ReaderConfig(image_size=16, reader="auto")
images, labels = next(iter(make_loader(sys.argv[1], 0, 2, 3, config=config, threads=2)))
print("batch", tuple(images.shape), tuple(Normalize(config)(images).shape), labels.tolist())
print("loaded", sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "keras", "torch"}))
"""


@pytest.mark.timeout(120)
def test_the_torch_path_needs_no_tensorflow(shards, tmp_path):
    url, _ = shards
    env = env_without_tensorflow(tmp_path / "site")
    check = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert "No module named 'tensorflow'" in check.stderr
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_WITHOUT_TF), url], env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "batch (3, 3, 16, 16) (3, 3, 16, 16)" in done.stdout
    assert "loaded ['torch']" in done.stdout
