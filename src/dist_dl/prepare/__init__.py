"""Data preparation (driver side): raw images to validated image shards.

The shard schema and sidecar files are described in
`dist_dl.prepare.schema`.
"""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "prepare_image_dataset": "dist_dl.prepare.writer",
    "make_synthetic_images": "dist_dl.prepare.synthetic",
    "ShardConfig": "dist_dl.prepare.config",
    "PrepareSummary": "dist_dl.prepare.writer",
    "load_label_index": "dist_dl.prepare.labels",
    "classes_of": "dist_dl.prepare.labels",
    "write_digits_tree": "dist_dl.prepare.samples",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.prepare.config import ShardConfig  # noqa: F401
    from dist_dl.prepare.labels import classes_of, load_label_index  # noqa: F401
    from dist_dl.prepare.samples import write_digits_tree  # noqa: F401
    from dist_dl.prepare.synthetic import make_synthetic_images  # noqa: F401
    from dist_dl.prepare.writer import PrepareSummary, prepare_image_dataset  # noqa: F401

__all__ = ["prepare_image_dataset", "make_synthetic_images", "ShardConfig", "PrepareSummary",
           "load_label_index", "classes_of", "write_digits_tree"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
