"""JPEG bytes to uint8 RGB pixels with Pillow: the TensorFlow reader's train
and eval transforms, without TensorFlow (worker side).

- Evaluation: the central square of ``eval_crop_fraction`` of the short side
  (`eval_window()`, the same window as the
  TensorFlow reader), resized to ``image_size``.
- Training: a random resized crop drawn as TensorFlow's
  ``sample_distorted_bounding_box`` draws it with the whole image as the box
  (`train_window()`), resized to ``image_size``, flipped left-right with
  probability 1/2 (``config.flip``).

JPEGs decode at 1/2, 1/4 or 1/8 scale in the DCT where the crop is at least
twice the output size (libjpeg's scaled decoding, Pillow's draft mode), which
is most of the saving for small crops of large photographs. The resize is
bilinear and averages over the whole footprint when it shrinks
(antialiased); ``tf.image.resize`` samples 2 x 2 pixels. The pixels thus
differ slightly from the TensorFlow reader's (measured in
tests/integration/test_torch_read.py).

Three implementations of the same transform, chosen per image:

- where nvimgcodec (``nvidia-nvimgcodec-cu12``: NVIDIA's image codec
  library, whose CPU backend is libjpeg-turbo; no CUDA needed) and torch
  import (the ``torch`` extra installs both), a JPEG crop decoded at full
  scale is decoded by nvimgcodec, only the crop's window (as TensorFlow's
  ``decode_and_crop_jpeg``: libjpeg's skipped scanlines and cropped
  scanlines), with the fast integer IDCT, and resized by torch as below: the
  same pixels as TensorFlow's decode of the window resized with
  antialiasing, within the resizes' rounding
  (tests/integration/test_torch_read.py). A JPEG it refuses (truncated,
  CMYK, ...) is decoded whole by the next path; `decode_into()` says
  which ran;
- where simplejpeg and torch import (the ``torch`` extra installs both), a
  JPEG decoded at full scale is decoded by simplejpeg (libjpeg-turbo,
  straight into a numpy array, with the fast integer IDCT that
  ``tf.io.decode_jpeg`` uses by default) and resized by
  ``torch.nn.functional.interpolate`` (bilinear, antialiased, on uint8
  pixels in channels-last order: torch's vectorised path, single-threaded):
  within a third of a level on average of TensorFlow's decode resized with
  antialiasing, and about one level of Pillow's (which decodes with the
  accurate IDCT), at about one and a half times Pillow's images per
  CPU-second (benchmarks/RESULTS.md, "The torch loader's decoding");
- otherwise (a crop small enough for a scaled decode, another format, a
  JPEG simplejpeg refuses, or no simplejpeg), Pillow decodes (draft mode)
  and resizes (its bilinear filter).

All release the GIL while they decode and resize, so threads decode in
parallel. Imports numpy, and nvimgcodec, Pillow, simplejpeg and torch where used.
"""
from __future__ import annotations

import io
import math

from dist_dl.read.augment import CROP_ATTEMPTS, MIN_OBJECT_COVERED, ReaderConfig, eval_window

__all__ = ["train_window", "crop_draws", "decode_into", "decoder_name", "DRAWS_PER_ATTEMPT",
           "DECODERS"]

# Uniform numbers in [0, 1) one crop attempt uses: aspect ratio, height, top, left.
DRAWS_PER_ATTEMPT = 4


def crop_draws(rng, count: int):
    """The uniform numbers ``count`` train crops take, ``[count, CROP_ATTEMPTS,
    DRAWS_PER_ATTEMPT]``, from a ``numpy.random.Generator``."""
    return rng.random((count, CROP_ATTEMPTS, DRAWS_PER_ATTEMPT))


def _pick(u: float, count: int) -> int:
    """An int in ``[0, count)`` from a uniform ``u`` in [0, 1)."""
    return min(count - 1, int(u * count))


def train_window(height: int, width: int, draws, config: ReaderConfig):
    """``(top, left, crop_height, crop_width)`` of a random resized crop.

    The distribution of ``sample_distorted_bounding_box`` (TensorFlow's
    kernel, as the TensorFlow reader calls it, with the whole image as the
    bounding box): each attempt draws an aspect ratio (width / height)
    uniformly from ``aspect_ratio_range``, a height uniformly among the
    integers whose crops can cover ``area_range`` of the image, the width
    from the two, and a place uniformly; it is kept if its area lies in
    ``area_range``, covers at least ``MIN_OBJECT_COVERED`` of the image and
    fits. After ``CROP_ATTEMPTS`` rejected attempts the crop is the whole
    image.

    Args:
        draws: ``[CROP_ATTEMPTS, DRAWS_PER_ATTEMPT]`` uniforms in [0, 1) (one
            row of `crop_draws()`).
    """
    low_ratio, high_ratio = config.aspect_ratio_range
    image_area = float(height * width)
    min_area = config.area_range[0] * image_area
    max_area = config.area_range[1] * image_area
    for u_ratio, u_height, u_top, u_left in draws:
        ratio = low_ratio + u_ratio * (high_ratio - low_ratio)
        crop_h = round(math.sqrt(min_area / ratio))
        max_h = round(math.sqrt(max_area / ratio))
        if round(max_h * ratio) > width:
            # The largest height whose rounded width still fits.
            max_h = int((width + 0.5 - 1e-7) / ratio)
            if round(max_h * ratio) > width:
                max_h -= 1
        max_h = min(max_h, height)
        crop_h = min(crop_h, max_h)
        if crop_h < max_h:
            crop_h += _pick(u_height, max_h - crop_h + 1)
        crop_w = round(crop_h * ratio)
        if crop_w * crop_h < min_area:
            crop_h += 1
            crop_w = round(crop_h * ratio)
        area = crop_w * crop_h
        if not (min_area <= area <= max_area and 0 < crop_w <= width and 0 < crop_h <= height):
            continue
        if area < MIN_OBJECT_COVERED * image_area:
            continue
        return (_pick(u_top, height - crop_h + 1), _pick(u_left, width - crop_w + 1),
                crop_h, crop_w)
    return 0, 0, height, width


def decode_into(out, jpeg: bytes, config: ReaderConfig, draws=None, flip: bool = False) -> str:
    """Decode ``jpeg``, crop, resize to ``out``'s size and write the RGB pixels
    into ``out`` (a uint8 ``[size, size, 3]`` array or view).

    Args:
        draws: The train crop's uniforms (`train_window()`); None: the
            evaluation crop.
        flip: Flip left-right.

    Returns:
        The decoder that ran (one of `DECODERS`): ``"region"``
        (nvimgcodec decoded only the window), ``"region_rejected"`` (it
        refused this JPEG: a truncated, CMYK or otherwise unusual file, then
        decoded whole by simplejpeg or Pillow), ``"simplejpeg"`` or
        ``"pillow"``.
    """
    size = out.shape[0]
    fast = _fast_path()
    rejected = False
    if fast is not None and jpeg[:3] == _JPEG_MAGIC:
        region = _region_decoder()
        if region is not None:
            pixels = _decode_region(region, fast[1], jpeg, size, config, draws)
            if pixels is not None and pixels is not _REJECTED:
                _write(out, pixels, flip)
                return "region"
            rejected = pixels is _REJECTED
        try:
            pixels = _decode_fast(fast, jpeg, size, config, draws)
        except ValueError:  # a JPEG simplejpeg does not take: Pillow's
            pixels = None
        if pixels is not None:
            _write(out, pixels, flip)
            return "region_rejected" if rejected else "simplejpeg"
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as image:
        width, height = image.size
        top, left, crop_h, crop_w = (eval_window(height, width, config) if draws is None
                                     else train_window(height, width, draws, config))
        scale = 1.0
        if image.format == "JPEG":
            # The largest DCT reduction that keeps the crop at least ``size``
            # pixels on each side; draft() only ever shrinks. It returns the
            # whole image's box at the reduced scale (1/1, 1/2, 1/4 or 1/8).
            drafted = image.draft("RGB", (max(1, width * size // crop_w),
                                          max(1, height * size // crop_h)))
            if drafted is not None:
                scale = drafted[1][2] / width
        if image.mode != "RGB":
            image = image.convert("RGB")
        box = (left * scale, top * scale, (left + crop_w) * scale, (top + crop_h) * scale)
        pixels = np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=box))
    _write(out, pixels, flip)
    return "region_rejected" if rejected else "pillow"


def _write(out, pixels, flip: bool) -> None:
    """``pixels`` (uint8 ``[size, size, 3]``) into ``out``, flipped left-right
    if ``flip``. numpy copies a plain ``pixels[:, ::-1]`` one 3-byte pixel at
    a time (about 390 us for 224 x 224, nearly a decode's cost); as three
    strided byte planes of the ``[size, size * 3]`` rows it copies in about a
    fifth of that."""
    if not flip:
        out[...] = pixels
        return
    # Not torch.flip: it runs on torch's intra-op threads, whose spinning
    # doubles the CPU a decoding thread spends.
    height, width, channels = pixels.shape
    if not (out.flags.c_contiguous and pixels.flags.c_contiguous):
        out[...] = pixels[:, ::-1]
        return
    rows, source = out.reshape(height, width * channels), pixels.reshape(height, width * channels)
    last = (width - 1) * channels
    for c in range(channels):
        # Output pixel j's channel c is input pixel (width - 1 - j)'s.
        rows[:, c::channels] = source[:, last + c::-channels]


_JPEG_MAGIC = b"\xff\xd8\xff"

# What decode_into says it ran.
DECODERS = ("region", "region_rejected", "simplejpeg", "pillow")

# _decode_region's answer for a JPEG the region decoder refuses.
_REJECTED = "rejected"

# Set once nvimgcodec failed to import or make a decoder here (as _NO_FAST_PATH).
_NO_REGION: set = set()


def decoder_name() -> str:
    """The decoder `decode_into()` takes here for a JPEG crop decoded at
    full scale, in words (a run logs it)."""
    fast = _fast_path()
    if fast is not None and _region_decoder() is not None:
        return "nvimgcodec (libjpeg-turbo, only the crop's window decoded)"
    if fast is not None:
        return "simplejpeg (libjpeg-turbo, the whole image decoded)"
    return "Pillow (the whole image decoded)"


def _region_decoder():
    """``(nvimgcodec, this thread's Decoder, its DecodeParams)``, or None where
    nvimgcodec cannot decode here.

    One ``Decoder`` per thread, made on the thread's first image and kept on
    the thread object: one decoder shared by threads fails (errors, and
    ``decode`` returning None). Not kept in this module: it travels by value
    inside logged torch models, and a decoder does not pickle.
    """
    if _NO_REGION:
        return None
    import threading

    thread = threading.current_thread()
    found = getattr(thread, "_dist_dl_region_decoder", None)
    if found is None:
        try:
            import os

            # Its log: a refused JPEG is counted by the loader, not printed
            # by every thread (0: nothing; the import's notes on the GPU
            # codecs it does not find still print once).
            os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
            from nvidia import nvimgcodec as nv

            # The CPU backend (libjpeg-turbo, bundled), whether or not the
            # machine has a GPU: the GPU decodes in decode="gpu". fast_idct:
            # libjpeg's fast integer IDCT, tf.io.decode_jpeg's default.
            decoder = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                                 backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                                 max_num_cpu_threads=1, options=":fast_idct=1")
            # EXIF orientation not applied: TensorFlow's decoders ignore it too.
            params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                                     sample_format=nv.I_RGB)
        except Exception:  # not installed, or its library does not load here
            _NO_REGION.add(True)
            return None
        found = (nv, decoder, params)
        thread._dist_dl_region_decoder = found
    return found


def _decode_region(region, torch, jpeg: bytes, size: int, config: ReaderConfig, draws):
    """The crop of ``jpeg`` resized to ``size`` (uint8 ``[size, size, 3]``),
    only the crop's window decoded (nvimgcodec's sub code stream, as
    TensorFlow's ``decode_and_crop_jpeg``); None where the crop is small
    enough for a scaled decode (Pillow's path); ``_REJECTED`` where the
    decoder refuses the file."""
    import numpy as np

    nv, decoder, params = region
    try:
        stream = nv.CodeStream(jpeg)
        height, width = stream.height, stream.width
        top, left, crop_h, crop_w = (eval_window(height, width, config) if draws is None
                                     else train_window(height, width, draws, config))
        if _dct_factor(height, width, crop_h, crop_w, size) > 1:
            return None
        image = decoder.decode(stream.get_sub_code_stream(
            region=nv.Region(top, left, top + crop_h, left + crop_w)), params=params)
    except Exception:  # noqa: BLE001 -- any refusal: the whole-image decoders try it
        return _REJECTED
    if image is None:
        return _REJECTED
    crop = np.asarray(image.cpu())
    if crop.shape != (crop_h, crop_w, 3) or crop.dtype != np.uint8:
        return _REJECTED
    return _resize(torch, np.ascontiguousarray(crop), size)

# Set once simplejpeg or torch failed to import here. Not functools.lru_cache:
# this module travels by value inside logged torch models (tracking.torch_pyfunc),
# and a cache object pickles by reference to dist_dl.
_NO_FAST_PATH: set = set()


def _fast_path():
    """``(simplejpeg, torch)`` where both import, else None."""
    if _NO_FAST_PATH:
        return None
    try:
        import simplejpeg
        import torch
    except ImportError:
        _NO_FAST_PATH.add(True)
        return None
    return simplejpeg, torch


def _dct_factor(height: int, width: int, crop_h: int, crop_w: int, size: int) -> int:
    """What libjpeg shrinks the whole image by (1, 2, 4 or 8) so that the crop
    keeps at least about ``size`` pixels a side: Pillow's draft rule, for the
    size ``decode_into`` asks Pillow's draft for."""
    wanted = min(width // max(1, width * size // crop_w), height // max(1, height * size // crop_h))
    return next((f for f in (8, 4, 2) if wanted >= f), 1)


def _decode_fast(fast, jpeg: bytes, size: int, config: ReaderConfig, draws):
    """The crop of ``jpeg`` resized to ``size``, uint8 ``[size, size, 3]``:
    simplejpeg's decode, torch's antialiased bilinear resize; None where the
    crop is small enough for a scaled decode (Pillow's path then: its resize
    takes the window's fractional position on the scaled image, which
    torch's interpolate cannot).

    Raises:
        ValueError: simplejpeg cannot decode it.
    """
    import numpy as np

    simplejpeg, torch = fast
    height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
    top, left, crop_h, crop_w = (eval_window(height, width, config) if draws is None
                                 else train_window(height, width, draws, config))
    if _dct_factor(height, width, crop_h, crop_w, size) > 1:
        return None
    # libjpeg's fast integer IDCT, as tf.io.decode_jpeg's default
    # (dct_method=''): about 5 % less CPU than the accurate one.
    image = simplejpeg.decode_jpeg(jpeg, colorspace="RGB", fastdct=True)
    # Copied by numpy, the crop is channels-last for torch (height, width,
    # channel in memory), the layout whose uint8 resize is vectorised and
    # single-threaded; a copy by torch would run on its intra-op threads.
    return _resize(torch, np.ascontiguousarray(image[top:top + crop_h, left:left + crop_w]),
                   size)


def _resize(torch, crop, size: int):
    """A C-contiguous uint8 ``[h, w, 3]`` crop resized to ``[size, size, 3]``
    (torch's antialiased bilinear filter, channels-last, in pixel order)."""
    crop_h, crop_w = crop.shape[:2]
    # [1, 3, h, w] over the crop's memory, the batch stride spelled out:
    # unsqueeze(0) gives the new dimension stride 3, and then torch does not
    # take the tensor for channels-last (suggest_memory_format checks every
    # stride; pytorch/pytorch#68430), so interpolate resizes through a
    # temporary and returns planar pixels, which cost a second strided copy
    # back to pixel order: 2x the resize's CPU in all.
    batch = torch.from_numpy(crop).permute(2, 0, 1).as_strided(
        (1, 3, crop_h, crop_w), (3 * crop_h * crop_w, 1, 3 * crop_w, 3))
    resized = torch.nn.functional.interpolate(batch, size=(size, size), mode="bilinear",
                                              antialias=True, align_corners=False)
    return resized[0].permute(1, 2, 0).numpy()   # channels-last: [size, size, 3] in order
