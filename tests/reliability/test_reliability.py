"""The reliability suite: faults injected into real jobs, on local Spark and on
the cluster of separate hosts (tests/hosts.py), each recorded with what was
recorded by tests/support/scenarios.py (make reliability-report: docs/reliability.json).

Every scenario runs as a driver program in a process of its own (on the
``driver`` host of the cluster, or on this machine for local Spark), so that
Ctrl-C and a crash of the driver hit a real driver, and so that the program can
look at every process of every host while its Spark application still runs:
the hosts are network namespaces of one machine, so ``/proc`` shows the
processes of all of them, and each process's network namespace names its host.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import host_cluster as hosts_module
from scenarios import check_each

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

# The tests' helpers, for the programs these tests start.
SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")

# F3, F4 and F4b run on the cluster of separate hosts, the harder of the two
# settings. On local Spark the same launcher's failing-rank error and timeout
# are test_launcher.py's test_worker_exception_on_spark and test_timeout_spark,
# for both engines.
WHERE = [pytest.param("hosts", id="hosts")]

# Given to every driver program: which processes of the machine belong to a
# job (their command line holds a pattern), and on which host each one runs.
_PRELUDE = '''
import json, os, sys, time

def job_processes(patterns):
    """Processes of this run whose command line holds one of ``patterns``,
    with the host each runs on. This run's: on the cluster, those in its
    hosts' network namespaces; on local Spark, those whose environment has
    this program's RUN_MARK (every process it starts inherits it)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\\0", b" ").decode(errors="replace")
            if not any(p in cmd for p in patterns):
                continue
            ns = os.readlink(f"/proc/{pid}/ns/net")
            if HOSTS_BY_NS:
                if ns not in HOSTS_BY_NS:
                    continue
            else:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if RUN_MARK.encode() not in f.read():
                        continue
        except OSError:
            continue
        found.append({"pid": int(pid), "host": HOSTS_BY_NS.get(ns, "local"), "cmd": cmd[:160]})
    return found

def digits_frame(spark, folder, validation_fraction=0.0):
    """scikit-learn's digits written as 16-pixel JPEG files under ``folder``
    (less ``validation_fraction`` of them), read with Spark's binaryFile
    source: the image bytes in ``content``, the label in ``digit``."""
    from pyspark.sql import functions as F
    from dist_dl.prepare import write_digits_tree
    train_dir, _ = write_digits_tree(folder, image_size=16,
                                     validation_fraction=validation_fraction)
    return (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
            .load(train_dir).withColumn("digit", F.regexp_extract("path", r"/(\\d)/[^/]+$", 1)))

def files_under(folder):
    """Every file under ``folder``, as paths relative to it, sorted."""
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, names in os.walk(folder) for f in names)

def gone_within(patterns, seconds=10.0):
    """Seconds until no process matches (None if some are still there after
    ``seconds``), and what was left."""
    start = time.time()
    while True:
        left = job_processes(patterns)
        elapsed = time.time() - start
        if elapsed > seconds:
            return None, left
        if not left:
            return round(elapsed, 1), []
        time.sleep(0.25)

def hold_at(epoch, marker):
    """The tests' train_hooks.HoldAt(epoch, marker) (the workers wait at that
    epoch's start until the marker exists), shipped to the workers by value."""
    if SUPPORT not in sys.path:
        sys.path.insert(0, SUPPORT)
    import cloudpickle, train_hooks
    cloudpickle.register_pickle_by_value(train_hooks)
    return train_hooks.HoldAt(epoch, marker)
'''

# Horovod's worker processes on Spark tasks (dist_dl's entry, and Horovod's
# own, which it replaces) and on the driver machine.
_HOROVOD = ["dist_dl.launch.horovod._spark_worker_main", "horovod.spark.task.gloo_exec_fn",
            "dist_dl.launch.core._worker_main"]


def _hosts_by_ns(cluster) -> dict:
    """Network namespace (as /proc/PID/ns/net names it) -> host name."""
    return {f"net:[{os.stat('/run/netns/' + h.netns).st_ino}]": h.name
            for h in cluster.hosts.values()}


def _cluster_watch(cluster) -> dict:
    """The driver programs' ``job_processes`` and ``gone_within``, for use in
    this process: the hosts share one /proc."""
    found = {"HOSTS_BY_NS": _hosts_by_ns(cluster), "RUN_MARK": ""}
    exec(_PRELUDE, found)
    return found


def run_program(request, where: str, code: str, timeout: float = 600,
                env: dict | None = None) -> dict:
    """Run a driver program on local Spark (a process on this machine) or on
    the driver host of the cluster; the JSON object its last line prints."""
    code = textwrap.dedent(code)
    if where == "hosts":
        cluster = request.getfixturevalue("hosts")
        names = _hosts_by_ns(cluster)
        return cluster.run_driver(f"HOSTS_BY_NS = {names!r}\nRUN_MARK = ''\n"
                                  f"SUPPORT = {SUPPORT!r}\n" + _PRELUDE + code,
                                  timeout=timeout, env=env)
    tmp = request.getfixturevalue("tmp_path")
    mark = uuid.uuid4().hex
    script = (f"MASTER = 'local[2]'\nSHARED = {str(tmp)!r}\nHOSTS_BY_NS = {{}}\n"
              f"RUN_MARK = 'DIST_DL_RELIABILITY_RUN={mark}'\nSUPPORT = {SUPPORT!r}\n"
              + hosts_module._READY + _PRELUDE + code)
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc_env.update(env or {}, DIST_DL_RELIABILITY_RUN=mark)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=timeout, env=proc_env, cwd=tmp)
    if result.returncode != 0:
        raise AssertionError(f"the driver program failed (exit {result.returncode}):\n"
                             f"stdout:\n{result.stdout[-6000:]}\nstderr:\n{result.stderr[-8000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the driver program printed no JSON result:\n{result.stdout[-3000:]}"
    out = json.loads(lines[-1])
    out["_stdout"], out["_stderr"] = result.stdout, result.stderr
    return out


# ------------------------------------------------------------ F3, F4, F4b

# One driver program, one Spark application, the three jobs one after
# another (a notebook's cells on one cluster): the slow worker first, then the
# worker that raises, then the stopped one. Each job's canary and workers
# must be gone before the next job starts.
_FAULTY_JOBS = '''
from dist_dl import HorovodRunner
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))
CANARY = "dist_dl-canary-" + str(os.getpid())

def main(canary, fault, seconds):
    import signal, subprocess, sys, time
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    # A child of every worker, which must not outlive the job.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", canary])
    hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="warm")
    if hvd.rank() == 1:
        if fault == "raise":
            raise ValueError("fault injected on rank 1")
        if fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if fault == "slow":
            time.sleep(seconds)
    total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum, name="after")
    if fault == "raise":
        time.sleep(900)   # rank 0 waits: the launcher must end it
    return float(total.numpy()[0])

outcomes = {}
for fault, timeout, slow in JOBS:
    canary = f"{CANARY}-{fault}"
    start = time.time()
    try:
        result = HorovodRunner(np=2, timeout=timeout).run(main, canary=canary, fault=fault,
                                                          seconds=slow)
        error = None
    except Exception as exc:
        result, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.time() - start
    gone, left = gone_within([canary] + HOROVOD)
    outcomes[fault] = {"result": result, "error": error, "seconds": seconds, "gone": gone,
                       "left": left}
print(json.dumps(outcomes))
'''


def _timely_and_nothing_left(s, out: dict, what: str, limit: float) -> None:
    s.figure(f"{what} after {out['seconds']:.1f} s")
    assert out["seconds"] < limit, out
    assert out["gone"] is not None, f"left behind: {out['left']}"
    s.figure(f"no process left {out['gone']:.1f} s after the error")


@pytest.mark.timeout(900)
@pytest.mark.hosts
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.needs("horovod.tensorflow")
def test_a_failing_stopped_or_slow_worker_is_named_or_timed_out_or_no_alarm(
        request, scenario, where):
    slow = scenario(f"F4b {where}", "slow worker",
                    "HorovodRunner(np=2, timeout=90): rank 1 sleeps 15 s before an allreduce",
                    "no error; the allreduce's result is right; no process left after")
    raised = scenario(f"F3 {where}", "exception in one worker",
                      "HorovodRunner(np=2, timeout=60): rank 1 raises after an allreduce, "
                      "rank 0 waits in a sleep; every worker has started a child process",
                      "the driver's error names rank 1, its host and the message within "
                      "timeout + 30 s; "
                      "10 s later no worker or child of the job is left on any host")
    stopped = scenario(f"F4 {where}", "stopped worker",
                       "HorovodRunner(np=2, timeout=10): rank 1 stops itself with SIGSTOP "
                       "before an allreduce (past any collective's patience)",
                       "a timeout error on the driver within timeout + grace (15 s) + 30 s; "
                       "10 s later no worker or child of the job is left on any host (the "
                       "stopped one included)")
    jobs = [("slow", 90.0, 15.0), ("raise", 60.0, 0.0), ("stop", 10.0, 0.0)]
    out = run_program(request, where, f"JOBS = {jobs!r}\nHOROVOD = {_HOROVOD!r}\n"
                      + _FAULTY_JOBS, timeout=800)

    def slow_is_no_alarm(s, job):
        assert job["error"] is None, job["error"]
        assert job["result"] == 3.0
        assert job["gone"] is not None, f"left behind: {job['left']}"
        s.figure(f"finished in {job['seconds']:.1f} s, result right")

    def raised_is_named(s, job):
        host = "worker" if where == "hosts" else ""   # rank 1 runs on worker1 or worker2
        assert job["error"] is not None and f"rank 1 on host {host}" in job["error"], job["error"]
        assert "ValueError: fault injected on rank 1" in job["error"], job["error"]
        _timely_and_nothing_left(s, job, "error on the driver", limit=60 + 30)

    def stopped_times_out(s, job):
        assert job["error"] is not None and "timeout" in job["error"].lower(), job["error"]
        _timely_and_nothing_left(s, job, job["error"].split(":")[0], limit=10 + 15 + 30)

    check_each((slow, slow_is_no_alarm, out["slow"]), (raised, raised_is_named, out["raise"]),
                (stopped, stopped_times_out, out["stop"]))


# ------------------------------------------------------------ F7

# Imports TensorFlow once, then forks one writer per line on stdin: each
# writer reads the latest checkpoint, says "ready PID" and saves in a loop
# until killed; the parent reaps it and says "reaped". The kills and the
# files are what a writer started anew each time would see, without 20
# TensorFlow imports.
_SAVE_FOREVER = '''
import os, sys, time
sys.path.insert(0, sys.argv[2])
from dist_dl.core import compat
from dist_dl.train.checkpoint import CheckpointManager
from keras_models import tiny_classifier

compat.keras()  # TensorFlow and Keras, imported here once
for _ in sys.stdin:
    pid = os.fork()
    if pid == 0:
        manager = CheckpointManager(sys.argv[1], keep=3)
        latest = manager.latest()
        model = tiny_classifier(seed=1)
        epoch = latest.epoch if latest else 0
        print("ready", os.getpid(), flush=True)
        while True:
            epoch += 1
            began = time.monotonic()
            manager.save(model, epoch)
            print("saved", epoch, time.monotonic() - began, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
'''


@pytest.mark.timeout(600)
@pytest.mark.needs("tensorflow")
def test_a_checkpoint_writer_killed_twenty_times_never_leaves_a_partial_latest(
        tmp_path, scenario):
    import random
    import warnings

    from dist_dl.train.checkpoint import CheckpointManager, CorruptCheckpointWarning
    from keras_models import tiny_classifier as _model

    s = scenario("F7 local", "rank 0 killed while writing checkpoints",
                 "a process saving checkpoints in a loop (CheckpointManager, keep=3, the "
                 "code rank 0 runs) gets a real SIGKILL at a random moment of a save (after 0, 1 "
                 "or 2 finished saves, a random fraction of a save's own time into the next, "
                 "whatever the machine's pace), 20 times, restarting from its latest "
                 "checkpoint each time",
                 "after every kill the latest checkpoint loads and restores, no partial "
                 "one is taken (no corrupt-checkpoint warning), epochs never go back")
    directory = tmp_path / "ckpt"
    rng = random.Random(20261124)
    last_epoch, interrupted, kills = 0, 0, 20
    took = 0.5  # seconds of a save, until the writer has timed one
    writers = subprocess.Popen([sys.executable, "-c", _SAVE_FOREVER, str(directory), SUPPORT],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(kills):
            writers.stdin.write("go\n")
            writers.stdin.flush()
            ready, pid = writers.stdout.readline().split()
            assert ready == "ready"
            # The kill lands at a random moment of a save whatever the
            # machine's pace: after 0, 1 or 2 saves of this writer, a random
            # fraction of a save's time into the next (`took`: the last save timed).
            for _ in range(rng.choice((0, 1, 2))):
                saved, _, seconds = writers.stdout.readline().split()
                assert saved == "saved"
                took = float(seconds)
            time.sleep(rng.uniform(0.0, 1.0) * took)
            os.kill(int(pid), signal.SIGKILL)
            while (line := writers.stdout.readline().strip()) != "reaped":
                assert line.startswith("saved"), line
            # A write cut short leaves a staging folder (.tmp-ckpt-*), never a checkpoint.
            if directory.is_dir() and any(p.name.startswith(".tmp-ckpt-")
                                          for p in directory.iterdir()):
                interrupted += 1
            manager = CheckpointManager(directory)
            with warnings.catch_warnings():
                warnings.simplefilter("error", CorruptCheckpointWarning)
                latest = manager.latest()
            if latest is None:
                continue   # killed before its first save finished
            assert latest.epoch >= last_epoch
            assert manager.restore(_model(seed=2)).epoch == latest.epoch
            last_epoch = latest.epoch
    finally:
        writers.kill()
        writers.wait(30)
    assert last_epoch >= 5, "the writer hardly ever finished a save: the test tells nothing"
    s.figure(f"{kills}/{kills} kills left a loadable latest checkpoint "
             f"({interrupted} of them cut a write short; epoch {last_epoch} reached)")


# ------------------------------------------------------------ F1

@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.needs("horovod.tensorflow")
def test_a_worker_killed_at_five_points_three_times_each_loses_no_completed_epoch(
        tmp_path, scenario):
    import cloudpickle
    from mlflow.tracking import MlflowClient

    import train_hooks
    from dist_dl import train_distributed
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.train.checkpoint import CheckpointManager

    cloudpickle.register_pickle_by_value(train_hooks)
    points = train_hooks.KILL_POINTS
    # Epoch 5r+p: point p, repetition r; the victim alternates between the
    # ranks (rank 1, then 0, then 1), but rank 0 is the checkpoint's writer.
    plan = {5 * rep + p: (point, 0 if "checkpoint" in point else (rep + 1) % 2)
            for rep in range(3) for p, point in enumerate(points)}
    epochs = len(plan)
    s = scenario("F1 local", "worker SIGKILLed at five points, three times each",
                 f"train_distributed(num_workers=2, epochs={epochs}, max_retries={epochs}, "
                 "backend='local', Horovod) of a small CNN with a validation pass; in each "
                 "epoch one worker gets SIGKILL from itself at one of five points: "
                 + "; ".join(points) + " (each made by the worker's own code at the point, "
                 "whatever the machine's pace: the allreduce from an identity layer's gradient "
                 "inside the compiled step, after the later layers' gradients; the checkpoint "
                 "write as the state's files are in the temporary folder and the manifest is "
                 "not; validation as its second step is called). Each point three times, in "
                 "one run, the victim alternating between ranks",
                 "the run finishes after every kill (each retry goes on from the last "
                 "complete checkpoint); no completed epoch is lost: each attempt begins at "
                 "the epoch the kill interrupted, so only that epoch runs again; every epoch "
                 "is logged once; the latest checkpoint is the last epoch's")
    shards = str(tmp_path / "shards")
    # 24 rows: 3 steps of 4 per worker and epoch, which the points need.
    make_synthetic_images(shards, rows=24, image_size=16, classes=3, rows_per_row_group=4)
    log, ckpt = str(tmp_path / "epochs.log"), str(tmp_path / "checkpoints")
    os.makedirs(ckpt)
    store = (tmp_path / "mlruns").as_uri()
    started = time.monotonic()
    trained = train_distributed(
        shards, validation=shards, model=train_hooks.gated_cnn, epochs=epochs, num_workers=2,
        batch_size=4, image_size=16, max_retries=epochs, backend="local", engine="horovod",
        reader="arrow",
        tracking_uri=store, output_dir=str(tmp_path / "out"), checkpoint_dir=ckpt,
        callbacks=train_hooks.KillPlan(log, plan, ckpt))
    took = time.monotonic() - started

    landed = {epoch: open(f"{log}.{epoch}").read() for epoch in plan
              if os.path.exists(f"{log}.{epoch}")}
    assert sorted(landed) == sorted(plan), f"kills that did not happen: {set(plan) - set(landed)}"
    for epoch, (point, _) in plan.items():
        expected = {"during the allreduce": "inside the training step",
                    "during rank 0's checkpoint write": "inside CheckpointManager.save",
                    "during validation": "inside the validation pass"}.get(point, "")
        assert landed[epoch].startswith(expected), (epoch, point, landed[epoch])
    assert trained.attempts == epochs + 1
    # Attempt 1 began epoch 0 and was killed in it; every later attempt began
    # at the epoch the last kill interrupted (its checkpoint never published)
    # and was killed in the next one, the last attempt finished.
    begun = train_hooks.epochs_begun(log)
    assert begun == [[0]] + [[e - 1, e] for e in range(1, epochs)] + [[epochs - 1]], begun
    assert len(trained.history["loss"]) == epochs
    tags = MlflowClient(store).get_run(trained.run_id).data.tags
    assert tags["dist_dl.attempts"] == str(epochs + 1)
    assert all("SIGKILL" in tags[f"dist_dl.attempt_{a}_error"] for a in range(1, epochs + 1))
    latest = CheckpointManager(ckpt).latest()
    assert latest is not None and latest.epoch == epochs, latest
    for point in points:
        where = sorted({landed[e] for e, (p, _) in plan.items() if p == point})
        s.figure(f"{point}: 3/3 kills, the run went on (" + "; ".join(where) + ")")
    s.figure(f"{epochs} kills, {trained.attempts} attempts, each beginning at the epoch "
             f"the kill interrupted; {epochs} epochs logged once each; latest checkpoint "
             f"epoch {latest.epoch}; {took:.0f} s in all")


# ------------------------------------------------------------ F6

_INTERRUPTED_TRAININGS = '''
import glob, signal, threading
from mlflow.tracking import MlflowClient
from dist_dl import train_distributed
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))
root = os.path.join(SHARED, "f6")
frame = digits_frame(spark, os.path.join(root, "digits"))
# One output folder: the second training reuses the DataFrame's shards.
out_dir, mlruns = os.path.join(root, "out"), os.path.join(root, "mlruns")
checkpoints = os.path.join(out_dir, "checkpoints", "*", "ckpt-*")

def interrupt(fault, state, before):
    # Once this training's first checkpoint is published: well under way.
    while not set(glob.glob(checkpoints)) - before:
        time.sleep(0.1)
    time.sleep(1.0)   # into the second epoch
    state["at"] = time.time()
    if fault == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    else:
        spark.sparkContext.cancelAllJobs()

outcomes = {}
for fault in FAULTS:
    state = {}
    threading.Thread(target=interrupt, args=(fault, state, set(glob.glob(checkpoints))),
                     daemon=True).start()
    try:
        train_distributed(frame, model="small_cnn", image_size=16, image_col="content",
                          label_col="digit", num_workers=2, backend="spark", epochs=40,
                          batch_size=32, augment=False, eval_crop_fraction=1.0, max_retries=2,
                          output_dir=out_dir, tracking_uri=mlruns,
                          experiment_name="f6-" + fault)
        error = None
    except BaseException as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    raised = time.time() - state.get("at", time.time())
    gone, left = gone_within(HOROVOD, seconds=max(0.0, 10.0 - raised))
    client = MlflowClient(mlruns)
    runs = client.search_runs([client.get_experiment_by_name("f6-" + fault).experiment_id])
    outcomes[fault] = {
        "error": error, "raised": raised, "gone": gone, "left": left,
        "status": [r.info.status for r in runs],
        "attempt_tags": [sorted(k for k in r.data.tags if k.startswith("dist_dl.attempt"))
                         for r in runs]}
print(json.dumps(outcomes))
'''


# ------------------------------------------------------------ F10

_SCORING_A_MILLION = '''
import io, tempfile
import mlflow
from PIL import Image
from pyspark.sql import functions as F
from sklearn.datasets import load_digits
from dist_dl.core import compat
from dist_dl.app.bench import MemoryPeaks
from dist_dl.score import score_dataframe
from dist_dl.core.session import get_spark
from dist_dl.tracking import ImagePreprocessing, log_keras_classifier

spark = ready(get_spark(MASTER))
blobs = []
for pixels in load_digits().images[:64]:
    buffer = io.BytesIO()
    Image.fromarray((pixels * 255 / 16).astype("uint8"), mode="L").save(buffer, format="PNG")
    blobs.append(buffer.getvalue())
spec = ImagePreprocessing(image_size=8, channels=1, mean=0.5, std=0.25)
keras = compat.keras()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input(spec.input_shape), keras.layers.Conv2D(8, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
mlflow.set_tracking_uri("file://" + os.path.join(SHARED, "mlruns"))
uri = log_keras_classifier(model, spec).model_uri
images = spark.createDataFrame(list(enumerate(blobs)), "k long, image binary")

def score(rows):
    """Score ``rows`` rows made in the JVM (a digit each, one in 100,000 not an
    image); the executors' memory peaks while it runs."""
    frame = (spark.range(rows).withColumn("k", F.col("id") % 64)
             .join(F.broadcast(images), "k")
             .withColumn("image", F.when(F.col("id") % 100000 == 7, F.lit(b"corrupt"))
                         .otherwise(F.col("image"))))
    scored = score_dataframe(frame, uri, image_col="image", batch_size=256, on_error="null")
    start = time.perf_counter()
    with MemoryPeaks() as memory:
        total = scored.agg(F.count("*").alias("rows"), F.count("prediction").alias("predicted"),
                           F.collect_list(F.when(F.col("score_error").isNotNull(),
                                                 F.col("id"))).alias("failed"),
                           F.first("score_error", ignorenulls=True).alias("reason")).first()
    seconds = time.perf_counter() - start
    return {"rows": total["rows"], "predicted": total["predicted"],
            "failed": sorted(total["failed"]), "reason": total["reason"], "seconds": seconds,
            "worker_peak": memory.peak("python_worker"),
            "workers_peak": memory.peak_total.get("python_worker", 0),
            "jvm_peak": memory.peak("jvm"),
            "workers": sum(1 for c, _ in memory.peaks.values()
                           if MemoryPeaks.kind(c) == "python_worker")}

small = score(50_000)
large = score(1_000_000)
print(json.dumps({"small": small, "large": large,
                  "arrow_batch": spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")}))
'''


@pytest.mark.timeout(600)
@pytest.mark.needs("tensorflow")
def test_a_million_rows_score_in_bounded_memory_and_a_corrupt_image_is_null(request, scenario):
    s = scenario("F10b local", "scoring a million rows",
                 "score_dataframe(on_error='null') of 1,000,000 rows of encoded digits made "
                 "in the JVM (10 of them not images, one in 100,000) on local[2], after a run "
                 "of 50,000 rows; every process's resident memory sampled every 0.2 s",
                 "every row comes out, the 10 corrupt ones with a null prediction and a "
                 "reason; the peak of a Python worker at 1,000,000 rows is within 1.25 times "
                 "(+64 MiB) of its peak at 50,000: memory does not grow with the rows")
    out = run_program(request, "local", _SCORING_A_MILLION, timeout=560)
    small, large = out["small"], out["large"]
    mib = 2 ** 20
    assert large["rows"] == 1_000_000 and small["rows"] == 50_000, out
    assert large["failed"] == [7 + 100_000 * i for i in range(10)], large["failed"]
    assert small["failed"] == [7], small["failed"]
    assert large["predicted"] == 1_000_000 - 10 and small["predicted"] == 50_000 - 1
    assert "cannot be decoded" in large["reason"], large["reason"]
    assert large["worker_peak"] > 0 and small["worker_peak"] > 0, out
    s.figure(f"1,000,000 rows in {large['seconds']:.0f} s ({1e6 / large['seconds']:,.0f} rows/s), "
             f"every row out, the 10 corrupt ones null with {large['reason'][:90]!r}")
    s.figure(f"peak RSS of one Python worker: {small['worker_peak'] / mib:.0f} MiB at 50,000 "
             f"rows, {large['worker_peak'] / mib:.0f} MiB at 1,000,000 (all "
             f"{large['workers']} PySpark processes together: {large['workers_peak'] / mib:.0f} "
             f"MiB; the JVM, driver and executor in one on local[2]: "
             f"{large['jvm_peak'] / mib:.0f} MiB); Arrow batches of {out['arrow_batch']} rows, "
             f"model calls of 256")
    assert large["worker_peak"] <= 1.25 * small["worker_peak"] + 64 * mib, out
    # The rate goes to the benchmarks' results too (benchmarks/results.json),
    # when `make reliability-report` turns the records into docs/.
    from dist_dl.app.bench import result_entry

    s.rate("reliability.scoring_rows_per_second", result_entry(
        [1e6 / large["seconds"]], rows=1_000_000, scenario="F10b local",
        command='make test-reliability PYTEST_ARGS="-k a_million_rows" && make reliability-report',
        note="score_dataframe(on_error='null') of 1,000,000 rows on local[2], in the "
             "reliability suite (docs/reliability.json); memory sampled every 0.2 s "
             "meanwhile"))


@pytest.mark.timeout(900)
@pytest.mark.hosts
def test_ctrl_c_or_a_cancel_on_the_driver_ends_every_worker(request, scenario):
    where = "hosts"
    # One driver program: the cancel, then Ctrl-C (a notebook's cells on one
    # cluster); the second training reuses the first one's shards.
    faults = {"cancel": ("F6b", "Spark jobs cancelled", "SparkContext.cancelAllJobs() from "
                         "another thread of the driver (a notebook's or a service's cancel)"),
              "sigint": ("F6a", "Ctrl-C on the driver", "SIGINT to the driver process")}
    made = {fault: scenario(f"{key} {where}", title,
                            f"train_distributed(df, num_workers=2, max_retries=2) on the "
                            f"cluster; {how} one second into epoch 2",
                            "every worker process ends within 10 s of it on every host; no "
                            "temporary folder of the library is left; the MLflow run is "
                            "KILLED, not retried")
            for fault, (key, title, how) in faults.items()}
    out = run_program(request, where, f"FAULTS = {list(faults)!r}\nHOROVOD = {_HOROVOD!r}\n"
                      + _INTERRUPTED_TRAININGS, timeout=800)
    # After the driver program ended: its session's scratch folder too.
    leftovers = []
    cluster = request.getfixturevalue("hosts")
    for name in ("driver", "worker1", "worker2"):
        listing = cluster.hosts[name].run(["sh", "-c", "ls -d /tmp/dist_dl-* 2>/dev/null"],
                                          env=cluster.env(name), timeout=30).stdout.split()
        leftovers += [f"{name}:{p}" for p in listing]

    def interrupted(s, fault, run):
        expected = "KeyboardInterrupt" if fault == "sigint" else "JobCancelled"
        assert run["error"] is not None and run["error"].startswith(expected), run["error"]
        s.figure(f"{expected} on the driver {run['raised']:.1f} s after it")
        assert run["gone"] is not None, f"left behind: {run['left']}"
        s.figure(f"every worker gone {run['raised'] + run['gone']:.1f} s after it")
        assert run["status"] == ["KILLED"], run["status"]
        assert run["attempt_tags"] == [[]], f"a cancelled run must not be retried: {run}"
        assert leftovers == [], leftovers
        s.figure("run KILLED, no temporary folder left on any host")

    check_each(*[(s, interrupted, fault, out[fault]) for fault, s in made.items()])


# ------------------------------------------------------------ F8

_ENSEMBLE_WITH_A_LOST_EXECUTOR = '''
import glob, signal, socket, threading
import numpy as np
from sklearn.datasets import load_wine
from dist_dl.ensemble import train_ensemble
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))
root = os.path.join(SHARED, "f8")
marks = os.path.join(root, "marks")
os.makedirs(marks, exist_ok=True)
wine = load_wine(as_frame=True).frame
features = [c for c in wine.columns if c != "target"]
df = spark.createDataFrame(wine)

def factory_for(pause):
    def factory(member):
        from pyspark import TaskContext
        from sklearn.ensemble import RandomForestClassifier
        # One mark per task attempt (Spark's task id): a retry after a lost
        # executor may be attempt 0 of a new stage attempt, on the same host.
        attempt = TaskContext.get().taskAttemptId()
        open(os.path.join(marks, f"{pause}-{member}-{attempt}-{socket.gethostname()}-"
                                 f"{os.getpid()}"), "w").close()
        time.sleep(pause)
        return RandomForestClassifier(n_estimators=25, random_state=member)
    return factory

def run(name, pause):
    out_dir = os.path.join(root, name)
    ensemble = train_ensemble(df, factory_for(pause), num_models=4, feature_cols=features,
                              label_col="target", output_dir=out_dir,
                              tracking_uri=os.path.join(root, "mlruns"), run_name=name)
    x = wine[features].to_numpy(dtype=np.float64)
    probas = [m.predict_proba(x).tolist() for m in ensemble.members]
    files = files_under(out_dir)
    import mlflow
    logged = mlflow.artifacts.download_artifacts(ensemble.model_uri,
                                                 dst_path=os.path.join(root, name + "-model"))
    logged_members = sorted(os.path.basename(p) for p in glob.glob(
        os.path.join(logged, "**", "member*"), recursive=True))
    return {"score": ensemble.score, "probas": probas, "rows": list(ensemble.member_rows),
            "files": files, "logged_members": logged_members}

baseline = run("baseline", 0.0)

state = {}
def kill_worker1_executor(mark, key):
    """SIGKILL worker1's executor JVM a second after a task marked there."""
    def kill():
        while not glob.glob(os.path.join(marks, mark)):
            time.sleep(0.1)
        time.sleep(1.0)
        jvms = [p for p in job_processes(["CoarseGrainedExecutorBackend"])
                if p["host"] == "worker1"]
        for p in jvms:
            os.kill(p["pid"], signal.SIGKILL)
        state[key], state[key + "_at"] = [p["pid"] for p in jvms], time.time()
    threading.Thread(target=kill, daemon=True).start()

# Once a training task of the second run has started on worker1.
kill_worker1_executor("6.0-*-worker1-*", "killed")
start = time.time()
faulted = run("faulted", 6.0)
seconds = time.time() - start
attempts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(marks, "6.0-*")))
after_kill = time.time() - state.get("killed_at", time.time())

# A search: the same, with a trial's task on worker1 when its executor dies.
from dist_dl.search import search, Uniform
from mlflow.tracking import MlflowClient

def trial(params, reporter):
    from pyspark import TaskContext
    open(os.path.join(marks, f"trial-{params['x']:.6f}-{TaskContext.get().taskAttemptId()}-"
                             f"{socket.gethostname()}"), "w").close()
    for step in range(3):
        time.sleep(2.0)
        reporter.report((params["x"] - 3.0) ** 2 + 1.0 / (step + 1))
    return (params["x"] - 3.0) ** 2

kill_worker1_executor("trial-*-worker1", "trial_killed")
mlruns = os.path.join(root, "mlruns")
found = search(trial, {"x": Uniform(0.0, 6.0)}, max_trials=4, max_concurrent=2,
               early_stopping=None, tracking_uri=mlruns, experiment_name="f8-search",
               spark=spark)
client = MlflowClient(mlruns)
experiment = client.get_experiment_by_name("f8-search")
children = [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("mlflow.parentRunId") == found.parent_run_id]
trial_marks = sorted(os.path.basename(p) for p in glob.glob(os.path.join(marks, "trial-*")))
print(json.dumps({"baseline": baseline, "faulted": faulted, "killed": state.get("killed"),
                  "after_kill": after_kill, "seconds": seconds, "attempts": attempts,
                  "trial_killed": state.get("trial_killed"), "trial_marks": trial_marks,
                  "trials": [[t.number, t.params["x"], t.status, t.value]
                             for t in found.trials],
                  "children": sorted([r.data.tags.get("dist_dl.trial"), r.info.status]
                                     for r in children)}))
'''


def _repeated(items) -> list:
    """The items that occur more than once, sorted."""
    items = list(items)
    return sorted({i for i in items if items.count(i) > 1})


@pytest.mark.timeout(900)
@pytest.mark.hosts
def test_an_executor_lost_during_an_ensemble_or_a_search_loses_and_repeats_nothing(request, scenario):
    s = scenario("F8 hosts", "executor lost during an ensemble or a search",
                 "train_ensemble(num_models=4, random forests) on the cluster, once "
                 "undisturbed and once with worker1's executor JVM SIGKILLed while its "
                 "first training task runs (each member's factory pauses 6 s); then "
                 "search(max_trials=4, max_concurrent=2) with the executor killed again "
                 "while a trial runs there",
                 "the undisturbed run's held-out accuracy is above 0.8; the faulted run "
                 "finishes through Spark's task retry; its 4 members predict "
                 "exactly as the undisturbed run's (no duplicate or missing member, the "
                 "same held-out score); no file is left under output_dir; the MLflow "
                 "model holds 4 members; the search's trials run on both worker hosts and "
                 "it ends with 4 completed trials, each once, one finished MLflow run each")
    out = run_program(request, "hosts", _ENSEMBLE_WITH_A_LOST_EXECUTOR, timeout=800)
    assert out["killed"], f"no executor JVM was found on worker1 to kill: {out}"
    retried = _repeated(a.split("-")[1] for a in out["attempts"])
    assert retried, f"the kill retried no task: {out['attempts']}"
    s.figure(f"executor JVM killed, member(s) {', '.join(retried)} trained again; the run finished "
             f"{out['after_kill']:.1f} s after the kill ({out['seconds']:.1f} s in all)")
    base, faulted = out["baseline"], out["faulted"]
    # The undisturbed run is the ensemble on separate hosts: members written to
    # the shared output_dir by the executors, read back on the driver.
    assert len(base["probas"]) == 4 and base["score"] > 0.8, base["score"]
    assert len(faulted["probas"]) == 4
    assert faulted["rows"] == base["rows"], (faulted["rows"], base["rows"])
    assert faulted["probas"] == base["probas"], "a retried member differs from the undisturbed run's"
    assert faulted["score"] == base["score"]
    s.figure(f"4 members, each predicting exactly as the undisturbed run's "
             f"(held-out accuracy {faulted['score']:.3f} both)")
    assert faulted["files"] == [] and base["files"] == [], (faulted["files"], base["files"])
    assert len(faulted["logged_members"]) == 4, faulted["logged_members"]
    s.figure("no file left under output_dir; 4 members in the MLflow model")
    # The search: worker1's executor killed while a trial runs there.
    assert out["trial_killed"], "no executor JVM was found on worker1 during the search"
    assert len(out["trials"]) == 4 and not _repeated(t[1] for t in out["trials"]), out["trials"]
    assert all(status == "completed" and value == pytest.approx((x - 3.0) ** 2)
               for _, x, status, value in out["trials"]), out["trials"]
    # Trials ran on both worker hosts and reported to the driver's address from each.
    assert {m.split("-")[-1] for m in out["trial_marks"]} == {"worker1", "worker2"}, \
        out["trial_marks"]
    rerun = _repeated(m.split("-")[1] for m in out["trial_marks"])
    assert rerun, f"the kill retried no trial: {out['trial_marks']}"
    assert out["children"] == [[str(n), "FINISHED"] for n in range(4)], out["children"]
    s.figure(f"search of 4 trials with the executor killed under one: {len(rerun)} trial "
             f"run again by Spark, 4 trials completed with the right values, one MLflow run "
             f"each, all FINISHED")


# ------------------------------------------------------------ F9

_THREE_CALLS_AT_ONCE = r'''
import threading
from mlflow.tracking import MlflowClient
from sklearn.datasets import load_wine
from sklearn.ensemble import RandomForestClassifier
from dist_dl import train_distributed
from dist_dl.ensemble import train_ensemble
from dist_dl.core.session import get_spark, task_slots

spark = ready(get_spark(MASTER))
root = os.path.join(SHARED, "f9")
# About 180 images: the scenario is about waiting for slots, not training.
frame = digits_frame(spark, os.path.join(root, "digits"), validation_fraction=0.9)
wine = load_wine(as_frame=True).frame
wine_df = spark.createDataFrame(wine).repartition(4)
# One output folder and one tracking store for all, as notebooks of a team
# attached to one cluster would share them; an experiment each.
out_dir, mlruns = os.path.join(root, "out"), os.path.join(root, "mlruns")

def training(engine, name):
    return lambda: train_distributed(
        frame, model="small_cnn", image_size=16, image_col="content", label_col="digit",
        num_workers=2, backend="spark", engine=engine, epochs=1, batch_size=32, augment=False,
        eval_crop_fraction=1.0, max_retries=0, output_dir=out_dir, tracking_uri=mlruns,
        experiment_name=name).run_id

def ensemble():
    return train_ensemble(wine_df, lambda i: RandomForestClassifier(n_estimators=10, random_state=i),
                          num_models=4, feature_cols=[c for c in wine.columns if c != "target"],
                          label_col="target", output_dir=out_dir, tracking_uri=mlruns,
                          experiment_name="f9-ensemble").run_id

calls = {"f9-horovod": training("horovod", "f9-horovod"),
         "f9-tensorflow": training("tensorflow", "f9-tensorflow"),
         "f9-ensemble": ensemble}
slots = task_slots(spark)
results, go = {}, threading.Barrier(len(calls))

def call(name, fn):
    go.wait()
    start = time.time()
    try:
        results[name] = {"run_id": fn(), "error": None}
    except BaseException as exc:
        import traceback
        # The whole traceback: the error alone does not say where.
        results[name] = {"run_id": None, "error": traceback.format_exc()[-4000:]}
    results[name].update(start=start, end=time.time())

threads = [threading.Thread(target=call, args=item, daemon=True) for item in calls.items()]
began = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join(max(1.0, 600 - (time.time() - began)))
hung = sorted(name for name, t in zip(calls, threads) if t.is_alive())
client = MlflowClient(mlruns)
runs = {}
for name in calls:
    experiment = client.get_experiment_by_name(name)
    found = client.search_runs([experiment.experiment_id]) if experiment else []
    runs[name] = [{"run_id": r.info.run_id, "status": r.info.status,
                   "engine": r.data.params.get("train.engine"),
                   "attempts": r.data.tags.get("dist_dl.attempts"),
                   "accuracy": r.data.metrics.get("accuracy"),
                   "rows": [int(r.data.params.get(k, 0)) for k in ("data_rows", "validation_rows")],
                   "artifacts": sorted(a.path for a in client.list_artifacts(r.info.run_id)),
                   "checkpoint_dir": r.data.params.get("train.checkpoint_dir")}
                  for r in found]
listing = files_under(out_dir)
print(json.dumps({"slots": slots, "rows": frame.count(), "hung": hung, "results": results,
                  "runs": runs, "listing": listing, "seconds": time.time() - began}))
'''


@pytest.mark.timeout(900)
@pytest.mark.hosts
@pytest.mark.needs("horovod.tensorflow")
def test_two_trainings_and_an_ensemble_at_once_each_wait_then_run(request, scenario):
    s = scenario("F9 hosts", "load: two trainings and an ensemble at once",
                 "from three threads of one driver program on the cluster (2 task slots), "
                 "started together: train_distributed(num_workers=2, epochs=1) with "
                 "engine='horovod' and with engine='tensorflow', each needing both "
                 "slots, on the same DataFrame, and train_ensemble(num_models=4); one "
                 "output_dir and one MLflow store for all, an experiment each",
                 "every call finishes (none hangs, none fails, no retry needed): each waits "
                 "for the slots and then runs; one finished MLflow run per call with its "
                 "own engine; each training read every row of the DataFrame once (one set "
                 "of shards); its checkpoints in its own run's folder; no temporary file "
                 "left")
    out = run_program(request, "hosts", _THREE_CALLS_AT_ONCE, timeout=800)
    assert out["hung"] == [], f"calls still running after 600 s: {out['hung']}"
    failed = {name: r["error"] for name, r in out["results"].items() if r["error"]}
    assert not failed, failed
    began = min(r["start"] for r in out["results"].values())
    s.figure("finished: " + "; ".join(
        f"{name[3:]} {r['end'] - began:.0f} s" for name, r in
        sorted(out["results"].items(), key=lambda item: item[1]["end"]))
        + f" after the start ({out['slots']} task slots)")
    for name, result in out["results"].items():
        runs = out["runs"][name]
        assert [r["run_id"] for r in runs] == [result["run_id"]], (name, runs)
        run = runs[0]
        assert run["status"] == "FINISHED", (name, run)
        # Its model in its own run (MLflow's tracking URI is one per process:
        # a call that ended first used to point the others at another store).
        assert "model" in run["artifacts"], (name, run)
        if "ensemble" in name:
            continue
        assert run["engine"] == name.split("-")[1], (name, run)
        assert run["attempts"] in (None, "1"), (name, run)
        assert run["checkpoint_dir"].endswith(os.path.join("checkpoints", run["run_id"])), run
        assert run["accuracy"] is not None, (name, run)   # one epoch of 180 images: no more
        # Each training read the DataFrame's rows once (its shards were not
        # written over by the others' at the same time).
        assert sum(run["rows"]) == out["rows"], (name, run["rows"], out["rows"])
    # Each run's files under its own run's folder; the shards written once.
    run_ids = {r["run_id"] for r in out["results"].values()}
    for path in out["listing"]:
        parts = path.split(os.sep)
        if parts[0] in ("checkpoints", "tensorboard"):
            assert parts[1] in run_ids, path
        assert not any(p.startswith((".tmp", "tmp")) or p.endswith(".tmp") for p in parts), path
    shards = sorted({p.split(os.sep)[1] for p in out["listing"] if p.startswith("shards" + os.sep)})
    s.figure(f"2 trainings finished with their own engine, 1 attempt each; the ensemble "
             f"finished; {len(shards)} shard set(s) for the shared DataFrame; "
             f"{len(out['listing'])} files under the shared output_dir, each in its run's "
             f"folder; {out['seconds']:.0f} s in all")


# ------------------------------------------------------------ F2

def _program_in_thread(request, code: str, timeout: float):
    """A driver program on the cluster, run from a thread so that the test
    can injure the cluster meanwhile; ``outcome`` gets "out" or "error"."""
    import threading

    outcome = {}

    def drive():
        try:
            outcome["out"] = run_program(request, "hosts", code, timeout=timeout)
        except BaseException as exc:   # the test reports it
            outcome["error"] = exc

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread, outcome


def _wait_until(ready, driver, outcome, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not ready():
        assert driver.is_alive(), outcome
        assert time.time() < deadline, f"{what} in {seconds:g} s"
        time.sleep(0.2)


def _result(driver, outcome, seconds: float) -> dict:
    """What the driver program printed, once it ends (a hang fails)."""
    driver.join(seconds)
    assert not driver.is_alive(), "the driver program hangs"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["out"]


def _cut_off(cluster, host: str, wait) -> tuple[float, float]:
    """Take ``host``'s interface down in its namespace, call ``wait()``, bring
    it back up (whatever happens); the moments it went down and came back."""
    netns = cluster.hosts[host].netns
    cut = time.time()
    subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True, timeout=30)
    try:
        wait()
    finally:
        up = time.time()
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True, timeout=30)
    return cut, up


_TRAINING_THROUGH_A_CUT = '''
from mlflow.tracking import MlflowClient
from dist_dl import train_distributed
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))
root = os.path.join(SHARED, "f2")
frame = digits_frame(spark, os.path.join(root, "digits"))
out_dir, mlruns = os.path.join(root, "out"), os.path.join(root, "mlruns")

class Stamped:
    """stdout, with the moment the library said that an attempt failed, and
    what it said of task slots (a retry waits for the cut host's)."""
    def __init__(self, out):
        self.out, self.failed_at, self.slots = out, None, []
    def write(self, text):
        if self.failed_at is None and "attempt 1 failed" in text:
            self.failed_at = time.time()
        if "task slots" in text:
            self.slots.append(text.strip()[:300])
        return self.out.write(text)
    def flush(self):
        self.out.flush()

stamped = sys.stdout = Stamped(sys.stdout)
try:
    train_distributed(frame, model="small_cnn", image_size=16, image_col="content",
                      label_col="digit", num_workers=2, backend="spark", epochs=EPOCHS,
                      batch_size=32, augment=False, eval_crop_fraction=1.0, max_retries=2,
                      timeout=TIMEOUT, output_dir=out_dir, tracking_uri=mlruns,
                      callbacks=hold_at(1, HOLD))
    error = None
except BaseException as exc:
    error = f"{type(exc).__name__}: {exc}"[:3000]
client = MlflowClient(mlruns)
runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
run = runs[0]
print(json.dumps({"error": error, "failed_at": stamped.failed_at, "slots": stamped.slots,
                  "ended": time.time(), "status": run.info.status,
                  "tags": {k: v for k, v in run.data.tags.items() if k.startswith("dist_dl.att")}}))
'''


@pytest.mark.timeout(900)
@pytest.mark.hosts
@pytest.mark.needs("tensorflow")
# With Horovod (engine "auto" where it is installed), the surviving worker
# exits after Gloo's timeout; with tf.distribute (16.4, 17.3, 18), after
# TensorFlow's coordination service found the cut-off task stopped sending
# heartbeats. Either way the error names the host cut off.
def test_a_worker_host_cut_off_the_network_fails_the_attempt_and_the_retry_finishes(
        request, scenario):
    import glob

    cluster = request.getfixturevalue("hosts")
    # Gloo's collective timeout is 30 s: a cut of 50 s outlasts it by 20.
    down_for, timeout, epochs = 50.0, 150.0, 2
    s = scenario("F2 hosts", "worker host cut off the network",
                 f"train_distributed(df, num_workers=2, epochs={epochs}, timeout={timeout:g}, "
                 f"max_retries=2) on the cluster; once its first checkpoint is published, "
                 f"worker2's interface is taken down in its namespace for {down_for:g} s, "
                 f"then brought back; the workers wait at the second epoch's start (a "
                 f"callback of the test's) until the interface is down, so the cut lands "
                 f"inside the training whatever the machine's pace",
                 "the attempt fails within its timeout with an error naming the rank and "
                 "the host cut off; the retry finishes the run from the last checkpoint; "
                 "no hang")
    root = os.path.join(str(cluster.shared), "f2")
    shutil.rmtree(root, ignore_errors=True)
    hold = os.path.join(str(cluster.shared), f"f2-hold-{uuid.uuid4().hex}")
    driver, outcome = _program_in_thread(
        request, f"EPOCHS = {epochs}\nTIMEOUT = {timeout!r}\nHOLD = {hold!r}\n"
        + _TRAINING_THROUGH_A_CUT, 800)
    _wait_until(lambda: glob.glob(os.path.join(root, "out", "checkpoints", "*", "ckpt-*")),
                driver, outcome, 400, "training published no checkpoint")

    def down():
        open(hold, "w").close()   # the workers go on, into the cut
        time.sleep(down_for)

    cut, _ = _cut_off(cluster, "worker2", down)
    out = _result(driver, outcome, 780)
    assert out["error"] is None, out["error"]
    assert out["status"] == "FINISHED", out
    failure = out["tags"].get("dist_dl.attempt_1_error", "")
    assert failure, f"the cut failed no attempt: {out['tags']}"
    assert out["failed_at"] is not None
    failed_after = out["failed_at"] - cut
    s.figure(f"attempt 1 failed {failed_after:.1f} s after the cut: {failure[:400]!r}")
    assert failed_after < timeout, failed_after
    # The cut host is named: as the rank that failed, or as a peer of the
    # rank whose collective timed out waiting for it.
    assert "rank" in failure and "on host worker2" in failure, failure
    if out["slots"]:
        s.figure(f"before the retry: {out['slots'][0]!r} ... {out['slots'][-1]!r}")
    s.figure(f"the retry finished the run {out['ended'] - cut:.1f} s after the cut "
             f"(attempts: {out['tags'].get('dist_dl.attempts')})")


# ------------------------------------------------------------ F5

_RESTARTABLE_TRAINING = '''
import json, os, sys, time
from mlflow.tracking import MlflowClient
from pyspark.sql import functions as F
from dist_dl import train_distributed
from dist_dl.prepare import write_digits_tree
from dist_dl.core.session import get_spark

sys.path.insert(0, SUPPORT)
import cloudpickle, train_hooks
cloudpickle.register_pickle_by_value(train_hooks)

spark = ready(get_spark(MASTER))
root = os.path.join(SHARED, "f5")
digits = os.path.join(root, "digits")
if not os.path.isdir(digits):
    write_digits_tree(digits, image_size=16, validation_fraction=0.0)
frame = (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
         .load(os.path.join(digits, "train"))
         .withColumn("digit", F.regexp_extract("path", r"/(\\d)/[^/]+$", 1)))
mlruns = os.path.join(root, "mlruns")
print("training", flush=True)
result = train_distributed(frame, model="small_cnn", image_size=16, image_col="content",
                           label_col="digit", num_workers=2, backend="spark", epochs=EPOCHS,
                           batch_size=32, augment=False, eval_crop_fraction=1.0,
                           output_dir=os.path.join(root, "out"),
                           checkpoint_dir=os.path.join(root, "checkpoints"), tracking_uri=mlruns,
                           callbacks=train_hooks.HoldAt(2, HOLD))
run = MlflowClient(mlruns).get_run(result.run_id)
print(json.dumps({"status": run.info.status, "tags": {k: v for k, v in run.data.tags.items()
                                                       if k.startswith("dist_dl.")}}))
'''


@pytest.mark.timeout(900)
@pytest.mark.hosts
@pytest.mark.needs("tensorflow")
def test_a_killed_driver_started_again_resumes_and_leaves_no_worker(request, scenario):
    import glob

    from dist_dl.train.checkpoint import CheckpointManager

    cluster = request.getfixturevalue("hosts")
    epochs = 4
    s = scenario("F5 hosts", "driver killed and started again",
                 f"train_distributed(df, num_workers=2, epochs={epochs}, checkpoint_dir in the "
                 "shared folder) on the cluster; the driver process gets SIGKILL once its "
                 "second checkpoint is published, while the workers wait at the third "
                 "epoch's start (a callback of the test's, so the kill lands inside the "
                 "training whatever the machine's pace); the same program is started again "
                 "on the same host",
                 "no worker of the killed driver is left on any host (within 30 s); the new "
                 "run starts from the last complete checkpoint's epoch and finishes")
    root = os.path.join(str(cluster.shared), "f5")
    shutil.rmtree(root, ignore_errors=True)
    watch = _cluster_watch(cluster)
    hold = os.path.join(str(cluster.shared), f"f5-hold-{uuid.uuid4().hex}")
    code = f"EPOCHS = {epochs}\nSUPPORT = {SUPPORT!r}\nHOLD = {hold!r}\n" + _RESTARTABLE_TRAINING
    log = cluster.logs / "f5-first-driver.log"
    first = cluster.hosts["driver"].popen(
        [sys.executable, "-c", cluster.driver_script(code, timeout=700)],
        env=cluster.env("driver"), log=log, cwd="/tmp/driver")
    try:
        deadline = time.time() + 400
        checkpoints = os.path.join(root, "checkpoints")
        while len(glob.glob(os.path.join(checkpoints, "ckpt-*"))) < 2:
            assert first.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.time() < deadline, "no second checkpoint in 400 s"
            time.sleep(0.2)
        assert watch["job_processes"](_HOROVOD), "no worker process of the job was seen running"
        first.send_signal(signal.SIGKILL)
        killed = time.time()
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    gone, left = watch["gone_within"](_HOROVOD, seconds=30.0)
    assert gone is not None, f"workers of the killed driver still run 30 s later: {left}"
    gone_after = time.time() - killed
    s.figure(f"every worker of the killed driver gone {gone_after:.1f} s after the kill")
    latest = CheckpointManager(checkpoints).latest()
    assert latest is not None and latest.epoch == 2, latest
    open(hold, "w").close()   # the new driver's workers do not wait

    out = cluster.run_driver(code, timeout=700)
    assert out["status"] == "FINISHED", out
    assert out["tags"].get("dist_dl.initial_epoch") == str(latest.epoch), (out["tags"], latest)
    s.figure(f"the new driver resumed after epoch {latest.epoch} (the last complete "
             f"checkpoint when the old one was killed) and finished epoch {epochs}")


_ALLREDUCE_THROUGH_A_CUT = '''
from dist_dl import HorovodRunner
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))

def main(mark):
    import time
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    if hvd.rank() == 0:
        open(mark, "w").close()
    start = time.time()
    steps = 0
    while time.time() - start < 100:
        hvd.allreduce(tf.constant([1.0]), name=f"step{steps}")
        steps += 1
        time.sleep(0.02)
    return steps

start = time.time()
try:
    # Gloo's collective timeout set short (its default is 30 s): the test's wait.
    HorovodRunner(np=2, timeout=120, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}).run(
        main, mark=MARK)
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"error": error[:3000] if error else None, "failed_at": time.time()}))
'''


@pytest.mark.timeout(600)
@pytest.mark.hosts
@pytest.mark.needs("horovod.tensorflow")
def test_a_worker_host_cut_off_the_network_ends_a_horovod_runner_job_not_hangs_it(
        request, scenario):
    cluster = request.getfixturevalue("hosts")
    down_for = 130.0
    s = scenario("F2b hosts", "worker host cut off the network for good, plain HorovodRunner",
                 "HorovodRunner(np=2, timeout=120, Gloo's timeout 10 s) running allreduces "
                 "for 100 s on the "
                 "cluster; 2 s in, worker2's interface is taken down, and brought back "
                 f"only when the driver program has ended (at most {down_for:g} s)",
                 "the job ends in an error naming the host cut off, within its timeout, "
                 "while that host is still cut off (a host that never comes back must end "
                 "the job too; Horovod's driver waited on its connection to the lost task "
                 "with no timeout: seen here hanging for good)")
    mark = os.path.join(str(cluster.shared), f"f2b-{uuid.uuid4().hex}")
    driver, outcome = _program_in_thread(
        request, f"MARK = {mark!r}\n" + _ALLREDUCE_THROUGH_A_CUT, 400)
    _wait_until(lambda: os.path.exists(mark), driver, outcome, 300, "the job did not start")
    time.sleep(2.0)
    cut, up = _cut_off(cluster, "worker2", lambda: driver.join(down_for))
    out = _result(driver, outcome, 300)
    assert out["error"] is not None, "the job ended without an error though a host was cut off"
    first_line = out["error"].splitlines()[0]
    failed_after = out["failed_at"] - cut
    s.figure(f"error on the driver {failed_after:.1f} s after the cut: {first_line[:400]!r}")
    assert out["failed_at"] < up, (f"the job ended only {out['failed_at'] - up:.1f} s after "
                                   f"the host came back ({failed_after:.1f} s after the cut)")
    assert failed_after < 120 + 15, failed_after
    assert "worker2" in first_line, first_line


# ------------------------------------------------------------ S11

_PROBED_JOB = '''
from dist_dl import HorovodRunner
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))

def main(mark, least):
    import os, time
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    if hvd.rank() == 0:
        open(mark, "w").close()
    start, steps, wrong = time.time(), 0, 0
    while True:
        total = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name=f"s{steps}")
        wrong += int(float(total[0]) != hvd.size())
        steps += 1
        # Rank 0 decides for all when to stop: once probed, or after 150 s.
        done = (time.time() - start > least and os.path.exists(mark + ".probed")
                or time.time() - start > 150)
        if int(hvd.broadcast(tf.constant(int(done)), 0, name=f"d{steps}")):
            return {"steps": steps, "wrong": wrong}
        time.sleep(0.02)

RUNNER = HorovodRunner
'''

_PROBED_TF_JOB = '''
from dist_dl import TFDistributeRunner
from dist_dl.core.session import get_spark

spark = ready(get_spark(MASTER))

def main(mark, least):
    import os, time
    import tensorflow as tf
    from dist_dl.launch import multi_worker_strategy
    strategy = multi_worker_strategy()
    rank = strategy.cluster_resolver.task_id
    if rank == 0:
        open(mark, "w").close()

    @tf.function
    def step(stop):
        # Summed over the workers: [number of workers, how many said stop].
        ones = strategy.run(lambda stop: tf.stack([tf.constant(1.0), stop]), args=(stop,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)

    start, steps, wrong = time.time(), 0, 0
    while True:
        # Rank 0 decides for all when to stop: once probed, or after 150 s.
        done = rank == 0 and (time.time() - start > least and os.path.exists(mark + ".probed")
                              or time.time() - start > 150)
        total, stop = step(tf.constant(float(done))).numpy()
        wrong += int(total != strategy.num_replicas_in_sync)
        steps += 1
        if float(stop) > 0:
            return {"steps": steps, "wrong": wrong}
        time.sleep(0.02)

RUNNER = TFDistributeRunner
'''

# Either job's driver program ends so: the job's result, or its error.
_RUN_PROBED = '''
try:
    results = RUNNER(np=2, timeout=240).run(main, mark=MARK, least=10)
    error = None
except Exception as exc:
    results, error = None, f"{type(exc).__name__}: {exc}"[:3000]
print(json.dumps({"error": error, "results": results}))
'''

# Run on the master host, which takes no part in the job: every probe of
# every target in a fresh connection. The pickles would create CANARY if
# anything unpickled them.
_PROBER = '''
import builtins, json, os, pickle, socket, struct, sys
from concurrent.futures import ThreadPoolExecutor

given = json.loads(sys.stdin.read())

class Canary:
    def __reduce__(self):
        return (builtins.open, (given["canary"], "w"))

body = pickle.dumps(Canary(), protocol=2)
filler = b"\\0" * (8 << 20)
PROBES = {
    "garbage": os.urandom(4096),
    "pickle": body,
    # Horovod's wire format: HMAC digest (32 bytes), length, message.
    "framed pickle, wrong digest": os.urandom(32) + struct.pack("i", len(body)) + body,
    "length 2**31-1, 8 MiB sent": os.urandom(32) + struct.pack("i", 2 ** 31 - 1) + filler,
    "length -1, 8 MiB sent": os.urandom(32) + struct.pack("i", -1) + filler,
}

def probe(address, port, payload):
    sock = socket.socket()
    sock.settimeout(5)
    try:
        sock.connect((address, port))
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"unreachable ({type(exc).__name__})"
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while len(got) < 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return f"closed, {len(got)} bytes back"
    except socket.timeout:
        return "held open, no answer in 5 s"
    except OSError as exc:
        return f"reset ({type(exc).__name__})"
    finally:
        sock.close()

def all_probes(target):
    return {name: probe(target["connect"], target["port"], payload)
            for name, payload in PROBES.items()}

def graph(target):
    # What TensorFlow's own client sends a tf.distribute worker's gRPC server:
    # a graph writing a file, run in a session on that server (TensorFlow's
    # SECURITY.md: the server "executes the graphs it is sent without
    # performing any checks").
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    with tf.Graph().as_default() as g:
        write = tf.io.write_file(given["graph_canary"], "written by a graph from another host")
        try:
            with tf.compat.v1.Session(f"grpc://{target['connect']}:{target['port']}", graph=g,
                                      config=tf.compat.v1.ConfigProto(
                                          operation_timeout_in_ms=20000)) as session:
                session.run(write)
            return "graph run"
        except Exception as exc:
            return f"graph refused ({type(exc).__name__})"

with ThreadPoolExecutor(16) as pool:
    outcomes = list(pool.map(all_probes, given["targets"]))
for target, outcome in zip(given["targets"], outcomes):
    if target["what"] == "training worker" and not target["loopback"] and given["graph"]:
        outcome["graph writing a file"] = graph(target)
print(json.dumps(outcomes))
'''


def _listening(cluster, names=("driver", "worker1", "worker2")) -> list[dict]:
    """Every listening TCP socket on those hosts: host, bound address, port,
    the process (pid, what it is), and the address another host would use."""
    import re

    found = []
    for name in names:
        host = cluster.hosts[name]
        listed = host.run(["ss", "-ltnpH"], env=cluster.env(name), timeout=30)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        for line in lines:
            fields = line.split()
            bound, _, port = fields[3].rpartition(":")
            pid = re.search(r"pid=(\d+)", line)
            pid = int(pid.group(1)) if pid else None
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except (OSError, TypeError):
                argv = ["?"]
            bound = bound.strip("[]")
            loopback = bound.startswith("127.") or bound == "::1"
            found.append({"host": name, "bound": bound, "port": int(port), "pid": pid,
                          "what": _what(argv), "loopback": loopback,
                          "connect": host.address})
    return found


def _what(argv: list[str]) -> str:
    """The process behind a listening port, by its command line."""
    command = " ".join(argv[:4])
    if argv[0].endswith("java"):
        return ("Spark executor JVM" if "CoarseGrainedExecutorBackend" in " ".join(argv) else
                "Spark worker JVM" if "deploy.worker.Worker" in " ".join(argv) else
                "Spark driver JVM")
    if "pyspark.daemon" in command or "pyspark.worker" in command:
        return "PySpark worker"
    if "gloo_exec_fn" in command or "_worker_main" in command:
        return "training worker"
    if len(argv) > 1 and argv[1] == "-c":
        # The tests' driver programs run as `python -c <program>`.
        return "driver program"
    return argv[0][-40:]


def _peak_rss(pid) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration, TypeError):
        return 0


_PROBED = {
    # engine: (the job, its runner's services in the scenario's text)
    "horovod": (_PROBED_JOB, "HorovodRunner(np=2) runs allreduces",
                "Horovod's driver and task services, its Gloo rendezvous, Gloo"),
    "tensorflow": (_PROBED_TF_JOB, "TFDistributeRunner(np=2) runs all-reduces of "
                   "MultiWorkerMirroredStrategy",
                   "the workers' TensorFlow gRPC servers, the driver's output service"),
}


@pytest.mark.timeout(600)
@pytest.mark.hosts
@pytest.mark.parametrize("engine", ["horovod", "tensorflow"])
def test_every_port_of_a_run_probed_from_another_host_runs_nothing(request, scenario, engine):
    cluster = request.getfixturevalue("hosts")
    job, what_runs, services = _PROBED[engine]
    graph = engine == "tensorflow"
    s = scenario(
        f"S11{'b' if graph else 'a'} hosts",
        f"every port of a run probed from another host ({engine} engine)",
        f"while {what_runs} on the cluster, every TCP port listening on the driver and "
        f"worker hosts ({services}, Spark, the driver program) gets, from the master host, "
        "in fresh connections: 4 KiB of random bytes, a pickle that would create a canary "
        "file, the same pickle in Horovod's wire format with a wrong digest, and Horovod's "
        "framing with lengths 2**31-1 and -1 followed by 8 MiB"
        + ("; each worker's gRPC server also gets, through TensorFlow's own client, a graph "
           "that writes a second canary file" if graph else ""),
        "no probe's pickle is ever unpickled (canary never written); the job finishes with "
        "every all-reduce right (or fails with an error, never hangs); loopback-only ports "
        "are not reachable from the other host"
        + ("; the graph probe's outcome is what the README's security section says of "
           "TensorFlow's server (it runs the graph: TensorFlow's SECURITY.md, 'not built for "
           "use in an untrusted network'), so that the docs stay true" if graph else ""))
    tag = uuid.uuid4().hex
    mark = os.path.join(str(cluster.shared), f"s11-{tag}")
    canary = os.path.join(str(cluster.shared), f"s11-canary-{tag}")
    graph_canary = os.path.join(str(cluster.shared), f"s11-graph-canary-{tag}")
    driver, outcome = _program_in_thread(request, f"MARK = {mark!r}\n" + job + _RUN_PROBED,
                                         400)
    _wait_until(lambda: os.path.exists(mark), driver, outcome, 300, "the job did not start")
    time.sleep(2.0)
    targets = _listening(cluster)
    before = {t["pid"]: _peak_rss(t["pid"]) for t in targets}
    probed = cluster.hosts["master"].run(
        [sys.executable, "-c", _PROBER], env=cluster.env("master"), timeout=240,
        input=json.dumps({"canary": canary, "graph_canary": graph_canary, "graph": graph,
                          "targets": targets}))
    open(mark + ".probed", "w").close()
    assert probed.returncode == 0, probed.stderr[-4000:]
    outcomes = json.loads(probed.stdout.strip().splitlines()[-1])
    grown = {pid: _peak_rss(pid) - rss for pid, rss in before.items()}
    out = _result(driver, outcome, 300)

    assert not os.path.exists(canary), "a probe's pickle was unpickled: the canary exists"
    for name in cluster.hosts:
        assert not cluster.hosts[name].read(canary), f"the canary exists on {name}"
    rows = []
    for target, result in zip(targets, outcomes):
        if target["loopback"]:
            assert set(result.values()) == {"refused"}, (target, result)
        answered = sorted(set(result.values()))
        rows.append(f"{target['host']} {target['what']} {target['bound']}:{target['port']}: "
                    + "; ".join(answered))
    assert targets and any(not t["loopback"] for t in targets)
    kinds = sorted({f"{t['host']} {t['what']}" for t in targets})
    s.figure(f"{len(targets)} listening ports ({sum(t['loopback'] for t in targets)} on "
             f"loopback only, refused from the master host) in {', '.join(kinds)}")
    s.figure("outcomes: " + " | ".join(rows))
    worst = max(grown.items(), key=lambda kv: kv[1])
    what = next(t for t in targets if t["pid"] == worst[0])
    s.figure(f"largest growth of a process's peak memory during the probes: "
             f"{worst[1] / 2 ** 20:.1f} MiB ({what['host']} {what['what']})")
    assert out["error"] is None, out["error"]
    if graph:
        graphs = [r.get("graph writing a file") for r in outcomes if "graph writing a file" in r]
        assert graphs, f"no tf.distribute worker's port was found: {rows}"
        ran = graphs.count("graph run")
        s.figure(f"graph probe: {ran} of {len(graphs)} workers' gRPC servers ran the graph "
                 f"from the master host (second canary "
                 f"{'written' if os.path.exists(graph_canary) else 'not written'}): "
                 "TensorFlow's server authenticates nothing, as the README says")
        # The README's security section says a host that reaches a worker's
        # port during training can run graphs as that worker: if TensorFlow
        # ever refuses them, this fails so that the docs are brought up to date.
        assert ran == len(graphs) and os.path.exists(graph_canary), graphs
    assert out["results"]["wrong"] == 0 and out["results"]["steps"] > 0, out
    s.figure(f"the job finished: {out['results']['steps']} all-reduces, all right; "
             "no pickle unpickled")
