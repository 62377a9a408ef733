"""One image in, one stored JPEG (or a reason it was rejected) out.

Runs inside Spark tasks (and in the synthetic generator): Pillow only, no
Spark, no TensorFlow.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

from dist_dl.core.locations import is_remote, local_path

__all__ = ["EncodedImage", "encode_image", "read_source"]


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


def encode_image(raw: bytes | None, resize_short_side: int | None = None,
                 jpeg_quality: int = 90) -> EncodedImage:
    """Decode ``raw`` fully, convert it to RGB, resize it, encode it as JPEG.

    An RGB JPEG that needs no resize is kept byte for byte (no generation
    loss, no work). Anything else Pillow can read (PNG, grayscale, CMYK,
    palette, with alpha) is converted to RGB and re-encoded, so that readers
    only ever see RGB JPEG.
    """
    from PIL import Image, UnidentifiedImageError

    if raw is None:
        return _bad("null", "no image bytes")
    if len(raw) == 0:
        return _bad("empty", "zero bytes")
    try:
        with Image.open(io.BytesIO(raw)) as img:
            fmt = img.format
            # load() decodes every pixel: a truncated JPEG raises here (Pillow
            # refuses truncated data unless ImageFile.LOAD_TRUNCATED_IMAGES),
            # rather than in a reader halfway through training.
            img.load()
            converted = img.mode != "RGB"
            img = _as_rgb(img)
    except UnidentifiedImageError:
        return _bad("undecodable", "not an image Pillow can identify")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return _bad("undecodable", f"{type(exc).__name__}: {exc}")
    width, height = img.size
    short = min(width, height)
    resize = resize_short_side is not None and short > resize_short_side
    if fmt == "JPEG" and not resize and not converted:
        return EncodedImage(bytes(raw), height, width)
    if resize:
        scale = resize_short_side / short
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
        img = img.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=jpeg_quality)
    return EncodedImage(out.getvalue(), height, width)


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
