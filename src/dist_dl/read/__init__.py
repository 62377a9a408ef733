"""Reading image shards (worker side): Parquet or Delta to ``tf.data`` or torch batches.

``plan_shards`` and ``steps_per_epoch`` read only Parquet metadata and run
anywhere (call them on the driver to fail before workers start);
``make_dataset`` (``tf.data``) and ``make_loader`` (torch tensors, no
TensorFlow) run in each worker, on the same plan and rows, with Petastorm
or, where it is missing, pyarrow alone (``ReaderConfig.reader``,
`choose_reader()`).
"""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "make_dataset": "dist_dl.read.dataset",
    "plan_shards": "dist_dl.read.plan",
    "steps_per_epoch": "dist_dl.read.plan",
    "resolve_files": "dist_dl.read.resolve",
    "ShardPlan": "dist_dl.read.plan",
    "ReaderConfig": "dist_dl.read.augment",
    "choose_reader": "dist_dl.read.rows",
    "make_loader": "dist_dl.read.torchdata",
    "Normalize": "dist_dl.read.torchdata",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.read.augment import ReaderConfig  # noqa: F401
    from dist_dl.read.dataset import make_dataset  # noqa: F401
    from dist_dl.read.plan import ShardPlan, plan_shards, steps_per_epoch  # noqa: F401
    from dist_dl.read.resolve import resolve_files  # noqa: F401
    from dist_dl.read.rows import choose_reader  # noqa: F401
    from dist_dl.read.torchdata import Normalize, make_loader  # noqa: F401

__all__ = ["make_dataset", "plan_shards", "steps_per_epoch", "resolve_files", "ShardPlan",
           "ReaderConfig", "choose_reader", "make_loader", "Normalize"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
