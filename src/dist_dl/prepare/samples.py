"""Real sample images that ship with scikit-learn, as an ImageNet-layout tree.

For demos and tests on machines that cannot download datasets: the 1,797
handwritten digits of ``sklearn.datasets.load_digits`` (8x8, 16 grey levels),
scaled up and saved as RGB JPEGs in ``<root>/train/<digit>/`` and
``<root>/val/<digit>/``.
"""
from __future__ import annotations

import io
import os

from dist_dl.core.optional import require

__all__ = ["write_digits_tree"]


def write_digits_tree(root: str, *, image_size: int = 32, validation_fraction: float = 0.2,
                      seed: int = 0) -> tuple[str, str]:
    """Write scikit-learn's digits as JPEG files in class folders.

    Every digit goes to exactly one split: a seeded random
    ``validation_fraction`` of them to ``val``, the rest to ``train``.
    Existing files of the same names are replaced.

    Args:
        root: Folder to write into.
        image_size: Side of the saved images (scaled with bilinear filtering).
        validation_fraction: Share of the images held out, in [0, 1).
        seed: Seed of the split.

    Returns:
        The ``train`` and ``val`` folders.
    """
    import numpy as np
    from PIL import Image

    load_digits = require("sklearn.datasets", "the sklearn_digits sample images").load_digits

    if not isinstance(image_size, int) or image_size < 8:
        raise ValueError(f"image_size must be an int >= 8, got {image_size!r}")
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    digits = load_digits()
    held_out = np.random.default_rng(seed).random(len(digits.target)) < validation_fraction
    folders = {False: os.path.join(root, "train"), True: os.path.join(root, "val")}
    for i, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        folder = os.path.join(folders[bool(held_out[i])], str(int(label)))
        os.makedirs(folder, exist_ok=True)
        gray = Image.fromarray((pixels * (255 / 16)).astype(np.uint8))
        image = gray.resize((image_size, image_size), Image.Resampling.BILINEAR).convert("RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=95)
        with open(os.path.join(folder, f"digit_{i:04d}.jpg"), "wb") as f:
            f.write(buffer.getvalue())
    os.makedirs(folders[True], exist_ok=True)
    return folders[False], folders[True]
