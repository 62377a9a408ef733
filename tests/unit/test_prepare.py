"""The cases of tests/integration/test_prepare.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import os
import pyarrow.parquet as pq
import pytest

from imagedata import digit_images, encode, sample_photo

from dist_dl.prepare import ShardConfig, load_label_index, make_synthetic_images
from dist_dl.prepare.images import encode_image
from dist_dl.prepare.schema import COLUMNS


def _rows(path):
    return pq.ParquetDataset(path).read().to_pylist()


def test_grayscale_cmyk_png_and_alpha_are_converted_to_rgb_jpeg():
    from PIL import Image
    import io

    img, _ = digit_images(1)[0]
    rgba = img.convert("RGBA")
    for raw in (encode(img.convert("L")), encode(img.convert("CMYK")), encode(img, "PNG"),
                encode(rgba, "PNG"), encode(img.convert("P"), "GIF")):
        out = encode_image(raw)
        assert out.error is None
        with Image.open(io.BytesIO(out.data)) as back:
            assert (back.format, back.mode, back.size) == ("JPEG", "RGB", (32, 32))
    rgb_jpeg = encode(img)
    assert encode_image(rgb_jpeg).data == rgb_jpeg  # kept byte for byte


def test_bad_bytes_are_reported_with_a_reason():
    good = encode(digit_images(1)[0][0])
    assert encode_image(b"").error.startswith("empty:")
    assert encode_image(None).error.startswith("null:")
    assert encode_image(b"this is not an image").error.startswith("undecodable:")
    assert encode_image(good[: len(good) // 2]).error.startswith("undecodable:")


def test_resize_keeps_aspect_and_never_enlarges():
    photo = encode(sample_photo())  # 427 x 640
    out = encode_image(photo, resize_short_side=64, jpeg_quality=80)
    assert (out.height, out.width) == (64, 96)
    small = encode_image(encode(digit_images(1)[0][0]), resize_short_side=64)
    assert (small.height, small.width) == (32, 32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(jpeg_quality=0), "jpeg_quality"),
    (dict(resize_short_side=2), "resize_short_side"),
    (dict(rows_per_row_group=0), "rows_per_row_group"),
])
def test_shard_config_is_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShardConfig(**kwargs)


def test_the_number_of_classes_comes_from_the_label_index_or_the_caller(tmp_path):
    from dist_dl.prepare import classes_of
    from dist_dl.prepare.labels import save_label_index

    save_label_index(str(tmp_path), {"cat": 0, "dog": 1, "eel": 2})
    assert classes_of(str(tmp_path), fix="-") == (3, ["cat", "dog", "eel"])
    assert classes_of(f"file://{tmp_path}", 3, fix="-") == (3, ["cat", "dog", "eel"])
    with pytest.raises(ValueError, match="classes=5 but the label index of .* has 3 labels"):
        classes_of(str(tmp_path), 5, fix="-")
    (tmp_path / "bare").mkdir()
    assert classes_of(str(tmp_path / "bare"), 2, fix="-") == (2, ["0", "1"])
    assert classes_of("s3://bucket/shards", 2, fix="-") == (2, ["0", "1"])  # no index readable
    with pytest.raises(ValueError, match=r"has no label index \(_labels.json\) beside it: run it"):
        classes_of(str(tmp_path / "bare"), fix="run it")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        classes_of(str(tmp_path / "nowhere"), 2, fix="-")


def test_synthetic_shards_have_the_documented_schema(tmp_path):
    summary = make_synthetic_images(str(tmp_path / "syn"), rows=7, image_size=24, classes=3,
                                    rows_per_row_group=3)
    assert summary["rows_written"] == 7
    files = sorted(p for p in os.listdir(tmp_path / "syn") if p.endswith(".parquet"))
    assert [pq.ParquetFile(tmp_path / "syn" / f).metadata.num_row_groups for f in files] == [1] * 3
    # Stored as prepare.schema says: uncompressed, no dictionary for the images.
    chunks = {c.path_in_schema: c for c in (pq.ParquetFile(tmp_path / "syn" / files[0]).metadata
                                          .row_group(0).column(i) for i in range(len(COLUMNS)))}
    assert {c.compression for c in chunks.values()} == {"UNCOMPRESSED"}
    assert not chunks["image"].has_dictionary_page and chunks["label"].has_dictionary_page
    rows = _rows(str(tmp_path / "syn"))
    assert list(rows[0]) == list(COLUMNS)
    assert rows[0]["image"][:2] == b"\xff\xd8" and rows[0]["height"] == 24
    assert load_label_index(str(tmp_path / "syn")) == {"class0": 0, "class1": 1, "class2": 2}
    with pytest.raises(FileExistsError, match="mode='overwrite'"):
        make_synthetic_images(str(tmp_path / "syn"), rows=2, image_size=24, classes=3)
