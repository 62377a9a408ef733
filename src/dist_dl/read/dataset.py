"""``make_dataset``: one rank's shard as a ``tf.data`` pipeline (worker side)."""
from __future__ import annotations

import hashlib
import itertools
import os
import time

from dist_dl.core.deprecation import renamed_parameters
from dist_dl.read.augment import ReaderConfig, eval_transform, train_transform
from dist_dl.read.rows import choose_reader, epoch_rows, rank_passes, rank_plan

__all__ = ["make_dataset", "InputWaits"]


class InputWaits:
    """How long the consumer of a dataset waited for each batch.

    ``make_dataset(..., waits=InputWaits())`` ends the pipeline with two
    steps that run in the thread asking for the next batch: one before the
    batch is taken from the prefetch buffer, one after. A batch that was
    ready costs no wait; a training loop faster than its input waits for
    every batch.
    """

    def __init__(self):
        self._asked = 0.0
        self.got_at: list[float] = []
        self.waited: list[float] = []

    def ask(self) -> int:
        self._asked = time.perf_counter()
        return 0

    def got(self) -> int:
        now = time.perf_counter()
        self.got_at.append(now)
        self.waited.append(now - self._asked)
        return 0

    def clear(self) -> None:
        self.got_at.clear()
        self.waited.clear()

    def between(self, start: float, end: float) -> float:
        """Seconds waited for the batches taken after ``start``, up to ``end``
        (``time.perf_counter()`` values)."""
        return sum(w for at, w in zip(self.got_at, self.waited) if start < at <= end)


@renamed_parameters({"size": "num_workers"})
def make_dataset(url, rank: int, num_workers: int, batch_size: int, *, training: bool = True,
                 config: ReaderConfig = ReaderConfig(), steps_per_epoch: int | None = None,
                 num_epochs: int | None = None, version: int | None = None,
                 seed: int | None = None, cache_dir: str | None = None,
                 with_weights: bool = False, include_source_id: bool = False,
                 shuffle: bool | None = None, initial_epoch: int = 0,
                 waits: InputWaits | None = None):
    """Batches of shard ``rank`` of ``num_workers``, decoded and augmented.

    Each rank reads whole row groups, row group ``i`` (numbered as
    `row_groups()` does) going to rank ``i % num_workers``,
    with the reader ``config.reader`` names (see `choose_reader()`):
    Petastorm's batch reader (the ``Reader`` that ``make_batch_reader``
    builds, with ``cur_shard=rank, shard_count=num_workers``; see
    ``dist_dl.read.rows._batch_reader`` for why it is built there), or the arrow reader
    (`ArrowShard`, pyarrow alone). Both give a
    rank the same rows every epoch. Each rank yields exactly
    ``steps_per_epoch`` batches of ``batch_size`` per epoch, whatever the
    shard sizes (see `plan_shards()` for the rule), so
    synchronous training never waits on a rank that ran out of data.

    Pipeline: the reader's rows (row groups shuffled in training) -> shuffle
    buffer (training) -> decode + transform (to uint8 pixels, normalised
    unless ``config.normalize`` is False) in parallel
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
        config: Transform and pipeline settings (`ReaderConfig`).
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
        waits: An `InputWaits` that records how long the consumer
            waits for each batch (the training workers' input-bound check).

    Raises:
        ImportError: ``config.reader="petastorm"`` where Petastorm does not
            import.

    Returns:
        A ``tf.data.Dataset`` of ``(images, labels)`` or, with
        ``with_weights``, ``(images, labels, weights)`` (a tuple Keras takes
        as sample weights): images ``[batch, image_size, image_size, 3]``,
        float32 and normalised, or uint8 pixels with
        ``ReaderConfig(normalize=False)``; labels int32 ``[batch]``, weights
        float32 ``[batch]``.
    """
    import tensorflow as tf

    if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
        raise ValueError(f"num_epochs must be None or a positive int, got {num_epochs!r}")
    files, steps_per_epoch = rank_plan(url, rank, num_workers, batch_size, config=config,
                                       steps_per_epoch=steps_per_epoch, version=version,
                                       initial_epoch=initial_epoch)
    target = steps_per_epoch * batch_size
    epochs = itertools.count(initial_epoch)
    shuffle = training if shuffle is None else bool(shuffle)
    passes = rank_passes(files, rank, num_workers, reader=choose_reader(config.reader),
                         threads=config.reader_threads, shuffle=shuffle, seed=seed)

    def one_epoch():
        epoch = next(epochs)
        yield from epoch_rows(passes(epoch), rank, num_workers, target, epoch=epoch)

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

    # The pipeline's functions are graph code already (their only branches
    # are on settings): AutoGraph left to itself rewrites each in every
    # worker process, about 0.7 CPU-s of a Horovod worker's 3.3.
    @tf.autograph.experimental.do_not_convert
    def parse(jpeg, label, weight, source_id):
        image = transform(jpeg, config)
        features = {"image": image, "source_id": source_id} if include_source_id else image
        return (features, label, weight) if with_weights else (features, label)

    ds = rows.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
    # Every epoch holds exactly steps_per_epoch * batch_size rows, so no
    # partial batch exists; drop_remainder also gives a static batch shape.
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    if waits is not None:
        ds = _timed(tf, ds, waits)
    return ds


def _timed(tf, ds, waits: InputWaits):
    """``ds`` with ``waits.ask()`` before and ``waits.got()`` after each
    batch leaves it. Zip asks its inputs in order and neither map is
    parallel, so both calls run in the thread that asks for the batch."""
    @tf.autograph.experimental.do_not_convert
    def ask(_):
        return tf.py_function(waits.ask, [], tf.int64)

    @tf.autograph.experimental.do_not_convert
    def got(_, batch):
        with tf.control_dependencies([tf.py_function(waits.got, [], tf.int64)]):
            return tf.nest.map_structure(tf.identity, batch)

    asks = tf.data.Dataset.from_tensors(0).repeat().map(ask)
    return tf.data.Dataset.zip((asks, ds)).map(got)
