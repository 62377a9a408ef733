"""One image in, one stored JPEG (or a reason it was rejected) out.

Runs inside Spark tasks (and in the synthetic generator): Pillow only, no
Spark, no TensorFlow.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

from dist_dl.core.locations import is_remote, local_path

__all__ = ["EncodedImage", "encode_image", "stored_size", "read_source"]


@dataclass(frozen=True)
class EncodedImage:
    """The stored form of one image, or why there is none.

    ``error`` is None for a good image; otherwise ``"<reason>: <detail>"``
    with reason one of ``null``, ``empty``, ``unreadable``, ``undecodable``.
    """

    data: bytes | None
    height: int
    width: int
    error: str | None = None


def _bad(reason: str, detail: str) -> EncodedImage:
    return EncodedImage(None, 0, 0, f"{reason}: {detail}")


# Smallest side accepted for resize_short_side and max_side (ShardConfig's bound).
MIN_SIDE = 8
# A JPEG much larger than its stored size is decoded by libjpeg at 1/2, 1/4
# or 1/8 scale (Pillow's draft mode) to no less than this many times the
# stored size, then resized as any other image (Pillow's ``thumbnail`` uses
# the same gap). On one of scikit-learn's sample photographs scaled to
# 2560x1708 and capped at 500, 320 and 256 px, the result differs from a full
# decode's resize by 0.13 to 0.29 grey levels on average (of 255), a tenth of
# what storing it as a JPEG at quality 90 changes (1.9 to 3.4), at about half
# the time; decoding to the stored size itself (a gap of 1) differs by up to
# 3.9. tests/unit/test_max_side.py checks the bound.
DRAFT_GAP = 2


def encode_image(raw: bytes | None, resize_short_side: int | None = None,
                 jpeg_quality: int = 90, *, max_side: int | None = None) -> EncodedImage:
    """Decode ``raw`` (all of it: a truncated file is refused), convert it to
    RGB, resize it, encode it as JPEG.

    An RGB JPEG that needs no resize is kept byte for byte (no generation
    loss, no work). Anything else Pillow can read (PNG, grayscale, CMYK,
    palette, with alpha) is converted to RGB and re-encoded, so that readers
    only ever see RGB JPEG.

    Args:
        raw: The encoded image.
        resize_short_side: Scale an image whose shorter side is longer than
            this down to it (aspect ratio kept); None: no such resize.
        jpeg_quality: Quality (1-95) of every re-encoded image.
        max_side: Scale an image whose longer side is longer than this down
            to it (aspect ratio kept); None: no cap. With both set, the
            shorter side is brought to ``resize_short_side`` first and the
            longer side of that is then capped at ``max_side``, so the cap
            wins: a 640x427 image with ``resize_short_side=256`` and
            ``max_side=320`` is stored at 320x213. The image is resampled
            once, from the original, to that final size.

    Raises:
        ValueError: a setting out of range (a bad image is reported in the
            result's ``error`` instead).
    """
    from PIL import Image, UnidentifiedImageError

    _check_settings(resize_short_side, jpeg_quality, max_side)
    if raw is None:
        return _bad("null", "no image bytes")
    if len(raw) == 0:
        return _bad("empty", "zero bytes")
    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt = img.format
            size = stored_size(img.size, resize_short_side, max_side)
            if size != img.size and fmt == "JPEG":
                img.draft("RGB", (size[0] * DRAFT_GAP, size[1] * DRAFT_GAP))
            # load() decodes every pixel: a truncated JPEG raises here (Pillow
            # refuses truncated data unless ImageFile.LOAD_TRUNCATED_IMAGES),
            # rather than in a reader halfway through training. A draft
            # decode reads every coefficient too.
            img.load()
            converted = img.mode != "RGB"
            img = _as_rgb(img)
    except UnidentifiedImageError:
        return _bad("undecodable", "not an image Pillow can identify")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return _bad("undecodable", f"{type(exc).__name__}: {exc}")
    width, height = size
    resize = img.size != size
    if fmt == "JPEG" and not resize and not converted:
        return EncodedImage(bytes(raw), height, width)
    if resize:
        img = img.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=jpeg_quality)
    return EncodedImage(out.getvalue(), height, width)


def stored_size(size: tuple[int, int], resize_short_side: int | None = None,
                max_side: int | None = None) -> tuple[int, int]:
    """The ``(width, height)`` an image of ``size`` is stored at: the shorter
    side brought down to ``resize_short_side``, then the longer side capped
    at ``max_side`` (see `encode_image()`); never enlarged."""
    width, height = size
    if resize_short_side is not None and min(width, height) > resize_short_side:
        scale = resize_short_side / min(width, height)
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    if max_side is not None and max(width, height) > max_side:
        scale = max_side / max(width, height)
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    return width, height


def _check_settings(resize_short_side, jpeg_quality, max_side) -> None:
    for name, value in (("resize_short_side", resize_short_side), ("max_side", max_side)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < MIN_SIDE):
            raise ValueError(f"{name} must be an int >= {MIN_SIDE} or None, got {value!r}")
    if not isinstance(jpeg_quality, int) or isinstance(jpeg_quality, bool) \
            or not 1 <= jpeg_quality <= 95:
        raise ValueError(f"jpeg_quality must be an int in [1, 95], got {jpeg_quality!r}")


def _as_rgb(img):
    """RGB version of ``img``."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        # Composite on white: dropping alpha would expose whatever colour the
        # transparent pixels happen to hold (often black).
        rgba = img.convert("RGBA")
        img = Image.new("RGB", rgba.size, (255, 255, 255))
        img.paste(rgba, mask=rgba.getchannel("A"))
    else:
        img = img.convert("RGB")  # L, I;16, CMYK, YCbCr, P, 1, ...
    return img


def read_source(path: str) -> bytes:
    """Bytes of the file at ``path`` (a local path, ``file:``, ``dbfs:/`` or
    any URI pyarrow has a filesystem for). Raises ``OSError`` if unreadable."""
    if not is_remote(path):
        path = local_path(path)
    if "://" in path:
        from pyarrow import fs

        filesystem, inner = fs.FileSystem.from_uri(path)
        with filesystem.open_input_stream(inner) as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()
