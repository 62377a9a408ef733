"""``make_dataset``: one rank's shard as a ``tf.data`` pipeline (worker side)."""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import warnings

from dist_dl.core.deprecation import renamed_parameters
from dist_dl.core.optional import install_hint
from dist_dl.read.augment import READERS, ReaderConfig, eval_transform, train_transform
from dist_dl.read.plan import plan_shards
from dist_dl.read.resolve import resolve_files

__all__ = ["make_dataset", "choose_reader"]

# Petastorm 0.13 uses pyarrow's legacy ParquetDataset API, which pyarrow 10
# flags with a FutureWarning per row group read, from the reader's own
# threads (so a catch_warnings() around our calls cannot catch them). They
# say nothing a user can act on; silence only those, by module.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm\.")

# Petastorm matches schema_fields as regexes; it also runs a legacy prefix
# match and warns when the two differ ("label" would prefix-match
# "label_name"), so the patterns are anchored.
_FIELDS = ("image", "label", "source_id")


@renamed_parameters({"size": "num_workers"})
def make_dataset(url, rank: int, num_workers: int, batch_size: int, *, training: bool = True,
                 config: ReaderConfig = ReaderConfig(), steps_per_epoch: int | None = None,
                 num_epochs: int | None = None, version: int | None = None,
                 seed: int | None = None, cache_dir: str | None = None,
                 with_weights: bool = False, include_source_id: bool = False,
                 shuffle: bool | None = None, initial_epoch: int = 0):
    """Batches of shard ``rank`` of ``num_workers``, decoded and augmented.

    Each rank reads whole row groups, row group ``i`` (numbered as
    :func:`~dist_dl.read.plan.row_groups` does) going to rank ``i % num_workers``,
    with the reader ``config.reader`` names (see :func:`choose_reader`):
    Petastorm's batch reader (the ``Reader`` that ``make_batch_reader``
    builds, with ``cur_shard=rank, shard_count=num_workers``; see ``_batch_reader``
    for why it is built here), or the arrow reader
    (:class:`~dist_dl.read.arrow.ArrowShard`, pyarrow alone). Both give a
    rank the same rows every epoch. Each rank yields exactly
    ``steps_per_epoch`` batches of ``batch_size`` per epoch, whatever the
    shard sizes (see :func:`~dist_dl.read.plan_shards` for the rule), so
    synchronous training never waits on a rank that ran out of data.

    Pipeline: the reader's rows (row groups shuffled in training) -> shuffle
    buffer (training) -> decode + transform in parallel
    (``num_parallel_calls=AUTOTUNE``) -> batch -> prefetch.

    Args:
        url: Dataset folder, Delta table or URL (bare local paths are turned
            into ``file://`` URLs), or a list of Parquet file URLs.
        rank: This worker's rank, in ``[0, num_workers)`` (``hvd.rank()``).
        num_workers: Number of workers (``hvd.size()``; the old name
            ``size`` is accepted with a warning for one release).
        batch_size: Rows per batch on this rank.
        training: True: random resized crop and flip (and shuffling, unless
            ``shuffle=False``); False: the evaluation transform (centre crop)
            in a fixed order.
        config: Transform and pipeline settings (:class:`ReaderConfig`).
        steps_per_epoch: Batches per epoch; default ``plan_shards(url,
            num_workers, batch_size).steps_per_epoch`` (policy "pad"), the same on every
            rank. Pass the driver's figure to avoid re-reading footers.
        num_epochs: Epochs to yield; None repeats forever (use Keras'
            ``steps_per_epoch``).
        version: Delta table version (default latest).
        seed: Seed of the shuffle buffer; with the arrow reader also of the
            row-group order (drawn afresh each epoch, from ``(seed, epoch)``).
            Petastorm's row-group order is not seeded.
        initial_epoch: The epoch the first one yielded is (a resumed run's
            ``initial_epoch``): the arrow reader's row-group orders continue
            from there as in an uninterrupted run, and the shuffle buffer's
            seed moves on, so a resumed run does not repeat its first
            epoch's order.
        cache_dir: If set, the rows of this rank's first epoch (encoded
            bytes, before augmentation) are cached in a file under this local
            folder and later epochs read them from there instead of from
            storage. Later epochs then see the first epoch's row-group order,
            reshuffled by the shuffle buffer only.
        with_weights: Also yield per-row weights: 1.0 for rows read in the
            epoch's first pass over the shard, 0.0 for rows repeated to fill
            the last batches (policy "pad").
        include_source_id: Make the features a dict ``{"image": ...,
            "source_id": ...}`` instead of the image tensor.
        shuffle: Shuffle row groups and rows (default: ``training``). With
            ``shuffle=False`` rows come in the same order every time (the
            plan's row-group order) with the arrow reader, and with
            Petastorm when ``config.reader_threads=1``.

    Raises:
        ImportError: ``config.reader="petastorm"`` where Petastorm does not
            import.

    Returns:
        A ``tf.data.Dataset`` of ``(images, labels)`` or, with
        ``with_weights``, ``(images, labels, weights)`` (a tuple Keras takes
        as sample weights): images float32 ``[batch, image_size, image_size, 3]``,
        labels int32 ``[batch]``, weights float32 ``[batch]``.
    """
    import tensorflow as tf

    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    if not isinstance(rank, int) or not 0 <= rank < num_workers:
        raise ValueError(f"rank must be an int in [0, {num_workers}), got {rank!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
        raise ValueError(f"num_epochs must be None or a positive int, got {num_epochs!r}")
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise ValueError(f"initial_epoch must be an int >= 0, got {initial_epoch!r}")
    if not isinstance(config, ReaderConfig):
        raise ValueError(f"config must be a ReaderConfig, got {type(config).__name__}")
    files = list(url) if isinstance(url, (list, tuple)) else resolve_files(url, version)
    if steps_per_epoch is None:
        steps_per_epoch = plan_shards(files, num_workers, batch_size).steps_per_epoch
    elif not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be a positive int, got {steps_per_epoch!r}")
    target = steps_per_epoch * batch_size
    epochs = itertools.count(initial_epoch)
    shuffle = training if shuffle is None else bool(shuffle)
    if choose_reader(config.reader) == "arrow":
        import numpy as np

        from dist_dl.read.arrow import ArrowShard

        shard = ArrowShard(files, rank, num_workers, config.reader_threads)

        def passes(epoch):
            # One generator per epoch, seeded by (seed, epoch): a new
            # row-group order every epoch, the same one in a rerun.
            entropy = None if seed is None else [seed % 2**32, epoch]
            return shard.passes(np.random.default_rng(entropy) if shuffle else None)
    else:
        def passes(epoch):
            return lambda: _petastorm_pass(files, rank, num_workers, shuffle, config.reader_threads)

    def one_epoch():
        epoch = next(epochs)
        yield from _epoch_rows(passes(epoch), rank, num_workers, target, epoch=epoch)

    spec = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.string))
    rows = tf.data.Dataset.from_generator(one_epoch, output_signature=spec).unbatch()
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
        # The cache is valid for exactly these files, this split and this
        # epoch length; a different dataset version gets a different file.
        key = hashlib.sha1(repr((files, rank, num_workers, target)).encode()).hexdigest()[:16]
        rows = rows.cache(os.path.join(cache_dir, f"dist_dl-rank{rank}-of{num_workers}-{key}"))
    rows = rows.repeat(num_epochs)
    if shuffle:
        rows = rows.shuffle(config.shuffle_buffer,
                            seed=None if seed is None else seed + initial_epoch,
                            reshuffle_each_iteration=True)
    transform = train_transform if training else eval_transform

    def parse(jpeg, label, weight, source_id):
        image = transform(jpeg, config)
        features = {"image": image, "source_id": source_id} if include_source_id else image
        return (features, label, weight) if with_weights else (features, label)

    ds = rows.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
    # Every epoch holds exactly steps_per_epoch * batch_size rows, so no
    # partial batch exists; drop_remainder also gives a static batch shape.
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return ds


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


def _epoch_rows(passes, rank, size, target, epoch):
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
