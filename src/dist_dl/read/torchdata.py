"""``make_loader``: one rank's shard as torch batches (worker side).

The same plan, rows and transforms as `make_dataset()`
(`dist_dl.read.rows`, the transforms of `dist_dl.read.imaging`),
without TensorFlow: every rank yields ``steps_per_epoch`` batches per epoch,
and all ranks together read every row once per epoch with weight 1.

Images leave the loader as uint8 ``[batch, 3, size, size]`` (NCHW shape,
channels-last memory: a view of the ``[batch, size, size, 3]`` array the
decoding threads wrote, or of a copy of the shared slot that decoding
processes wrote, `dist_dl.read.processes`): a quarter of float32's bytes to
copy to the GPU, and no CPU time spent on normalising. The model normalises
as its first step, on its device (`Normalize`).

Imports torch only when a loader is made or iterated (its argument errors
come first, from plain Python), and never TensorFlow.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from dist_dl.core.lazy import lazy_attributes
from dist_dl.core.placement import host_share, launcher_place
from dist_dl.read.augment import ReaderConfig, eval_window, normalization
from dist_dl.read.imaging import crop_draws, decode_into, train_window
from dist_dl.read.rows import choose_reader, epoch_rows, rank_passes, rank_plan

__all__ = ["make_loader", "TorchLoader", "Normalize", "decode_threads", "crop_resize_flip", "DECODES"]

DECODES = ("cpu", "gpu", "synthetic")


def decode_threads(environ=None) -> int:
    """Threads (or processes) that decode JPEGs in one worker: its share of
    the host's cores.

    ``OMP_NUM_THREADS`` where set (the library's launchers set it to each
    worker's share, ``threads_per_worker``), else the cores this process may
    run on divided among the job's workers on this host
    (`host_share()`; 1 worker outside a job).
    """
    environ = os.environ if environ is None else environ
    value = environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    place = launcher_place(environ)
    workers = 1 if place is None else host_share(environ, place)[1]
    return max(1, cores // max(1, workers))


def make_loader(url, rank: int, num_workers: int, batch_size: int, *, training: bool = True,
                config: ReaderConfig = ReaderConfig(), steps_per_epoch: int | None = None,
                version: int | None = None, seed: int | None = None, epoch: int = 0,
                shuffle: bool | None = None, decode: str = "cpu", threads: int | None = None,
                decode_processes: int | None = None, prefetch: int = 2,
                with_weights: bool = False, include_source_id: bool = False,
                pin_memory: bool = False, device=None) -> "TorchLoader":
    """Batches of shard ``rank`` of ``num_workers`` as torch tensors.

    Each iteration over the loader is one epoch of exactly ``len(loader)``
    (``steps_per_epoch``) batches; the first is epoch ``epoch``, each next
    iteration the epoch after, and `TorchLoader.set_epoch()` chooses the
    next one (as ``DistributedSampler.set_epoch`` does; a resumed run passes
    its first epoch). The rows of a rank and epoch are those
    `make_dataset()` gives it with the arrow reader and the
    same ``seed`` (the row-group order of epoch ``e`` drawn from ``(seed,
    e)``); the order of rows within the epoch comes from a shuffle buffer of
    ``config.shuffle_buffer`` rows drawn from ``(seed, epoch, rank)``, filled
    and emptied within each epoch.

    Args:
        url: Dataset folder, Delta table or URL, or a list of Parquet file URLs.
        rank: This worker's rank, in ``[0, num_workers)`` (``RANK``).
        num_workers: Number of workers (``WORLD_SIZE``).
        batch_size: Rows per batch on this rank.
        training: True: random resized crop and flip, shuffled (unless
            ``shuffle=False``); False: the centre crop, in the plan's order.
        config: Transform and reader settings (`ReaderConfig`;
            ``mean`` and ``std`` are `Normalize`'s).
        steps_per_epoch: Batches per epoch; default the plan's
            (`plan_shards()`, policy "pad"). Pass the
            driver's figure to skip reading the footers.
        version: Delta table version (default latest).
        seed: Seed of the row-group orders, the shuffle buffer and the crops;
            None draws fresh ones.
        epoch: The first epoch an iteration yields.
        shuffle: Shuffle row groups and rows (default ``training``).
        decode: ``"cpu"``: in ``threads`` threads (or ``decode_processes``
            processes), nvimgcodec decoding only each crop's window (or,
            where it does not load, simplejpeg or Pillow decoding the whole
            image; `decoder_name()`). ``"gpu"``: torchvision's JPEG decoder
            on the CUDA device ``device`` (default the current one), the
            crop, resize and flip there too; needs torchvision and a GPU.
            ``"synthetic"``: no decoding: the same random images every
            batch, made once on ``device`` (default the CPU), with the
            shard's labels, weights and row order; measures a training loop
            without its image decoding (as synthetic data in
            tf_cnn_benchmarks).
        threads: Decoding threads (``"cpu"``); default `decode_threads()`.
        decode_processes: Decode (``"cpu"``) in this many processes of the
            loader's own instead of in threads; default None: threads. Each
            process has its own decoder and writes the pixels straight into
            a ring of ``prefetch + 1`` batch slots in shared memory (only
            the JPEG bytes, crop draws and flips are sent to it); each batch
            is copied out of its slot before it is yielded (into pinned
            memory with ``pin_memory``), so the batches a consumer keeps
            are its own. The same images, bytes for bytes, as threads give.
            The processes start on the first iteration (a Python
            interpreter each, importing torch: seconds) and serve every
            epoch after it, one iteration at a time; `TorchLoader.close()`
            (or the loader's garbage collection) ends them. A process that
            ends stops the loader with an error naming it and how it ended.
            `decode_threads()` gives a worker's share of the cores.
        prefetch: Batches made ahead of the one yielded, by a thread of
            the loader's own (and as many more in decoding with ``"cpu"``).
        with_weights: Also yield the rows' weights (1.0 for rows read in the
            epoch's first pass over the shard, 0.0 for rows repeated to fill
            the last batches).
        include_source_id: Also yield the rows' ``source_id`` values (a
            list of str, last in each batch).
        pin_memory: Put the CPU batches in pinned memory (where CUDA is
            available), for ``tensor.to(device, non_blocking=True)``.
        device: ``decode="gpu"``'s device.

    Returns:
        A `TorchLoader` yielding ``(images, labels)``, ``(images,
        labels, weights)`` with ``with_weights``, and the source ids after
        them with ``include_source_id``: images uint8
        ``[batch, 3, size, size]`` in channels-last memory, labels int64
        ``[batch]``, weights float32 ``[batch]``; on the CPU, or with
        ``decode="gpu"`` all three on ``device``.

    Raises:
        ValueError: an argument out of range (before any file is read), or
            the plan's errors (see `plan_shards()`).
        ImportError: ``decode="gpu"`` where torchvision does not import.
    """
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    for name, value in (("threads", threads), ("decode_processes", decode_processes),
                        ("prefetch", prefetch)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if decode_processes is not None and threads is not None:
        raise ValueError(f"threads={threads} and decode_processes={decode_processes}: give one "
                         "(threads decode in this process, decode_processes in processes of "
                         "the loader's own)")
    if decode_processes is not None and decode != "cpu":
        raise ValueError(f"decode_processes decodes on the CPU: it goes with decode='cpu', not "
                         f"decode={decode!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    if decode == "gpu":
        device = _gpu_device(device)
    elif decode == "synthetic" and device is not None:
        import torch

        device = torch.device(device)
    files, steps = rank_plan(url, rank, num_workers, batch_size, config=config,
                             steps_per_epoch=steps_per_epoch, version=version,
                             initial_epoch=epoch)
    shuffle = training if shuffle is None else bool(shuffle)
    passes = rank_passes(files, rank, num_workers, reader=choose_reader(config.reader),
                         threads=config.reader_threads, shuffle=shuffle, seed=seed)
    return TorchLoader(passes, rank=rank, num_workers=num_workers, batch_size=batch_size,
                       steps_per_epoch=steps, training=training, shuffle=shuffle, config=config,
                       seed=seed, epoch=epoch, decode=decode,
                       threads=threads or decode_threads(), processes=decode_processes,
                       prefetch=prefetch,
                       with_weights=with_weights, include_source_id=include_source_id,
                       pin_memory=pin_memory, device=device)


def _gpu_device(device):
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"decode='gpu' needs torchvision (its CUDA JPEG decoder, torchvision.io.decode_jpeg), "
            f"which does not import here ({exc}): pip install torchvision, the build made for "
            "this torch; or use decode='cpu'") from exc
    import torch

    if not torch.cuda.is_available():
        raise ValueError("decode='gpu' needs a CUDA GPU, and torch sees none here: use "
                         "decode='cpu'")
    return torch.device("cuda", torch.cuda.current_device()) if device is None \
        else torch.device(device)


class TorchLoader:
    """One rank's batches, an epoch per iteration (made by `make_loader()`).

    Attributes:
        steps_per_epoch: Batches per epoch (also ``len(loader)``).
        epoch: The epoch the next iteration yields.
        decoded: Images decoded on the CPU so far, by the decoder that ran
            (`DECODERS`: ``"region"``,
            ``"region_rejected"`` for JPEGs the region decoder refused and
            another decoded whole, ``"simplejpeg"``, ``"pillow"``).

    A loader made with ``decode_processes`` holds processes from its first
    iteration on: `close()` ends them (``with make_loader(...) as loader:``
    does at the block's end), as does the loader's garbage collection.
    """

    def __init__(self, passes, *, rank, num_workers, batch_size, steps_per_epoch, training,
                 shuffle, config, seed, epoch, decode, threads, processes, prefetch,
                 with_weights, include_source_id, pin_memory, device):
        self._passes = passes
        self._rank, self._num_workers, self._batch_size = rank, num_workers, batch_size
        self.steps_per_epoch = steps_per_epoch
        self.epoch = epoch
        self._training, self._shuffle, self._config, self._seed = training, shuffle, config, seed
        self._decode, self._threads, self._prefetch = decode, threads, prefetch
        self._processes, self._decoders, self._decoders_lock = processes, None, threading.Lock()
        self._with_weights, self._include_source_id = with_weights, include_source_id
        self._pin_memory, self._device = pin_memory, device
        self._synthetic = None
        self._stream = None
        self.decoded = collections.Counter()

    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def decode_pids(self) -> tuple[int, ...]:
        """The process ids of the decoding processes (``decode_processes``;
        none before the first iteration, after `close()` and with threads)."""
        decoders = self._decoders
        return () if decoders is None else decoders.pids

    def decode_cpu_seconds(self) -> float:
        """CPU seconds the decoding processes (``decode_processes``) have
        used so far: 0.0 with threads, whose time is this process's."""
        decoders = self._decoders
        return 0.0 if decoders is None else decoders.cpu_seconds()

    def close(self) -> None:
        """End the decoding processes (``decode_processes``) and free their
        shared memory; a later iteration starts new ones. Nothing to do with
        threads."""
        with self._decoders_lock:
            decoders, self._decoders = self._decoders, None
        if decoders is not None:
            decoders.close()

    def __enter__(self) -> "TorchLoader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        handoff = self._gpu_handoff if self._decode == "gpu" else None
        return _in_background(self._batches(epoch), self._prefetch, handoff)

    def _rows(self, epoch, rng):
        """``(jpeg, label, weight, source_id)`` of the epoch's rows, shuffled
        if shuffling."""
        target = self.steps_per_epoch * self._batch_size
        chunks = epoch_rows(self._passes(epoch), self._rank, self._num_workers, target,
                            epoch=epoch)
        with contextlib.closing(chunks):
            rows = (row for chunk in chunks for row in zip(*chunk))
            yield from (_shuffled(rows, self._config.shuffle_buffer, rng) if self._shuffle
                        else rows)

    def _batches(self, epoch):
        import numpy as np

        entropy = None if self._seed is None else [self._seed % 2**32, epoch, self._rank]
        rng = np.random.default_rng(entropy)
        rows = self._rows(epoch, rng)
        with contextlib.closing(rows), self._cpu_decoding() as submit:
            pending = collections.deque()
            for step in range(self.steps_per_epoch):
                batch = list(itertools.islice(rows, self._batch_size))
                jpegs, labels, weights, ids = zip(*batch)
                labels, weights = np.array(labels, np.int64), np.array(weights, np.float32)
                ids = [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
                draws = crop_draws(rng, len(batch)) if self._training else None
                flips = (rng.random(len(batch)) < 0.5 if self._training and self._config.flip
                         else np.zeros(len(batch), bool))
                if self._decode == "gpu":
                    with self._gpu_stream():
                        made = self._batch(self._gpu_images(jpegs, draws, flips), labels,
                                           weights, ids)
                    yield made
                    continue
                if self._decode == "synthetic":
                    yield self._batch(self._synthetic_images(len(batch)), labels, weights, ids)
                    continue
                pending.append((*submit(step, jpegs, draws, flips), labels, weights, ids))
                if len(pending) > self._prefetch:
                    yield self._cpu_batch(*pending.popleft())
            while pending:
                yield self._cpu_batch(*pending.popleft())

    @contextlib.contextmanager
    def _cpu_decoding(self):
        """One iteration's ``submit(step, jpegs, draws, flips) -> (outcomes,
        out, shared)`` (``decode="cpu"``): ``outcomes()`` iterates over the
        decoders' names (a thread's error raised at its image; a process's
        a `DecodeFailure` in its place), ``out`` is the uint8 ``[n, size,
        size, 3]`` array they write, ``shared`` whether it is a slot of the
        decoding processes' ring (copied out before the batch is yielded:
        the slot takes batch ``step + prefetch + 1``)."""
        import numpy as np

        size, config = self._config.image_size, self._config
        if self._processes is None:
            with ThreadPoolExecutor(self._threads) as pool:
                def submit(step, jpegs, draws, flips):
                    out = np.empty((len(jpegs), size, size, 3), np.uint8)
                    jobs = [pool.submit(decode_into, out[i], jpeg, config,
                                        None if draws is None else draws[i], bool(flips[i]))
                            for i, jpeg in enumerate(jpegs)]
                    return (lambda: (job.result() for job in jobs)), out, False

                yield submit
            return
        decoders = self._decoding_processes()
        ring = decoders.ring
        with decoders.session():
            def submit(step, jpegs, draws, flips):
                slot = step % (self._prefetch + 1)
                future = decoders.submit(slot, [
                    (jpeg, None if draws is None else draws[i], bool(flips[i]))
                    for i, jpeg in enumerate(jpegs)])
                return (lambda: iter(future.result())), ring[slot, :len(jpegs)], True

            yield submit

    def _decoding_processes(self):
        """The loader's `DecodeProcesses`, started on first use."""
        from dist_dl.read.processes import DecodeProcesses

        with self._decoders_lock:
            if self._decoders is None:
                self._decoders = DecodeProcesses(
                    self._processes, rank=self._rank, config=self._config,
                    slots=self._prefetch + 1, batch_size=self._batch_size)
                weakref.finalize(self, self._decoders.close)
            return self._decoders

    def _cpu_batch(self, outcomes, out, shared, labels, weights, ids):
        import torch

        from dist_dl.read.processes import DecodeFailure

        names = outcomes()  # a decoding process that ended raises here, as itself
        for source_id in ids:
            try:
                name = next(names)
                if isinstance(name, DecodeFailure):
                    raise name
                self.decoded[name] += 1
            except Exception as exc:
                why = exc.why if isinstance(exc, DecodeFailure) else f"{type(exc).__name__}: {exc}"
                raise ValueError(f"rank {self._rank}: the image of row {source_id!r} does not "
                                 f"decode ({why})") from exc
        images = torch.from_numpy(out)
        # A batch out of the decoding processes' ring is copied (pin_memory
        # copies anyway): its slot takes a later batch, and the consumer may
        # keep this one. About 60 us an image of 224 pixels into fresh
        # memory, page faults included: a few percent of its decoding.
        if self._pin_memory and torch.cuda.is_available():
            images = images.pin_memory()
        elif shared:
            images = torch.from_numpy(out.copy())
        return self._batch(images.permute(0, 3, 1, 2), labels, weights, ids)

    def _batch(self, images, labels, weights, ids):
        import torch

        labels, weights = torch.from_numpy(labels), torch.from_numpy(weights)
        if self._decode != "cpu" and self._device is not None:
            labels = labels.to(self._device, non_blocking=True)
            weights = weights.to(self._device, non_blocking=True)
        elif self._pin_memory and torch.cuda.is_available():
            labels, weights = labels.pin_memory(), weights.pin_memory()
        batch = (images, labels, weights) if self._with_weights else (images, labels)
        return batch + (ids,) if self._include_source_id else batch

    def _synthetic_images(self, count: int):
        """``decode="synthetic"``: random uint8 images, made once per size."""
        import torch

        cached = self._synthetic
        if cached is None or cached.shape[0] != count:
            size = self._config.image_size
            generator = torch.Generator().manual_seed(0 if self._seed is None else self._seed)
            cached = torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8,
                                   generator=generator)
            cached = cached.to(self._device or "cpu").contiguous(
                memory_format=torch.channels_last)
            self._synthetic = cached
        return cached

    def _gpu_stream(self):
        """The loader's own CUDA stream, made current (``decode="gpu"``).

        torchvision's batched CUDA decoder (0.19 and later,
        ``decode_jpegs_cuda``) allocates its output tensors on the caller's
        current stream but writes them on a stream of its own, which waits
        for nothing: a block the caching allocator hands it can still be in
        use by kernels queued on the current stream. On the training
        stream those are the step in flight, whose activations or gradients
        the decoder then overwrites, and the losses turn NaN (memory handed
        out by the caching allocator is only safe for the stream it was
        allocated on; the same in torchvision 0.26). So the loader decodes
        with a stream of its own current, waits for that stream's queued
        work before each decode, and hands every batch over to the
        consumer's stream (`_gpu_handoff()`)."""
        import torch

        if self._stream is None:
            self._stream = torch.cuda.Stream(self._device)
        # The previous batch's crops are done before the decoder writes.
        self._stream.synchronize()
        return torch.cuda.stream(self._stream)

    def _gpu_handoff(self, batch):
        """In the consumer's thread: its current stream waits for the
        loader's, and the allocator keeps the batch's memory until that
        stream is done with it."""
        import torch

        current = torch.cuda.current_stream(self._device)
        current.wait_stream(self._stream)
        for item in batch:
            if isinstance(item, torch.Tensor) and item.is_cuda:
                item.record_stream(current)
        return batch

    def _gpu_images(self, jpegs, draws, flips):
        """The batch decoded, cropped, resized and flipped on the GPU
        (torchvision's CUDA JPEG decoder; see `crop_resize_flip()`), on
        the loader's stream (see `_gpu_stream()`)."""
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        data = [torch.frombuffer(bytearray(jpeg), dtype=torch.uint8) for jpeg in jpegs]
        decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=self._device)
        windows = [eval_window(image.shape[1], image.shape[2], self._config) if draws is None
                   else train_window(image.shape[1], image.shape[2], draws[i], self._config)
                   for i, image in enumerate(decoded)]
        return crop_resize_flip(decoded, windows, flips, self._config.image_size)


def crop_resize_flip(images, windows, flips, size: int):
    """uint8 ``[n, 3, size, size]`` (channels-last memory) from ``images``
    (uint8 ``[3, h, w]`` tensors of any sizes, on one device): each one's
    ``(top, left, height, width)`` window resized to ``size`` and flipped
    left-right where ``flips`` says, in a few batched operations: the images
    are padded into one tensor and resized by ``torchvision.ops.roi_align``
    (each output pixel the mean of the window's points that fall in it: an
    area filter when shrinking, as antialiased resizing is; bilinear when
    enlarging). The pixels differ slightly from Pillow's bilinear filter
    (measured by benchmarks/gpu.py's decode check)."""
    import torch
    from torchvision.ops import roi_align

    device = images[0].device
    height = max(image.shape[1] for image in images)
    width = max(image.shape[2] for image in images)
    padded = torch.zeros((len(images), 3, height, width), dtype=torch.uint8, device=device)
    for i, image in enumerate(images):
        padded[i, :, :image.shape[1], :image.shape[2]] = image
    boxes = torch.tensor([[i, left, top, left + w, top + h]
                          for i, (top, left, h, w) in enumerate(windows)],
                         dtype=torch.float32).to(device, non_blocking=True)
    out = roi_align(padded.float(), boxes, output_size=size, sampling_ratio=-1, aligned=True)
    flipped = torch.as_tensor(list(flips), dtype=torch.bool).to(device, non_blocking=True)
    out = torch.where(flipped[:, None, None, None], out.flip(-1), out)
    return out.round_().clamp_(0, 255).to(torch.uint8).contiguous(
        memory_format=torch.channels_last)


_DONE = object()


def _in_background(batches, depth: int, handoff=None):
    """Yield what ``batches`` yields, made by a thread of its own up to
    ``depth`` batches ahead: reading rows and assembling batches (and, with
    ``decode="gpu"``, launching the decoding) overlap the training step that
    consumes them; ``handoff(batch)``, if given, runs in the consumer's
    thread before each batch is yielded. An error in the thread is raised
    here; closing this generator stops the thread and closes ``batches``."""
    import queue
    import threading

    ready = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        """Queue ``item`` unless the consumer has left; whether it was queued."""
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            with contextlib.closing(batches):
                for batch in batches:
                    if not put(batch):
                        return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    thread = threading.Thread(target=produce, name="dist_dl-loader", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item if handoff is None else handoff(item)
    finally:
        stop.set()
        thread.join()


def _shuffled(rows, buffer: int, rng):
    """``rows`` through a shuffle buffer of ``buffer`` rows (``tf.data``'s
    kind: each row out is a random one of the buffer, replaced by the next in)."""
    pool = []
    for row in rows:
        if len(pool) < buffer:
            pool.append(row)
            continue
        i = int(rng.integers(buffer))
        yield pool[i]
        pool[i] = row
    for i in rng.permutation(len(pool)):
        yield pool[i]


def _define_normalize():
    import torch

    class Normalize(torch.nn.Module):
        """A model's first step for `make_loader()`'s batches
        (``nn.Sequential(Normalize(config), model)``): uint8 ``[batch, 3, h,
        w]`` in, float32 out, less ``config.mean`` and over ``config.std``
        (of pixels scaled to [0, 1]), on the model's device, in the images'
        memory format."""

        def __init__(self, config: ReaderConfig = ReaderConfig()):
            super().__init__()
            # Buffers move with the model (.to(device)); not saved in its state.
            # The TensorFlow reader's constants (read.augment.normalization).
            scale, offset = normalization(config)
            self.register_buffer("scale", torch.tensor(scale).view(1, 3, 1, 1), persistent=False)
            self.register_buffer("offset", torch.tensor(offset).view(1, 3, 1, 1),
                                 persistent=False)

        def forward(self, images):
            return images.float() * self.scale + self.offset

    Normalize.__module__ = __name__
    Normalize.__qualname__ = "Normalize"
    return Normalize


# Normalize subclasses torch.nn.Module: defined on first use (see dist_dl.core.lazy),
# so that this module imports without torch.
__getattr__ = lazy_attributes(globals(), Normalize=_define_normalize)
