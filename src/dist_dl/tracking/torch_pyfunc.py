"""A torch image classifier as a self-contained MLflow pyfunc model.

Logged by `dist_dl.tracking.torch_log.log_torch_classifier()` (rank 0 of
the torch engine); loaded anywhere with ``mlflow.pyfunc.load_model``. The
model is a ``torch.export`` program (``.pt2``: graph and weights, loaded
without the code that defined the module) that takes uint8 images
``[batch, 3, size, size]`` and returns logits; the images are decoded with
simplejpeg or Pillow and cropped and resized as the torch reader's evaluation transform
does (`dist_dl.read.imaging.decode_into()`), so an image served is the
image the model was validated on.

Input and output are `dist_dl.tracking.pyfunc`'s: a pandas DataFrame
with a binary column of encoded images in; ``prediction``, ``probability``
and ``probabilities`` out, one row per input row, same index.
"""
from __future__ import annotations

import types
from typing import Sequence

# ImageClassifier and decode_into travel by value with the logged model, as
# this module does (tracking.torch_log), so it loads without dist_dl.
from dist_dl.read.imaging import decode_into
from dist_dl.tracking.pyfunc import ImageClassifier

__all__ = ["TorchImageClassifier", "TORCH_ARTIFACT"]

TORCH_ARTIFACT = "torch_program"


class TorchImageClassifier(ImageClassifier):
    """Decodes and crops images, runs the exported torch program, returns the
    class index and its probability.

    Args:
        image_size: Side of the square images the program takes.
        crop_fraction: Centre crop (share of the short side) before resizing.
        image_col: Name of the input column of encoded images.
        class_names: Names of the classes by index (kept for the caller).
        batch_size: Images per forward pass.
    """

    def __init__(self, *, image_size: int, crop_fraction: float, image_col: str = "image",
                 class_names: Sequence[str] | None = None, batch_size: int = 64):
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"image_size must be a positive int, got {image_size!r}")
        self._settings(image_col, class_names, batch_size)
        self.image_size = image_size
        self.crop_fraction = float(crop_fraction)
        self._module = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_module"] = None  # the program travels as an artifact
        return state

    def load_context(self, context) -> None:
        import torch

        self._module = torch.export.load(context.artifacts[TORCH_ARTIFACT]).module()

    def _check_loaded(self) -> None:
        if self._module is None:
            raise RuntimeError("no torch program loaded: load this model with "
                               "mlflow.pyfunc.load_model")

    def _class_count(self) -> int:
        return len(self.class_names or ())

    def _probabilities(self, images: list, index):
        import numpy as np
        import torch

        window = types.SimpleNamespace(eval_crop_fraction=self.crop_fraction)
        size = self.image_size
        # At least two rows: an exported program's batch size may not be 1.
        pixels = np.zeros((max(2, len(images)), size, size, 3), np.uint8)
        for i, (image, row) in enumerate(zip(images, index)):
            if not isinstance(image, (bytes, bytearray, memoryview)):
                raise ValueError(f"in column {self.image_col!r}, row {row!r}: expected encoded "
                                 f"image bytes, got {type(image).__name__}")
            try:
                decode_into(pixels[i], bytes(image), window)
            except Exception as exc:
                raise ValueError(f"in column {self.image_col!r}, row {row!r}: the image does not "
                                 f"decode ({type(exc).__name__}: {exc})") from None
        with torch.no_grad():
            logits = self._module(torch.from_numpy(pixels).permute(0, 3, 1, 2))
        return torch.softmax(logits.double(), dim=-1)[:len(images)].numpy()
