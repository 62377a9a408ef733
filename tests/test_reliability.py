"""The reliability suite: faults injected into real jobs, on local Spark and on
the cluster of separate hosts (tests/hosts.py), each recorded with what was
measured in docs/RELIABILITY.md (tests/reliability.py).

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
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import hosts as hosts_module

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

WHERE = [pytest.param("local", id="local"),
         pytest.param("hosts", id="hosts", marks=pytest.mark.hosts)]

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
'''

# Horovod's worker processes on Spark tasks and on the driver machine.
_HOROVOD = ["horovod.spark.task.gloo_exec_fn", "dist_dl.launch._worker_main"]


def run_program(request, where: str, code: str, timeout: float = 600,
                env: dict | None = None) -> dict:
    """Run a driver program on local Spark (a process on this machine) or on
    the driver host of the cluster; the JSON object its last line prints."""
    code = textwrap.dedent(code)
    if where == "hosts":
        cluster = request.getfixturevalue("hosts")
        names = {f"net:[{os.stat('/run/netns/' + h.netns).st_ino}]": h.name
                 for h in cluster.hosts.values()}
        return cluster.run_driver(f"HOSTS_BY_NS = {names!r}\nRUN_MARK = ''\n" + _PRELUDE + code,
                                  timeout=timeout, env=env)
    tmp = request.getfixturevalue("tmp_path")
    mark = uuid.uuid4().hex
    script = (f"MASTER = 'local[2]'\nSHARED = {str(tmp)!r}\nHOSTS_BY_NS = {{}}\n"
              f"RUN_MARK = 'DIST_DL_RELIABILITY_RUN={mark}'\n"
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


# ------------------------------------------------------------ F3, F4

_FAULTY_JOB = '''
from dist_dl import HorovodRunner
from dist_dl.session import get_spark

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

start = time.time()
try:
    result = HorovodRunner(np=2, timeout=TIMEOUT).run(main, canary=CANARY, fault=FAULT,
                                                      seconds=SLOW)
    error = None
except Exception as exc:
    result, error = None, f"{type(exc).__name__}: {exc}"
seconds = time.time() - start
gone, left = gone_within([CANARY] + HOROVOD)
print(json.dumps({"result": result, "error": error, "seconds": seconds, "gone": gone,
                  "left": left}))
'''


def _faulty_job(fault: str, timeout: float, slow: float = 0.0) -> str:
    return (f"FAULT = {fault!r}\nTIMEOUT = {timeout!r}\nSLOW = {slow!r}\n"
            f"HOROVOD = {_HOROVOD!r}\n" + _FAULTY_JOB)


def _timely_and_nothing_left(s, out: dict, what: str, limit: float) -> None:
    s.figure(f"{what} after {out['seconds']:.1f} s")
    assert out["seconds"] < limit, out
    assert out["gone"] is not None, f"left behind: {out['left']}"
    s.figure(f"no process left {out['gone']:.1f} s after the error")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", WHERE)
def test_an_exception_in_one_worker_is_named_and_leaves_no_process(request, scenario, where):
    s = scenario(f"F3 {where}", "exception in one worker",
                 "HorovodRunner(np=2, timeout=60): rank 1 raises after an allreduce, rank 0 "
                 "waits in a sleep; every worker has started a child process",
                 "the driver's error names rank 1 and the message within timeout + 30 s; "
                 "10 s later no worker or child of the job is left on any host")
    out = run_program(request, where, _faulty_job("raise", 60.0))
    assert out["error"] is not None and "rank 1" in out["error"], out["error"]
    assert "ValueError: fault injected on rank 1" in out["error"], out["error"]
    _timely_and_nothing_left(s, out, "error on the driver", limit=60 + 30)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", WHERE)
def test_a_stopped_worker_ends_in_a_timeout_and_leaves_no_process(request, scenario, where):
    s = scenario(f"F4 {where}", "stopped worker",
                 "HorovodRunner(np=2, timeout=10): rank 1 stops itself with SIGSTOP before "
                 "an allreduce (past any collective's patience)",
                 "a timeout error on the driver within timeout + grace (15 s) + 30 s; "
                 "10 s later no worker or child of the job is left on any host (the "
                 "stopped one included)")
    out = run_program(request, where, _faulty_job("stop", 10.0))
    assert out["error"] is not None and "timeout" in out["error"].lower(), out["error"]
    _timely_and_nothing_left(s, out, out["error"].split(":")[0], limit=10 + 15 + 30)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", WHERE)
def test_a_slow_worker_under_the_timeout_is_no_alarm(request, scenario, where):
    s = scenario(f"F4b {where}", "slow worker",
                 "HorovodRunner(np=2, timeout=30): rank 1 sleeps 15 s before an allreduce",
                 "no error; the allreduce's result is right; no process left after")
    out = run_program(request, where, _faulty_job("slow", 30.0, slow=15.0))
    assert out["error"] is None, out["error"]
    assert out["result"] == 3.0
    assert out["gone"] is not None, f"left behind: {out['left']}"
    s.figure(f"finished in {out['seconds']:.1f} s, result right")


# ------------------------------------------------------------ F7

_SAVE_FOREVER = '''
import sys
sys.path.insert(0, sys.argv[2])
from dist_dl.train.checkpoint import CheckpointManager
import test_checkpoint as t

manager = CheckpointManager(sys.argv[1], keep=3)
latest = manager.latest()
model = t._model(seed=1)
epoch = latest.epoch if latest else 0
print("ready", flush=True)
while True:
    epoch += 1
    manager.save(model, epoch)
'''


@pytest.mark.timeout(600)
def test_a_checkpoint_writer_killed_twenty_times_never_leaves_a_partial_latest(
        tmp_path, scenario):
    import random
    import warnings

    from dist_dl.train.checkpoint import CheckpointManager, CorruptCheckpointWarning
    from test_checkpoint import _model

    s = scenario("F7 local", "rank 0 killed while writing checkpoints",
                 "a process saving checkpoints in a loop (CheckpointManager, keep=3, the "
                 "code rank 0 runs) gets a real SIGKILL at a random moment, 20 times, "
                 "restarting from its latest checkpoint each time",
                 "after every kill the latest checkpoint loads and restores, no partial "
                 "one is taken (no corrupt-checkpoint warning), epochs never go back")
    directory = tmp_path / "ckpt"
    rng = random.Random(20261124)
    last_epoch, interrupted, kills = 0, 0, 20
    for _ in range(kills):
        writer = subprocess.Popen([sys.executable, "-c", _SAVE_FOREVER, str(directory),
                                   os.path.dirname(__file__)], stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.8))
            writer.send_signal(signal.SIGKILL)
        finally:
            writer.kill()
            writer.wait(30)
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
    assert last_epoch >= 5, "the writer hardly ever finished a save: the test tells nothing"
    s.figure(f"{kills}/{kills} kills left a loadable latest checkpoint "
             f"({interrupted} of them cut a write short; epoch {last_epoch} reached)")


# ------------------------------------------------------------ F6

_INTERRUPTED_TRAINING = '''
import glob, signal, threading
from mlflow.tracking import MlflowClient
from pyspark.sql import functions as F
from dist_dl import train_distributed
from dist_dl.prepare import write_digits_tree
from dist_dl.session import get_spark

spark = ready(get_spark(MASTER))
root = os.path.join(SHARED, "f6-" + FAULT)
train_dir, _ = write_digits_tree(os.path.join(root, "digits"), image_size=16,
                                 validation_fraction=0.0)
frame = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(train_dir)
         .withColumn("digit", F.regexp_extract("path", r"/(\\d)/[^/]+$", 1)))
out_dir, mlruns = os.path.join(root, "out"), os.path.join(root, "mlruns")
state = {}

def interrupt():
    # Once the first epoch's checkpoint is published: training well under way.
    while not glob.glob(os.path.join(out_dir, "checkpoints", "*", "ckpt-*")):
        time.sleep(0.1)
    time.sleep(1.0)   # into the second epoch
    state["at"] = time.time()
    if FAULT == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    else:
        spark.sparkContext.cancelAllJobs()

threading.Thread(target=interrupt, daemon=True).start()
try:
    train_distributed(frame, model="small_cnn", image_size=16, image_col="content",
                      label_col="digit", num_workers=2, backend="spark", epochs=40,
                      batch_size=32, augment=False, eval_crop_fraction=1.0, max_retries=2,
                      output_dir=out_dir, tracking_uri=mlruns)
    error = None
except BaseException as exc:
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
raised = time.time() - state.get("at", time.time())
gone, left = gone_within(HOROVOD, seconds=max(0.0, 10.0 - raised))
client = MlflowClient(mlruns)
runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
print(json.dumps({"error": error, "raised": raised, "gone": gone, "left": left,
                  "status": [r.info.status for r in runs],
                  "attempt_tags": [sorted(k for k in r.data.tags if k.startswith("dist_dl.attempt"))
                                   for r in runs]}))
'''


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault", ["sigint", "cancel"])
def test_ctrl_c_or_a_cancel_on_the_driver_ends_every_worker(request, scenario, fault):
    where = "hosts"
    what = {"sigint": ("Ctrl-C on the driver", "SIGINT to the driver process"),
            "cancel": ("Spark jobs cancelled", "SparkContext.cancelAllJobs() from another "
                       "thread of the driver (a notebook's or a service's cancel)")}[fault]
    s = scenario(f"F6{'a' if fault == 'sigint' else 'b'} {where}", what[0],
                 f"train_distributed(df, num_workers=2, max_retries=2) on the cluster; "
                 f"{what[1]} one second into epoch 2",
                 "every worker process ends within 10 s of it on every host; no temporary "
                 "folder of the library is left; the MLflow run is KILLED, not retried")
    out = run_program(request, where, f"FAULT = {fault!r}\nHOROVOD = {_HOROVOD!r}\n"
                      + _INTERRUPTED_TRAINING, timeout=800)
    expected = "KeyboardInterrupt" if fault == "sigint" else "JobCancelled"
    assert out["error"] is not None and out["error"].startswith(expected), out["error"]
    s.figure(f"{expected} on the driver {out['raised']:.1f} s after it")
    assert out["gone"] is not None, f"left behind: {out['left']}"
    s.figure(f"every worker gone {out['raised'] + out['gone']:.1f} s after it")
    assert out["status"] == ["KILLED"], out["status"]
    assert out["attempt_tags"] == [[]], f"a cancelled run must not be retried: {out}"
    # After the driver program ended: its session's scratch folder too.
    leftovers = []
    cluster = request.getfixturevalue("hosts")
    for name in ("driver", "worker1", "worker2"):
        listing = cluster.hosts[name].run(["sh", "-c", "ls -d /tmp/dist_dl-* 2>/dev/null"],
                                          env=cluster.env(name), timeout=30).stdout.split()
        leftovers += [f"{name}:{p}" for p in listing]
    assert leftovers == [], leftovers
    s.figure("run KILLED, no temporary folder left on any host")
