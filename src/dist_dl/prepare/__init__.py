"""Data preparation (driver side): raw images to validated image shards.

The shard schema and sidecar files are described in
:mod:`dist_dl.prepare.schema`.
"""
from dist_dl.prepare.config import ShardConfig
from dist_dl.prepare.labels import classes_of, load_label_index
from dist_dl.prepare.samples import write_digits_tree
from dist_dl.prepare.synthetic import make_synthetic_images
from dist_dl.prepare.writer import PrepareSummary, prepare_image_dataset

__all__ = ["prepare_image_dataset", "make_synthetic_images", "ShardConfig", "PrepareSummary",
           "load_label_index", "classes_of", "write_digits_tree"]
