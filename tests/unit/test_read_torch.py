"""The torch loader's parts that need no torch: argument errors (raised
before torch is imported or a file is read), the crop windows, Pillow's
decode into a batch slot, the decoding threads; and, where torch is
installed, the error for an image that does not decode. The loader on real
shards, and against the TensorFlow reader: tests/integration/test_torch_read.py."""
from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest

from dist_dl.read import ReaderConfig, make_loader
from dist_dl.read.augment import eval_window
from dist_dl.read.imaging import crop_draws, decode_into, train_window
from dist_dl.read.torchdata import decode_threads

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kwargs, message", [
    ({"decode": "tpu"}, r"decode must be one of \('cpu', 'gpu', 'synthetic'\), got 'tpu'"),
    ({"threads": 0}, "threads must be a positive int, got 0"),
    ({"decode_processes": 0}, "decode_processes must be a positive int, got 0"),
    ({"decode_processes": 2, "threads": 2}, "threads=2 and decode_processes=2: give one"),
    ({"decode_processes": 2, "decode": "synthetic"},
     "decode_processes decodes on the CPU: it goes with decode='cpu', not decode='synthetic'"),
    ({"prefetch": True}, "prefetch must be a positive int, got True"),
    ({"epoch": -1}, "epoch must be an int >= 0, got -1"),
    ({"rank": 2}, r"rank must be an int in \[0, 2\), got 2"),
    ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ({"num_workers": 0}, "num_workers must be a positive int, got 0"),
    ({"config": {"image_size": 8}}, "config must be a ReaderConfig, got dict"),
    ({"steps_per_epoch": 0}, "steps_per_epoch must be a positive int, got 0"),
])
def test_argument_errors_come_before_any_file_is_read(tmp_path, kwargs, message):
    arguments = {"rank": 0, "num_workers": 2, "batch_size": 4, **kwargs}
    # The dataset does not exist: the argument is named, not the missing folder.
    with pytest.raises(ValueError, match=message):
        make_loader(str(tmp_path / "nowhere"), arguments.pop("rank"),
                    arguments.pop("num_workers"), arguments.pop("batch_size"), **arguments)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="torchvision is installed here")
def test_gpu_decoding_without_torchvision_names_what_to_install(tmp_path):
    with pytest.raises(ImportError, match=r"decode='gpu' needs torchvision .*pip install "
                                          r"torchvision.*or use decode='cpu'"):
        make_loader(str(tmp_path), 0, 1, 4, decode="gpu")


def test_train_windows_keep_to_the_area_and_aspect_ratio_ranges():
    config = ReaderConfig(area_range=(0.08, 1.0), aspect_ratio_range=(3 / 4, 4 / 3))
    draws = crop_draws(np.random.default_rng(0), 2000)
    for height, width in ((427, 640), (640, 427), (97, 131), (8, 8)):
        windows = np.array([train_window(height, width, d, config) for d in draws])
        top, left, crop_h, crop_w = windows.T
        assert (top >= 0).all() and (left >= 0).all()
        assert (top + crop_h <= height).all() and (left + crop_w <= width).all()
        whole = (crop_h == height) & (crop_w == width)  # the fallback after 10 attempts
        area = crop_h * crop_w / (height * width)
        ratio = crop_w / crop_h
        # At least 0.1 of the area (TensorFlow's min_object_covered); the
        # ratio within its range but for the rounding of the width.
        assert (area[~whole] >= 0.1).all() and (area <= 1).all()
        assert (ratio[~whole] >= 3 / 4 - 0.5 / crop_h[~whole]).all()
        assert (ratio[~whole] <= 4 / 3 + 0.5 / crop_h[~whole]).all()
        if height > 64:
            assert whole.mean() < 0.05 and area.min() < 0.15 and area.max() > 0.75
    exact = ReaderConfig(area_range=(0.25, 0.25), aspect_ratio_range=(1.0, 1.0))
    windows = np.array([train_window(400, 400, d, exact) for d in draws[:200]])
    assert set(windows[:, 2]) == {200} and set(windows[:, 3]) == {200}
    assert len(set(windows[:, 0])) > 50 and len(set(windows[:, 1])) > 50  # placed anywhere


def test_the_eval_window_is_the_central_square_of_the_crop_fraction():
    config = ReaderConfig()
    assert eval_window(427, 640, config) == (27, 134, 373, 373)
    assert eval_window(640, 427, config) == (134, 27, 373, 373)
    assert eval_window(1, 1, config) == (0, 0, 1, 1)


def _jpeg(pixels) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


def test_decode_writes_the_resized_crop_into_its_slot_flipped_when_asked():
    # Left half dark, right half bright, a vertical ramp: a flip swaps the halves.
    pixels = np.zeros((300, 400, 3), np.uint8)
    pixels[:, 200:] = 200
    pixels[..., 1] = np.linspace(0, 255, 300, dtype=np.uint8)[:, None]
    jpeg = _jpeg(pixels)
    config = ReaderConfig(image_size=32)
    batch = np.zeros((2, 32, 32, 3), np.uint8)
    decode_into(batch[0], jpeg, config)
    decode_into(batch[1], jpeg, config, flip=True)
    image, flipped = batch.astype(int)
    assert image[:, :12, 0].mean() < 10 and image[:, -12:, 0].mean() > 190
    assert image[:4, :, 1].mean() < image[-4:, :, 1].mean() - 100  # rows stay in order
    assert np.abs(flipped - image[:, ::-1]).max() <= 1
    # A train crop: the draft decode (1/4 scale here) gives the same picture.
    draws = crop_draws(np.random.default_rng(1), 1)[0]
    decode_into(batch[0], jpeg, config, draws=draws)
    assert batch[0].std() > 0
    gray = np.asarray(np.broadcast_to(pixels[..., :1], pixels.shape))
    decode_into(batch[1], _jpeg(gray[..., 0].copy()), config)  # a grayscale JPEG comes out RGB
    assert np.abs(batch[1, ..., 0].astype(int) - batch[1, ..., 2]).max() == 0


def test_a_flip_writes_each_pixel_mirrored_with_its_channels_in_order():
    from dist_dl.read.imaging import _write

    pixels = np.random.default_rng(0).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    out = np.zeros_like(pixels)
    _write(out, pixels, flip=True)
    assert np.array_equal(out, pixels[:, ::-1])
    _write(out, pixels, flip=False)
    assert np.array_equal(out, pixels)
    # Strided (a slot of a wider array, a view of a bigger image): numpy's own copy.
    wide = np.zeros((7, 9, 3), np.uint8)
    every_other = np.random.default_rng(1).integers(0, 256, (7, 10, 3), dtype=np.uint8)[:, ::2]
    _write(wide[:, 2:7], every_other, flip=True)
    assert np.array_equal(wide[:, 2:7], every_other[:, ::-1])
    assert wide[:, :2].max() == 0 and wide[:, 7:].max() == 0


def test_decoding_threads_are_the_worker_s_share_of_the_cores():
    assert decode_threads({"OMP_NUM_THREADS": "3"}) == 3
    import os

    cores = len(os.sched_getaffinity(0))
    assert decode_threads({}) == cores
    shared = {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1",
              "DIST_DL_HOST_SHARE": f"1/{cores * 2}"}
    assert decode_threads(shared) == 1


def test_an_image_that_does_not_decode_is_named_by_its_row(tmp_path):
    pytest.importorskip("torch", reason="iterating the loader makes torch tensors")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dist_dl.prepare.schema import arrow_schema

    good = _jpeg(np.full((20, 20, 3), 90, np.uint8))
    rows = {"image": [good, b"not a jpeg"], "label": [0, 1], "label_name": ["a", "b"],
            "source_id": ["good.jpg", "broken.jpg"], "height": [20, 0], "width": [20, 0]}
    pq.write_table(pa.table(rows, schema=arrow_schema()), tmp_path / "part-0.parquet")
    loader = make_loader(str(tmp_path), 0, 1, 2, training=False,
                         config=ReaderConfig(image_size=8, reader="arrow"))
    with pytest.raises(ValueError, match="rank 0: the image of row 'broken.jpg' does not decode "
                                         r"\(UnidentifiedImageError"):
        next(iter(loader))


def test_the_scaled_decode_factor_is_pillows_draft_choice():
    # The simplejpeg path decodes at full scale only where Pillow's draft mode
    # would (dist_dl.read.imaging._dct_factor), and leaves the rest to Pillow.
    from PIL import Image

    from dist_dl.read.imaging import _dct_factor

    rng = np.random.default_rng(3)
    for _ in range(200):
        width, height = (int(v) for v in rng.integers(40, 2000, 2))
        crop_w, crop_h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        size = int(rng.choice([16, 64, 224]))
        image = Image.frombytes("RGB", (width, height), bytes(3 * width * height))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG")
        with Image.open(buffer) as jpeg:
            drafted = jpeg.draft("RGB", (max(1, width * size // crop_w),
                                         max(1, height * size // crop_h)))
            factor = 1 if drafted is None else round(width / drafted[1][2])
        assert _dct_factor(height, width, crop_h, crop_w, size) == factor, (
            width, height, crop_w, crop_h, size)
