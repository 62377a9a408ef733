"""Pre-resized shards: ``max_side`` in encode_image, ShardConfig and DataConfig
(no Spark; the end-to-end write is in tests/integration/test_prepare.py)."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from imagedata import digit_images, encode, sample_photo

from dist_dl.prepare import ShardConfig
from dist_dl.prepare.config import DataConfig
from dist_dl.prepare.images import encode_image, stored_size

pytestmark = pytest.mark.timeout(60)


def _decoded(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    assert (img.format, img.mode) == ("JPEG", "RGB")
    return img


def test_the_longer_side_is_capped_and_the_aspect_ratio_kept():
    landscape = encode(sample_photo())  # 640 x 427
    portrait = encode(sample_photo().transpose(Image.Transpose.ROTATE_90))  # 427 x 640
    for raw, size in ((landscape, (320, 214)), (portrait, (214, 320))):
        out = encode_image(raw, max_side=320, jpeg_quality=85)
        assert out.error is None and (out.width, out.height) == size
        assert _decoded(out.data).size == size
        assert abs(max(size) / min(size) - 640 / 427) < 0.01


def test_an_image_within_the_cap_is_kept_byte_for_byte():
    photo = encode(sample_photo())
    for cap in (640, 1000):
        out = encode_image(photo, max_side=cap)
        assert out.data == photo and (out.width, out.height) == (640, 427)
    png = encode(digit_images(1)[0][0], "PNG")  # not a JPEG: converted, not resized
    out = encode_image(png, max_side=500)
    assert (out.width, out.height) == (32, 32) and _decoded(out.data).size == (32, 32)


def test_with_resize_short_side_the_short_side_is_set_first_then_the_cap_wins():
    photo = encode(sample_photo())
    assert stored_size((640, 427), 256, 320) == (320, 213)  # the cap wins
    assert stored_size((640, 427), 256, 500) == (384, 256)  # the cap does not bite
    assert stored_size((640, 427), 512, 320) == (320, 214)  # no enlargement, then the cap
    assert stored_size((100, 60), 256, 320) == (100, 60)
    assert stored_size((1000, 10), None, 8) == (8, 1)
    both = encode_image(photo, resize_short_side=256, max_side=320)
    assert (both.width, both.height) == (320, 213) and _decoded(both.data).size == (320, 213)
    short_only = encode_image(photo, resize_short_side=256, max_side=500)
    assert (short_only.width, short_only.height) == (384, 256)


def test_a_large_jpeg_is_decoded_in_draft_mode_close_to_a_full_decode(monkeypatch):
    """libjpeg's scaled decode (to at least twice the stored size) then the
    resize, stored at quality 95, differs from a full decode's resize by as
    much as storing that resize at quality 95 does (2.55 grey levels of 255
    on average, both): the draft decode adds nothing visible."""
    from PIL import JpegImagePlugin

    big = sample_photo().resize((2560, 1708), Image.Resampling.BICUBIC)
    raw = encode(big)
    drafts = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        result = draft(self, mode, size)
        drafts.append(self.size)
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    out = encode_image(raw, max_side=320, jpeg_quality=95)
    assert (out.width, out.height) == (320, 214)
    assert drafts == [(1280, 854)]  # decoded at half scale, not 2560 x 1708
    with Image.open(io.BytesIO(raw)) as full:
        plain = np.asarray(full.convert("RGB").resize((320, 214), Image.Resampling.BICUBIC,
                                                      reducing_gap=3.0), np.float32)
    stored = np.asarray(_decoded(out.data), np.float32)
    buf = io.BytesIO()
    Image.fromarray(plain.astype(np.uint8)).save(buf, format="JPEG", quality=95)
    reencoded = np.asarray(_decoded(buf.getvalue()), np.float32)
    # The stored image went through the quality-95 re-encode too: what the
    # draft decode adds to it is what must be small.
    draft_error = np.abs(stored - plain).mean()
    encode_error = np.abs(reencoded - plain).mean()
    print(f"mean absolute difference from a full decode's resize: {draft_error:.2f} "
          f"(the re-encode alone: {encode_error:.2f})")
    assert draft_error < encode_error + 0.5
    # A truncated file is still refused under draft decoding.
    cut = encode_image(raw[: len(raw) * 2 // 3], max_side=320)
    assert cut.data is None and cut.error.startswith("undecodable:")


@pytest.mark.parametrize("value", [4, 0, -1, True, 320.0, "320"])
def test_bad_values_are_refused_with_the_setting_named(value):
    photo = encode(digit_images(1)[0][0])
    with pytest.raises(ValueError, match=r"max_side must be an int >= 8 or None, got"):
        encode_image(photo, max_side=value)
    with pytest.raises(ValueError, match=r"ShardConfig\.max_side must be an int >= 8 or None"):
        ShardConfig(max_side=value)
    with pytest.raises(ValueError, match=r"data\.max_side must be an int >= 8 or None"):
        DataConfig(max_side=value)


def test_the_setting_travels_from_the_data_section_to_the_summary_record():
    config = DataConfig(resize_short_side=256, max_side=500, jpeg_quality=85).shard_config()
    assert config.max_side == 500
    assert config.encoding() == {"resize_short_side": 256, "max_side": 500, "jpeg_quality": 85}
    assert ShardConfig().encoding() == {"resize_short_side": None, "max_side": None,
                                        "jpeg_quality": 90}


def test_train_distributed_takes_max_side_for_a_dataframe_and_refuses_it_for_shards(tmp_path):
    from dist_dl.train.config import TrainConfig
    from dist_dl.train.driver import _resolve_inputs

    with pytest.raises(ValueError, match=r"TrainConfig\.max_side must be an int >= 8"):
        TrainConfig(max_side=4)
    # Shards are read as written: a max_side would silently do nothing.
    with pytest.raises(ValueError, match=r"max_side=320 sets the size a DataFrame's images are "
                                         r"stored at, .*ShardConfig\(max_side=320\)"):
        _resolve_inputs(str(tmp_path), None, TrainConfig(max_side=320), str(tmp_path), None)
    assert _resolve_inputs(str(tmp_path), None, TrainConfig(), str(tmp_path), None)[:2] == (
        str(tmp_path), None)


def test_the_run_logs_the_encoding_of_the_shards_it_trains_on(tmp_path):
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.train.driver import _encoding_params

    make_synthetic_images(str(tmp_path / "syn"), rows=2, image_size=16, classes=2,
                          jpeg_quality=80)
    assert _encoding_params(str(tmp_path / "syn")) == {
        "data.resize_short_side": None, "data.max_side": None, "data.jpeg_quality": 80}
    assert _encoding_params(str(tmp_path)) == {}  # no summary: nothing logged
    assert _encoding_params("s3://bucket/shards") == {}  # not readable here


def test_the_mlflow_run_gets_data_max_side_beside_train_max_side(tmp_path):
    """What train_distributed logs when it opens the run (no worker starts)."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from dist_dl.prepare import make_synthetic_images
    from dist_dl.train.config import TrainConfig
    from dist_dl.train.driver import _log_params

    shards = str(tmp_path / "shards")
    make_synthetic_images(shards, rows=2, image_size=16, classes=2)
    with open(f"{shards}/_summary.json") as f:
        summary = json.load(f)
    summary["encoding"]["max_side"] = 320  # as a DataFrame materialised with max_side=320
    with open(f"{shards}/_summary.json", "w") as f:
        json.dump(summary, f)
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    plan = SimpleNamespace(rows=2, row_groups=1, steps_per_epoch=1)
    _log_params(client, run_id, TrainConfig(max_side=320), "small_cnn", "local", shards, None,
                plan, None, 1, 2, {}, str(tmp_path / "ckpt"))
    params = client.get_run(run_id).data.params
    assert (params["train.max_side"], params["data.max_side"]) == ("320", "320")
    assert (params["data.resize_short_side"], params["data.jpeg_quality"]) == ("None", "90")
