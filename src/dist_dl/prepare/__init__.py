"""Data preparation (driver side): raw images to validated image shards.

The shard schema and sidecar files are described in
:mod:`dist_dl.prepare.schema`.
"""
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

__all__ = ["prepare_image_dataset", "make_synthetic_images", "ShardConfig", "PrepareSummary",
           "load_label_index", "classes_of", "write_digits_tree"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
