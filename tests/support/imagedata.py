"""Small real images for tests, from scikit-learn's bundled data (no downloads)."""
from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image

WNIDS = ("n01440764", "n01443537", "n01484850")  # three ImageNet-style class ids


def digit_images(count: int, size: int = 32) -> list[tuple[Image.Image, int]]:
    """``count`` RGB images (``load_digits`` scaled up and tinted) with their digit."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = []
    for i in range(count):
        gray = (digits.images[i] * (255 / 16)).astype(np.uint8)
        img = Image.fromarray(gray).resize((size, size), Image.Resampling.BILINEAR)
        rgb = np.stack([np.asarray(img), np.asarray(img) // 2, 255 - np.asarray(img)], -1)
        out.append((Image.fromarray(rgb.astype(np.uint8)), int(digits.target[i])))
    return out


def encode(img: Image.Image, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def write_imagenet_tree(root: str, per_class: int = 4, size: int = 32,
                        variety: bool = True) -> dict[str, str]:
    """Write ``<root>/<wnid>/<name>`` images; return {relative path: wnid}.

    With ``variety``, class 1 holds a PNG, a grayscale JPEG and a CMYK JPEG
    among its files (all must be converted, not rejected).
    """
    images = digit_images(per_class * len(WNIDS), size)
    written = {}
    for c, wnid in enumerate(WNIDS):
        os.makedirs(os.path.join(root, wnid), exist_ok=True)
        for j in range(per_class):
            img, _ = images[c * per_class + j]
            name, data = f"{wnid}_{j}.JPEG", None
            if variety and c == 1 and j == 0:
                name, data = f"{wnid}_{j}.png", encode(img, "PNG")
            elif variety and c == 1 and j == 1:
                data = encode(img.convert("L"))
            elif variety and c == 1 and j == 2:
                data = encode(img.convert("CMYK"))
            with open(os.path.join(root, wnid, name), "wb") as f:
                f.write(data if data is not None else encode(img))
            written[os.path.join(wnid, name)] = wnid
    return written


def sample_photo() -> Image.Image:
    """One of scikit-learn's two sample photographs (427 x 640 RGB)."""
    from sklearn.datasets import load_sample_images

    return Image.fromarray(load_sample_images().images[0])


def write_tree_shards(base: str, per_class: int = 5) -> tuple[str, dict[str, str]]:
    """An ImageNet-layout tree under ``<base>/train`` written as Parquet shards
    of 2-row row groups through Spark (``local[2]``) to ``<base>/shards``;
    returns (the shards' folder, {source_id: wnid})."""
    from dist_dl.core.session import get_spark
    from dist_dl.prepare import ShardConfig, prepare_image_dataset

    written = write_imagenet_tree(os.path.join(base, "train"), per_class=per_class)
    prepare_image_dataset(os.path.join(base, "shards"), image_dir=os.path.join(base, "train"),
                          config=ShardConfig(rows_per_row_group=2),
                          spark=get_spark("local[2]", replace=True))
    return os.path.join(base, "shards"), written


def seen_once(rows) -> dict[str, int]:
    """source_id -> label of the rows of weight 1 among ``rows`` (``(source_id,
    label, weight)``, ids as str or bytes), checking that each is seen once."""
    import collections

    seen = collections.Counter()
    labels = {}
    for sid, label, weight in rows:
        if weight == 1:
            sid = sid.decode() if isinstance(sid, bytes) else sid
            seen[sid] += 1
            labels[sid] = int(label)
    assert set(seen.values()) == {1}, seen
    return labels
