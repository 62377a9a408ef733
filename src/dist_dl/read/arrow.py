"""The arrow reader: one rank's row groups read with pyarrow alone (worker side).

For runtimes without Petastorm (Databricks 16.4 and 17.3 LTS ML ship none,
and Petastorm 0.13.1 does not import with pyarrow 16 or later). It uses only
``pyarrow.parquet.ParquetFile`` and ``read_row_group``, stable from pyarrow
10 to 19. The row groups, their numbering and their assignment to ranks come
from `dist_dl.read.plan`, as for the Petastorm reader, so both readers
give a rank the same rows. The shards of an MDS dataset
(`dist_dl.read.mds`) are read here too, a shard as a row group.
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

from dist_dl.read.mds import MdsShard, read_mds_shard
from dist_dl.read.plan import rank_row_groups, row_groups
from dist_dl.read.resolve import parquet_file

__all__ = ["ArrowShard"]

_COLUMNS = ("image", "label", "source_id")


class ArrowShard:
    """The row groups of rank ``rank`` of ``size``, read pass after pass.

    Footers are read once, when the shard is made; each pass then reads
    only its row groups' column chunks.
    """

    def __init__(self, files, rank: int, size: int, threads: int):
        groups, self._footers = row_groups(files)
        self._mine = rank_row_groups(groups, rank, size)
        self._threads = threads

    def passes(self, rng):
        """A function making one pass's chunks; every call is a new pass.

        Args:
            rng: A ``numpy.random.Generator`` that orders the row groups of
                each pass (one epoch's passes draw from it in turn), or None
                to read them in plan order.
        """
        def one_pass():
            order = list(self._mine)
            if rng is not None:
                order = [order[i] for i in rng.permutation(len(order))]
            return self._read(order)
        return one_pass

    def _read(self, order):
        """``(images, labels, source_ids)`` of each row group in ``order``, in
        that order, with up to ``threads`` row groups read ahead in parallel
        (so the order does not depend on which read finishes first)."""
        with ThreadPoolExecutor(self._threads) as pool:
            pending = collections.deque()
            todo = iter(order)
            for group in todo:
                pending.append(pool.submit(self._row_group, group))
                if len(pending) == self._threads:
                    break
            while pending:
                chunk = pending.popleft().result()
                group = next(todo, None)
                if group is not None:
                    pending.append(pool.submit(self._row_group, group))
                yield chunk

    def _row_group(self, group):
        import numpy as np

        url, index, _ = group
        if isinstance(url, MdsShard):
            return read_mds_shard(url)
        meta = self._footers[url]
        names = meta.schema.to_arrow_schema().names
        columns = [c for c in _COLUMNS if c in names]
        # A ParquetFile per read: one reader is not shared between threads.
        # The footer read at the start is passed in, not read again.
        table = parquet_file(url, metadata=meta).read_row_group(index, columns=columns,
                                                                use_threads=False)
        images = table.column("image").to_numpy()
        labels = table.column("label").to_numpy()
        source_ids = (table.column("source_id").to_numpy() if "source_id" in columns
                      else np.full(table.num_rows, "", dtype=object))
        return images, labels, source_ids
