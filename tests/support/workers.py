"""Worker functions the launcher tests ship to workers (importable by name on
every worker, so they pickle by reference)."""
from __future__ import annotations

import glob
import os
import resource
import signal
import subprocess
import time


def _rank() -> int:
    # Either engine: Horovod's variables or tf.distribute's TF_CONFIG.
    from dist_dl.core.placement import process_rank

    return process_rank()


def allreduce_known(values_per_rank: int = 5):
    """Each rank contributes (rank+1) * [1, 10, 100, ...]; returns every rank's
    (rank, size, result of the sum) gathered on rank 0."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    base = np.array([10.0 ** i for i in range(values_per_rank)])
    summed = hvd.allreduce(tf.constant(base * (hvd.rank() + 1)), op=hvd.Sum)
    return hvd.allgather_object((hvd.rank(), hvd.size(), summed.numpy().tolist()))


def train_steps(steps: int = 3, synchronised: bool = True):
    """A few synchronous SGD steps of a small Keras model, each rank starting
    from its own random weights and on its own data; returns every rank's final
    weights (identical only if the broadcast and the allreduce worked).
    ``synchronised=False``: without DistributedOptimizer and the broadcast,
    as single-worker code moved to HorovodRunner unchanged."""
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    tf.random.set_seed(1000 + hvd.rank())  # different initial weights per rank on purpose
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    opt = tf.keras.optimizers.SGD(0.1)
    model.compile(hvd.DistributedOptimizer(opt) if synchronised else opt,
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.normal(size=(16 * steps, 4)).astype("float32"), rng.integers(0, 3, 16 * steps)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if synchronised
              else [])
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allgather_object([w.tolist() for w in model.get_weights()])


def fail_on_rank(fail_rank: int, pid_file: str, message: str, use_horovod: bool = False,
                 ranks: int = 2):
    """Every rank (of ``ranks``) records its pid and a child's; ``fail_rank``
    raises once all have, the others wait (in an allreduce when ``use_horovod``)."""
    child = subprocess.Popen(["sleep", "600"])
    rank = _rank()
    with open(f"{pid_file}.{rank}.tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(f"{pid_file}.{rank}.tmp", f"{pid_file}.{rank}")  # whole, or not there
    if rank == fail_rank:
        # Every rank has started (and recorded its pids) before this one fails:
        # on a loaded machine the others can take seconds longer to get here.
        deadline = time.monotonic() + 60
        while (len(glob.glob(f"{pid_file}.[0-9]")) < ranks
               and time.monotonic() < deadline):
            time.sleep(0.1)
    if use_horovod:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        if hvd.rank() == fail_rank:
            time.sleep(1)
            raise ValueError(message)
        hvd.allreduce(tf.constant([1.0]))
        time.sleep(600)
    if rank == fail_rank:
        time.sleep(0.5)
        raise ValueError(message)
    time.sleep(600)


def kill_self_on_rank(kill_rank: int):
    if _rank() == kill_rank:
        print("about to die", flush=True)
        time.sleep(0.5)  # the rank-prefixing thread forwards the line meanwhile
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


def sleep_forever():
    time.sleep(600)


def talk(message: str):
    from dist_dl import log_to_driver

    rank = _rank()
    print(f"plain stdout line from {rank}", flush=True)
    log_to_driver(f"{message} from rank {rank}")
    return rank


def report_environment():
    keys = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
            "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_RANK", "DIST_DL_EXTRA",
            "DIST_DL_DEFAULT_CYCLE_TIME")
    return {k: os.environ.get(k) for k in keys}, sorted(os.sched_getaffinity(0))


def idle_cost(seconds: float = 4.0):
    """CPU seconds per wall second of a worker that is idle after hvd.init()
    (Horovod's background thread is all that runs); gathered on rank 0."""
    import horovod.tensorflow as hvd

    hvd.init()
    time.sleep(1.0)  # let start-up work settle
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, wall0 = usage.ru_utime + usage.ru_stime, time.monotonic()
    time.sleep(seconds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    ratio = (usage.ru_utime + usage.ru_stime - cpu0) / (time.monotonic() - wall0)
    env = os.environ.get("HOROVOD_CYCLE_TIME")
    return hvd.allgather_object((hvd.rank(), ratio, env))


def first_line_time():
    """Wall-clock time at the first line of a worker function (for the
    launcher benchmark); gathered on rank 0 as the latest of all ranks."""
    started = time.time()
    import horovod.tensorflow as hvd

    hvd.init()
    return max(hvd.allgather_object(started))


def leave_a_thread_and_an_exit_handler(marker_dir: str):
    """Registers an exit handler that writes ``exit-<rank>`` in ``marker_dir``
    and leaves a non-daemon thread sleeping for ten minutes; returns the rank."""
    import atexit
    import threading

    rank = os.environ.get("HOROVOD_RANK", "0")

    def mark():
        with open(os.path.join(marker_dir, f"exit-{rank}"), "w") as f:
            f.write("ran")

    atexit.register(mark)
    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
    return int(rank)


def _gather_rows(strategy, row):
    """Every worker's ``row`` (a 1-D array), on every worker: an all-reduce
    (sum) of a table in which each worker fills only its own row."""
    import numpy as np
    import tensorflow as tf

    rank = strategy.cluster_resolver.task_id
    table = np.zeros((strategy.num_replicas_in_sync, len(row)))
    table[rank] = row
    values = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant(table))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy()


def tf_allreduce_known(values_per_rank: int = 5):
    """tf.distribute's counterpart of ``allreduce_known``: each worker
    contributes (rank+1) * [1, 10, ...] through MultiWorkerMirroredStrategy;
    returns every worker's (rank, size, sum)."""
    import numpy as np
    import tensorflow as tf

    from dist_dl.launch import multi_worker_strategy

    strategy = multi_worker_strategy()
    rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    base = np.array([10.0 ** i for i in range(values_per_rank)])
    values = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant(base * (rank + 1)))
    summed = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy()
    rows = _gather_rows(strategy, summed)
    return [(r, size, rows[r].tolist()) for r in range(size)]


def tf_fit_steps(steps: int = 2):
    """A Keras fit of ``steps`` steps under MultiWorkerMirroredStrategy, each
    worker on its own data; returns every worker's final weights flattened
    (identical only if the strategy synchronised them)."""
    import numpy as np
    import tensorflow as tf

    from dist_dl.launch import multi_worker_strategy

    strategy = multi_worker_strategy()
    rank = strategy.cluster_resolver.task_id
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(8 * steps, 4)).astype("float32")
    y = rng.integers(0, 3, 8 * steps)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    options = tf.data.Options()
    # Each worker reads its own data: no sharding by the strategy.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)),
                                     tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(3)])
        model.compile(tf.keras.optimizers.SGD(0.1),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data.with_options(options), epochs=1, verbose=0)
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    return _gather_rows(strategy, flat).tolist()


def long_message(length: int):
    from dist_dl import log_to_driver

    log_to_driver("x" * length)


def progress_bar(steps: int = 3):
    """Writes a line redrawn with carriage returns, as Keras' progress bar does."""
    rank = int(os.environ["HOROVOD_RANK"])
    os.write(1, "".join(f"\rstep {i}/{steps} of rank {rank}" for i in range(1, steps + 1))
             .encode() + b"\n")


def keras_in_worker():
    """The worker's TF_USE_LEGACY_KERAS, the package tf.keras comes from,
    whether AutoGraph leaves that package's own functions alone, and Horovod's
    (those a training step calls), and the functions AutoGraph rewrote for
    the first step of a model compiled with Horovod's DistributedOptimizer
    after ``broadcast_variables`` (AutoGraph writes each rewrite's source to
    a file in the temporary folder: here, a folder of the worker's own)."""
    import re
    import shutil
    import tempfile
    from pathlib import Path

    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
    import numpy as np
    import tensorflow as tf
    from horovod.common import basics
    from tensorflow.python.autograph.impl import conversion

    before, own = tempfile.tempdir, tempfile.mkdtemp()
    tempfile.tempdir = own
    try:
        hvd.init()
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
        model.compile(hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), "mse")
        hvd.broadcast_variables(model.variables, root_rank=0)
        model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), batch_size=4, verbose=0)
        rewritten = sorted({name for path in Path(own).glob("*.py")
                            for name in re.findall(r"\bdef tf__(\w+)", path.read_text())})
    finally:
        tempfile.tempdir = before
        shutil.rmtree(own, ignore_errors=True)
    return (os.environ.get("TF_USE_LEGACY_KERAS"), tf.keras.Model.__module__.split(".")[0],
            conversion.is_allowlisted(tf.keras.Model.train_step),
            [conversion.is_allowlisted(f) for f in (hvd.allreduce, hvd.Compression.none.compress,
                                                    basics.HorovodBasics.size)],
            rewritten)


def keras3_overflow_on_one_worker(agree: bool = True):
    """One step of Keras 3's loss-scaling optimizer under MultiWorkerMirroredStrategy
    in which worker 1's gradient overflows and worker 0's does not; with
    ``agree``, the library's scaler (dist_dl.train.engines.keras3), else Keras's
    own. Returns every worker's weights and loss scale after it. Needs
    DIST_DL_KERAS=3 in the workers' environment."""
    import numpy as np
    import tensorflow as tf

    from dist_dl.core import compat
    from dist_dl.launch import multi_worker_strategy
    from dist_dl.train.engines.keras3 import agreeing_loss_scale_optimizer

    keras = compat.keras()
    strategy = multi_worker_strategy()
    rank = strategy.cluster_resolver.task_id
    with strategy.scope():
        weights = keras.Variable(np.ones(3, "float32"))
        scaler = agreeing_loss_scale_optimizer() if agree else keras.optimizers.LossScaleOptimizer
        optimizer = scaler(keras.optimizers.SGD(0.1))
        optimizer.build([weights])
    gradient = tf.constant([np.inf if rank == 1 else 1.0] * 3, tf.float32)

    @tf.function
    def step():
        strategy.run(lambda: optimizer.apply([gradient], [weights]))

    step()
    row = np.array([*np.asarray(weights.numpy()), float(np.asarray(optimizer.dynamic_scale))])
    return _gather_rows(strategy, row).tolist()


def import_shipped_for_horovod():
    """The answer of a module the test shipped with ``sc.addPyFile``."""
    import shipped_helper_for_horovod

    return shipped_helper_for_horovod.answer()


def process_tree():
    """Each rank's process and its parent (pids, the parent's command line),
    gathered on every rank; prints a line first."""
    import psutil
    import horovod.tensorflow as hvd

    hvd.init()
    print(f"forked rank {hvd.rank()}", flush=True)
    me = psutil.Process()
    parent = me.parent()
    return hvd.allgather_object({
        "rank": hvd.rank(), "pid": me.pid, "server": parent.pid,
        "server_cmdline": parent.cmdline()})


def parent_command():
    """The command line of this worker's parent process."""
    import psutil

    return psutil.Process().parent().cmdline()
