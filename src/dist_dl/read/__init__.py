"""Reading image shards (worker side): Parquet or Delta to ``tf.data`` batches.

``plan_shards`` and ``steps_per_epoch`` read only Parquet metadata and run
anywhere (call them on the driver to fail before workers start);
``make_dataset`` runs in each worker, with Petastorm or, where it is
missing, pyarrow alone (``ReaderConfig.reader``, :func:`choose_reader`).
"""
from dist_dl.read.augment import ReaderConfig
from dist_dl.read.dataset import choose_reader, make_dataset
from dist_dl.read.plan import ShardPlan, plan_shards, steps_per_epoch
from dist_dl.read.resolve import resolve_files

__all__ = ["make_dataset", "plan_shards", "steps_per_epoch", "resolve_files", "ShardPlan",
           "ReaderConfig", "choose_reader"]
