"""One rank's rows, epoch by epoch: what every input pipeline reads (worker side).

The reader (Petastorm's or the arrow one, `choose_reader()`) gives a
rank its row groups, in a row-group order seeded per epoch where it can be
(`rank_passes()`); `epoch_rows()` cuts or fills each epoch to exactly
``steps_per_epoch * batch_size`` rows (the plan's rule, see
`plan_shards()`). The ``tf.data`` pipeline
(`make_dataset()`) and the torch loader
(`make_loader()`) both read through here, so they
give a rank the same rows every epoch. Imports no framework.
"""
from __future__ import annotations

import contextlib
import itertools
import warnings

from dist_dl.core.optional import install_hint
from dist_dl.read.augment import READERS, ReaderConfig
from dist_dl.read.plan import plan_shards
from dist_dl.read.resolve import resolve_files

__all__ = ["choose_reader", "rank_plan", "rank_passes", "epoch_rows"]

# Petastorm 0.13 uses pyarrow's legacy ParquetDataset API, which pyarrow 10
# flags with a FutureWarning per row group read, from the reader's own
# threads (so a catch_warnings() around our calls cannot catch them). They
# say nothing a user can act on; silence only those, by module.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm\.")

# Petastorm matches schema_fields as regexes; it also runs a legacy prefix
# match and warns when the two differ ("label" would prefix-match
# "label_name"), so the patterns are anchored.
_FIELDS = ("image", "label", "source_id")


def choose_reader(reader: str = "auto") -> str:
    """The reader ``reader`` names here: ``"petastorm"`` or ``"arrow"``.

    ``"auto"`` is Petastorm where it imports, else arrow.

    Raises:
        ImportError: ``"petastorm"`` where Petastorm does not import; the
            message names both ways out.
        ValueError: an unknown name.
    """
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
    if reader == "arrow":
        return reader
    try:
        import petastorm.reader  # noqa: F401
    except Exception as exc:  # Petastorm 0.13.1 on pyarrow 16+ fails as it imports.
        if reader == "auto":
            return "arrow"
        # Not optional.require: Petastorm that is installed but broken (0.13.1
        # on pyarrow 16+) raises more than ImportError; the hint is the same.

        raise ImportError(
            f"reader='petastorm' needs Petastorm, which does not import here "
            f"({type(exc).__name__}: {exc}): {install_hint('petastorm')}; Petastorm 0.13.1 "
            "needs pyarrow<16. Or set reader='arrow' (or 'auto', which uses it where Petastorm "
            "is missing)") from exc
    return "petastorm"


def rank_plan(url, rank, num_workers, batch_size, *, config, steps_per_epoch=None, version=None,
              initial_epoch=0):
    """Check a rank's reading arguments; return ``(files, steps_per_epoch)``.

    ``steps_per_epoch`` defaults to the plan's (policy "pad", read from the
    footers: the same figure on every rank).

    Raises:
        ValueError: an argument out of range, named with what it must be
            (checked before any file is read), or the plan's errors.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_workers:
        raise ValueError(f"rank must be an int in [0, {num_workers}), got {rank!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise ValueError(f"initial_epoch must be an int >= 0, got {initial_epoch!r}")
    if not isinstance(config, ReaderConfig):
        raise ValueError(f"config must be a ReaderConfig, got {type(config).__name__}")
    if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool)
                                        or not isinstance(steps_per_epoch, int)
                                        or steps_per_epoch < 1):
        raise ValueError(f"steps_per_epoch must be a positive int, got {steps_per_epoch!r}")
    files = list(url) if isinstance(url, (list, tuple)) else resolve_files(url, version)
    if steps_per_epoch is None:
        steps_per_epoch = plan_shards(files, num_workers, batch_size).steps_per_epoch
    return files, steps_per_epoch


def rank_passes(files, rank: int, size: int, *, reader: str, threads: int, shuffle: bool,
                seed: int | None):
    """``passes(epoch)``: a function starting one pass over rank ``rank``'s row
    groups in epoch ``epoch`` (what `epoch_rows()` takes), each pass
    yielding ``(images, labels, source_ids)`` chunks.

    Args:
        files: The plan's Parquet file URLs, or the shards of an MDS
            dataset (`mds_shards()`).
        reader: ``"petastorm"`` or ``"arrow"`` (see `choose_reader()`).
        threads: Row groups read in parallel.
        shuffle: Shuffle the row-group order. With the arrow reader each
            epoch's order is drawn from ``(seed, epoch)`` (a new order every
            epoch, the same one in a rerun; ``seed=None`` draws fresh entropy);
            Petastorm's order is not seeded.
    """
    from dist_dl.read.mds import MdsShard

    if reader == "arrow" or any(isinstance(f, MdsShard) for f in files):
        # An MDS dataset's shards are read here whichever reader is chosen.
        import numpy as np

        from dist_dl.read.arrow import ArrowShard

        shard = ArrowShard(files, rank, size, threads)

        def passes(epoch):
            entropy = None if seed is None else [seed % 2**32, epoch]
            return shard.passes(np.random.default_rng(entropy) if shuffle else None)
    else:
        def passes(epoch):
            return lambda: _petastorm_pass(files, rank, size, shuffle, threads)
    return passes

def epoch_rows(passes, rank, size, target, epoch):
    """Chunks (images, labels, weights, source_ids) of exactly ``target`` rows.

    ``passes()`` starts a pass over this rank's row groups (in random order
    if shuffling), yielding ``(images, labels, source_ids)`` chunks. First
    pass: weight 1, cut off at ``target``. Further passes (only while short
    of ``target``): the same row groups again, weight 0.
    """
    import numpy as np

    emitted = 0
    for attempt in itertools.count():
        seen = 0
        # closing(): a pass left early stops its reader now, not when collected.
        with contextlib.closing(passes()) as chunks:
            for images, labels, source_ids in chunks:
                n = len(labels)
                if n == 0:
                    continue  # an empty row group (the arrow reader yields those too)
                seen += n
                take = min(n, target - emitted)
                if take <= 0:
                    break
                weight = 1.0 if attempt == 0 else 0.0
                yield (images[:take], labels[:take].astype(np.int32),
                       np.full(take, weight, np.float32),
                       np.asarray(source_ids[:take], dtype=object))
                emitted += take
                if emitted >= target:
                    break
        if emitted >= target:
            return
        if seen == 0:
            raise RuntimeError(f"rank {rank} of {size} read no rows from its shard (epoch "
                               f"{epoch}); run plan_shards() on the driver to see the split")


def _petastorm_pass(files, rank, size, shuffle, threads):
    with _batch_reader(files, rank, size, shuffle, threads) as reader:
        for batch in reader:
            yield batch.image, batch.label, batch.source_id


def _batch_reader(files, rank, size, shuffle, threads):
    """Petastorm's batch reader (what ``make_batch_reader`` builds: a
    ``Reader`` with ``ArrowReaderWorker`` on a thread pool), on our pool.

    Why not ``make_batch_reader`` itself: petastorm 0.13.1's
    ``ThreadPool.get_results`` first asks whether every worker has finished
    the items ventilated *so far*, then whether the ventilator has
    *completed*. If the ventilator hands out its last item between those two
    reads, the reader ends the epoch with that row group unread. With one row
    group per shard (small datasets, many ranks) this happened most of the
    time here: a rank read nothing on its second pass; plain
    ``make_batch_reader(..., num_epochs=1)`` over a whole dataset also came
    back empty once in the test suite. (uber/petastorm#71 describes the same
    blind spot, "processed all items" vs "no items ventilated yet"; it was
    closed unfixed.) ``_ThreadPool`` reads the ventilator state first, which
    closes the window.
    """
    from petastorm.arrow_reader_worker import ArrowReaderWorker
    from petastorm.fs_utils import get_filesystem_and_path_or_paths
    from petastorm.reader import Reader

    fs, paths = get_filesystem_and_path_or_paths(list(files))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyarrow 10 legacy dataset API
        # seed=None: with a seed Petastorm shuffles the row-group list before
        # sharding it, and the per-rank row counts plan_shards computed
        # (row group i to rank i % size) would no longer hold.
        return Reader(fs, paths, schema_fields=[f"{f}$" for f in _FIELDS], seed=None,
                      shuffle_row_groups=shuffle, reader_pool=_thread_pool(threads),
                      num_epochs=1, cur_shard=rank, shard_count=size,
                      worker_class=ArrowReaderWorker, is_batched_reader=True)


def _thread_pool(threads):
    from petastorm.workers_pool.thread_pool import ThreadPool

    class _ThreadPool(ThreadPool):
        def all_workers_done(self):
            # Ventilator first: once it has completed, every item's counter
            # was already incremented, so "all done" below really is all.
            if self._ventilator is not None and not self._ventilator.completed():
                return False
            return super().all_workers_done()

    return _ThreadPool(threads)
