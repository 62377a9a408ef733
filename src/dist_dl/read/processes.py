"""The torch loader's decoding processes (``make_loader(decode_processes=N)``).

`DecodeProcesses` starts N processes, each a Python interpreter of its own
running `main()`: one decoder per process (`decode_into()`: nvimgcodec's,
else simplejpeg's or Pillow's; torch's intra-op threads 1), and a ring of
batch slots, ``uint8 [slots, batch, size, size, 3]``, in memory that the
loading process and they share. The loader sends each batch's JPEG bytes,
crop draws and flips in chunks; a process decodes each image straight into
its place in the batch's slot and answers with the decoder that ran, or why
the image did not decode: no decoded image is pickled or copied between
processes.

How the processes start: ``python -c`` of this module's `main()`, made by
``subprocess`` (fork and exec at once), not by ``multiprocessing``. Nothing
of the loading process carries over but its environment, working folder,
CPU affinity and three file descriptors, so it is safe where torch's or any
other threads already run (a fork without exec is not), inside a Spark
task and in a worker forked from the library's fork server alike; and the
loading process's ``__main__`` is not imported again, as ``multiprocessing``'s "spawn" and
"forkserver" methods do (a training script without a ``__main__`` guard
would run again in every decoding process).

The shared memory is an anonymous file (``memfd_create``; where that is
missing, a temporary file unlinked at once): nothing is left in /dev/shm
however the processes end, and /dev/shm's size limit (64 MB in Docker's
default) does not apply.

A process that ends (killed, out of memory, its import failing) fails every
batch not yet decoded with an error naming the rank, the process and how it
ended, with the last lines it wrote (its stdout and stderr go to a
temporary file of its own: the notes nvimgcodec prints on import, once per
process, stay out of the training's log); a dispatching thread watches the
processes, so a consumer never waits on a process that is gone. A process
whose loading process is gone (its job pipe at its end) exits.
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future

__all__ = ["DecodeProcesses", "DecodeFailure", "DecodeProcessError", "main"]

# A frame on a pipe: this header (the pickle's length), then the pickle.
_HEADER = struct.Struct("<Q")
# Chunks a process is sent ahead: one it decodes and the next, waiting in its pipe.
_AHEAD = 2
# How long a closed process gets to exit before it is killed.
_GRACE = 5.0
# The start of each process: the folder this dist_dl was imported from goes
# first on its sys.path unless it is on it already (a zip of Spark's
# --py-files, a source folder added to sys.path at run time).
_BOOT = ("import sys; root = sys.argv[1]; sys.path[:0] = [] if root in sys.path else [root]; "
         "from dist_dl.read.processes import main; main(sys.argv[2:])")


class DecodeFailure(Exception):
    """An image a decoding process did not decode: ``why`` is the error there
    (``"Type: message"``); the exception's text adds its traceback."""

    def __init__(self, why: str, remote_traceback: str = ""):
        super().__init__(f"{why}\n\nin the decoding process:\n{remote_traceback}"
                         if remote_traceback else why)
        self.why = why


class DecodeProcessError(RuntimeError):
    """A decoding process ended (or its dispatching thread failed): the
    loader cannot go on."""


def _frame(message, into: bytearray | None = None) -> bytearray:
    """``message`` framed, appended to ``into`` (a new bytearray by default)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    into = bytearray() if into is None else into
    into += _HEADER.pack(len(body))
    into += body
    return into


def _receive(stream):
    """The next message of a frame stream (a binary file), or None at its end."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    body = stream.read(_HEADER.unpack(header)[0])
    return pickle.loads(body) if len(body) == _HEADER.unpack(header)[0] else None


def _shared_file(size: int) -> int:
    """A file descriptor of ``size`` bytes of anonymous shared memory."""
    try:
        fd = os.memfd_create("dist_dl-loader-batches")
    except (AttributeError, OSError):  # not Linux, or a sandbox without memfd
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryFile(dir=folder) as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, size)
    return fd


def _widen(pipe: int) -> None:
    """Give ``pipe`` a buffer of up to 1 MB (Linux; 64 kB by default), so that
    a chunk of JPEGs goes in one write, not one per 64 kB and wakeup."""
    import fcntl

    with contextlib.suppress(AttributeError, OSError):  # not Linux, or over the limit
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, 1 << 20)


class _Process:
    """The loading process's side of one decoding process."""

    def __init__(self, index: int, popen, jobs: int, results: int, log):
        self.index, self.popen, self.jobs, self.results, self.log = (
            index, popen, jobs, results, log)
        self.outbox = bytearray()   # frames not yet written to its job pipe
        self.inbox = bytearray()    # bytes read from its result pipe, not yet a whole frame
        self.sent = collections.deque()  # tags of the chunks sent, in order
        self.writing = False        # registered for EVENT_WRITE
        self.usage = None           # its psutil.Process, made on the first cpu_seconds()

    def last_output(self, limit: int = 3000) -> str:
        """The end of what the process wrote (stdout and stderr); read only
        once it has ended (the file's offset is shared with it)."""
        try:
            size = os.fstat(self.log.fileno()).st_size
            text = os.pread(self.log.fileno(), limit, max(0, size - limit))
        except OSError:
            return ""
        return text.decode("utf-8", "replace").strip()


class _Batch:
    def __init__(self, count: int):
        self.future = Future()
        self.outcomes = [None] * count
        self.left = count


class DecodeProcesses:
    """``count`` decoding processes and their ring of ``slots`` batch slots
    (`ring`, a numpy ``uint8 [slots, batch_size, size, size, 3]`` view of
    the shared memory).

    `submit()` hands a batch's images to the processes, to be written into
    a slot; its future gives, per image, the decoder's name or a
    `DecodeFailure`. One iteration at a time uses the slots (`session()`).
    `close()` ends the processes and frees the memory; so does the
    garbage collection of the loader that holds this object (its finalizer).

    Raises:
        OSError: a process or the shared memory could not be made.
        RuntimeError: no Python interpreter to start (``sys.executable``
            empty, as in an embedded Python).
    """

    def __init__(self, count: int, *, rank: int, config, slots: int, batch_size: int):
        import mmap

        import numpy as np

        if not sys.executable:
            raise RuntimeError(f"rank {rank}: decode_processes starts Python interpreters, and "
                               "sys.executable names none here (an embedded Python): decode in "
                               "threads instead (leave decode_processes out)")

        size = config.image_size
        shape = (slots, batch_size, size, size, 3)
        self._rank, self._count = rank, count
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._todo = collections.deque()   # (tag, slot, first, items) not yet sent
        self._batches: dict[int, _Batch] = {}
        self._next_batch = 0
        self._failure: Exception | None = None
        self._closed = self._busy = False
        self._processes: list[_Process] = []
        self._thread = self._map = self.ring = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._memory_fd = None
        try:
            self._memory_fd = _shared_file(math.prod(shape))
            self._map = mmap.mmap(self._memory_fd, math.prod(shape))
            self.ring = np.ndarray(shape, np.uint8, buffer=self._map)
            for index in range(count):
                self._start(index, (shape, config))
            self._thread = threading.Thread(target=self._serve, name="dist_dl-decode-dispatch",
                                            daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.popen.pid for p in self._processes)

    def cpu_seconds(self) -> float:
        """CPU seconds (user and system) the running processes have used (the
        torch engine asks after every training step: one read of each
        process's /proc entry, through a handle made once)."""
        import psutil

        total = 0.0
        for process in self._processes:
            try:
                if process.usage is None:
                    process.usage = psutil.Process(process.popen.pid)
                times = process.usage.cpu_times()
            except psutil.Error:  # it has ended (its error is the loader's)
                continue
            total += times.user + times.system
        return total

    def _start(self, index: int, init) -> None:
        # The folder that holds this copy of dist_dl (.../dist_dl/read/processes.py).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        job_r, job_w = os.pipe()
        result_r, result_w = os.pipe()
        log = tempfile.TemporaryFile()
        # One intra-op thread: each process decodes one image at a time.
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", _BOOT, root, str(job_r), str(result_w),
                 str(self._memory_fd)],
                pass_fds=(job_r, result_w, self._memory_fd), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, env=env)
        except BaseException:
            for fd in (job_w, result_r):
                os.close(fd)
            log.close()
            raise
        finally:
            os.close(job_r)
            os.close(result_w)
        self._processes.append(_Process(index, popen, job_w, result_r, log))
        _widen(job_w)
        # The first frame, small enough for the pipe's buffer: written at once.
        os.write(job_w, _frame(init))
        os.set_blocking(job_w, False)
        os.set_blocking(result_r, False)

    # ---------------------------------------------------------------- the loader's side

    def submit(self, slot: int, items: list) -> Future:
        """Decode ``items`` (``(jpeg, draws, flip)`` each, `decode_into()`'s
        arguments) into ``ring[slot, :len(items)]``. The future's result: per
        image, the decoder's name or a `DecodeFailure`; its exception: a
        process that ended, or `close()`.

        Raises:
            DecodeProcessError: a process has ended, or the processes are closed.
        """
        with self._lock:
            if self._failure is not None:
                raise self._failed()
            batch = self._next_batch
            self._next_batch += 1
            record = self._batches[batch] = _Batch(len(items))
            step = max(1, -(-len(items) // (4 * self._count)))
            for first in range(0, len(items), step):
                self._todo.append(((batch, first), slot, first, items[first:first + step]))
        self._wake()
        return record.future

    @contextlib.contextmanager
    def session(self):
        """One iteration's use of the slots: only one at a time. At its end,
        batches not yet sent are dropped and those sent are waited for, so
        that the next iteration's batches have their slots to themselves.

        Raises:
            RuntimeError: another iteration is using them.
        """
        with self._lock:
            if self._busy:
                raise RuntimeError(
                    f"rank {self._rank}: this loader is already being iterated, and its "
                    "decoding processes serve one iteration at a time: finish or close the "
                    "other iterator first (leave its for loop, or call its close())")
            self._busy = True
        try:
            yield self
        finally:
            with self._lock:
                for (batch, _), *_ in self._todo:
                    dropped = self._batches.pop(batch, None)
                    if dropped is not None:
                        dropped.future.cancel()
                self._todo.clear()
                while self._failure is None and any(p.sent for p in self._processes):
                    self._settled.wait(1.0)
                self._busy = False

    def close(self) -> None:
        """End the processes (waited for), the dispatching thread and the
        shared memory; batches not yet decoded fail. Idempotent."""
        if self._thread is threading.current_thread():
            # The loader collected in the dispatching thread (a cycle, with
            # this pool's lock perhaps held there): closed from a thread of
            # its own, which that thread's end lets go on.
            threading.Thread(target=self.close, name="dist_dl-decode-close", daemon=True).start()
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fail_locked(DecodeProcessError(
                f"rank {self._rank}: the loader's decoding processes are closed"))
        self._wake()
        if self._thread is not None:
            self._thread.join()
        for process in self._processes:
            os.close(process.jobs)
            with contextlib.suppress(OSError):
                process.popen.terminate()
        for process in self._processes:
            try:
                process.popen.wait(_GRACE)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
            os.close(process.results)
            process.log.close()
        for fd in (self._wake_r, self._wake_w, self._memory_fd):
            if fd is not None:
                os.close(fd)
        # Not mmap.close(): numpy's views of the ring (a batch being copied
        # out) keep no buffer export that would stop it, and would read
        # unmapped memory. The mapping goes with the last view.
        self.ring = self._map = None

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    def _failed(self) -> DecodeProcessError:
        """A new exception of the pool's failure for each raise: one raised
        over and over would gather every raising frame (and the ring's views
        in them) in its traceback."""
        error = DecodeProcessError(*self._failure.args)
        error.__cause__ = self._failure.__cause__
        return error

    def _fail_locked(self, error: DecodeProcessError) -> None:
        """Every batch not yet decoded fails with ``error`` (the first error
        stays the pool's); under the lock."""
        if self._failure is None:
            self._failure = error
        for batch in self._batches.values():
            if not batch.future.done():
                batch.future.set_exception(self._failed())
        self._batches.clear()
        self._todo.clear()
        self._settled.notify_all()

    # ------------------------------------------------------------ the dispatching thread

    def _serve(self) -> None:
        """Send chunks to processes with room for them, read their answers,
        complete the batches; fail them all when a process ends."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._wake_r, selectors.EVENT_READ)
            for process in self._processes:
                selector.register(process.results, selectors.EVENT_READ, process)
            while True:
                with self._lock:
                    if self._closed:
                        return
                    self._assign()
                for process in self._processes:
                    if bool(process.outbox) != process.writing:
                        process.writing = bool(process.outbox)
                        if process.writing:
                            selector.register(process.jobs, selectors.EVENT_WRITE, process)
                        else:
                            selector.unregister(process.jobs)
                events = selector.select(timeout=1.0)
                for key, mask in events:
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(key.data)
                    else:
                        self._read(key.data)
                if not events:  # a quiet second: is every process still there?
                    for process in self._processes:
                        if process.popen.poll() is not None:
                            raise self._ended(process)
        except BaseException as exc:  # noqa: BLE001 -- handed to every waiting batch
            error = exc
            if not isinstance(exc, DecodeProcessError):
                error = DecodeProcessError(f"rank {self._rank}: the decoding processes' "
                                           f"dispatching thread failed ({type(exc).__name__}: "
                                           f"{exc})")
                error.__cause__ = exc
            with self._lock:
                self._fail_locked(error)
        finally:
            selector.close()

    def _assign(self) -> None:
        """Chunks to the processes with the fewest sent (at most ``_AHEAD``
        each); under the lock."""
        while self._todo:
            process = min(self._processes, key=lambda p: len(p.sent))
            if len(process.sent) >= _AHEAD:
                return
            tag, slot, first, items = self._todo.popleft()
            _frame((tag, slot, first, items), process.outbox)
            process.sent.append(tag)

    def _write(self, process: _Process) -> None:
        try:
            written = os.write(process.jobs, process.outbox)
        except BlockingIOError:
            return
        except BrokenPipeError:  # it has ended: its result pipe says so next
            process.outbox.clear()
            return
        del process.outbox[:written]

    def _read(self, process: _Process) -> None:
        try:
            data = os.read(process.results, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            raise self._ended(process)
        process.inbox += data
        while len(process.inbox) >= _HEADER.size:
            length = _HEADER.unpack_from(process.inbox)[0]
            if len(process.inbox) < _HEADER.size + length:
                return
            (batch, first), outcomes = pickle.loads(
                process.inbox[_HEADER.size:_HEADER.size + length])
            del process.inbox[:_HEADER.size + length]
            with self._lock:
                process.sent.popleft()
                record = self._batches.get(batch)
                if record is not None:
                    record.outcomes[first:first + len(outcomes)] = [
                        o if isinstance(o, str) else DecodeFailure(*o) for o in outcomes]
                    record.left -= len(outcomes)
                    if record.left == 0:
                        del self._batches[batch]
                        record.future.set_result(record.outcomes)
                if not process.sent:
                    self._settled.notify_all()

    def _ended(self, process: _Process) -> DecodeProcessError:
        """The error for a process that has ended (or closed its pipe)."""
        try:
            code = process.popen.wait(_GRACE)
        except subprocess.TimeoutExpired:
            how = "closed its result pipe"
        else:
            if code < 0:
                try:
                    how = f"was killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            else:
                how = f"exited with status {code}"
        output = process.last_output()
        return DecodeProcessError(
            f"rank {self._rank}: decoding process {process.index + 1} of {self._count} (pid "
            f"{process.popen.pid}) {how}; the loader stops (make a new one to go on)"
            + (f". Its last output:\n{output}" if output else " (it wrote nothing)"))


# ---------------------------------------------------------------- the decoding process

def main(argv: list[str]) -> None:
    """A decoding process: ``JOBS RESULTS MEMORY`` (file descriptors).

    Reads its first frame (the slots' shape and the `ReaderConfig`), maps
    the shared memory, then decodes each chunk ``(tag, slot, first, items)``
    into ``slots[slot, first + i]`` and answers ``(tag, outcomes)``: per
    image the decoder's name, or ``(why, traceback)``. Exits at the end of
    its job pipe (the loader closed it, or its process is gone). Ctrl-C
    reaches the loading process, which ends this one.
    """
    import mmap
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    jobs_fd, results_fd, memory_fd = (int(arg) for arg in argv)
    with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(results_fd, "wb") as results:
        init = _receive(jobs)
        if init is None:
            return
        shape, config = init
        import numpy as np

        from dist_dl.read.imaging import decode_into

        memory = mmap.mmap(memory_fd, math.prod(shape))
        os.close(memory_fd)
        slots = np.ndarray(shape, np.uint8, buffer=memory)
        while (job := _receive(jobs)) is not None:
            tag, slot, first, items = job
            outcomes = []
            for i, (jpeg, draws, flip) in enumerate(items, first):
                try:
                    outcomes.append(decode_into(slots[slot, i], jpeg, config, draws, flip))
                except Exception as exc:  # noqa: BLE001 -- the loader names the row
                    outcomes.append((f"{type(exc).__name__}: {exc}",
                                     traceback.format_exc(limit=-8)))
            try:
                results.write(_frame((tag, outcomes)))
                results.flush()
            except BrokenPipeError:  # the loading process is gone
                os._exit(0)
