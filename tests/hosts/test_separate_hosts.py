"""The library on a cluster of separate hosts
(tests/support/host_cluster.py): a Spark master, two workers and the driver,
each with its own address and /tmp, sharing one folder as DBFS would.
Driver programs run on the driver host.

Needs root; under CI=true a missing capability fails the tests instead of
skipping them. One cluster (the `hosts` fixture of conftest.py) serves the
session: the reliability suite runs on it too.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from host_cluster import HostCluster

pytestmark = [pytest.mark.hosts]


def _cli(hosts: HostCluster, *args: str, timeout: float = 900, expect: int = 0) -> str:
    """Run ``dist-dl`` on the driver host; its output (stdout, then stderr),
    once its exit status is ``expect``."""
    code = f"""
import subprocess, sys, json
r = subprocess.run([sys.executable, "-m", "dist_dl.cli", *{list(args)!r}],
                   capture_output=True, text=True)
sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)
print(json.dumps({{"code": r.returncode}}))
"""
    out = hosts.run_driver(code, timeout=timeout)
    assert out["code"] == expect, f"dist-dl {args[0]} exited {out['code']}:\n" \
                                  f"{out['_stdout'][-5000:]}\n{out['_stderr'][-8000:]}\n" \
                                  f"{hosts.executor_logs()}"
    return out["_stdout"] + "\n" + out["_stderr"]


@pytest.mark.timeout(1200)
def test_demo_pipeline_on_separate_hosts(hosts):
    """The main job of `make demo` (`dist-dl pipeline --config demo`, as the
    demo configures it) on the cluster: sample images to shards, training on
    two Spark tasks (Horovod over Gloo between the two worker hosts), MLflow,
    evaluate, register, promote, score, everything through the shared
    folder; then the evaluate step's gate."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    shared = hosts.shared / "demo"
    sets = {"data.output": shared / "shards", "train.output_dir": shared / "runs",
            "tracking.tracking_uri": shared / "mlruns", "score.output": shared / "scored"}
    where = ["--config", "demo", "--master", hosts.master_url]
    for key, value in sets.items():
        where += ["--set", f"{key}={value}"]
    out = _cli(hosts, "pipeline", *where)
    assert "dist_dl pipeline: done" in out and "mlflow ui --backend-store-uri" in out, out
    # The digits went through the shared folder, and the temporary tree is gone.
    assert not list((shared / "shards").glob("_digits-*"))

    client = MlflowClient((shared / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("dist_dl-demo").experiment_id])
    assert run.data.params["train.num_workers"] == "2" and run.data.params["backend"] == "spark"
    assert run.data.metrics["num_workers"] == 2
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == 5 and losses[-1] < losses[0]  # it learns
    # The evaluate step promoted the registered model; score used it.
    version = client.get_model_version_by_alias("digits_small_cnn", "champion")
    assert version.run_id == run.info.run_id
    assert run.data.metrics["val_accuracy"] >= 0.9
    assert client.get_run(run.info.run_id).data.metrics["eval_accuracy"] >= 0.9
    scored = pd.read_parquet(shared / "scored")
    assert len(scored) == 363 and {"prediction", "probability", "label"} <= set(scored.columns)
    assert (scored["prediction"] == scored["label"]).mean() >= 0.9

    # The gate: a model below evaluate.min_accuracy is not promoted, and the
    # step fails (a workflow's score task does not run).
    gate = _cli(hosts, "evaluate", *where, "--set", "evaluate.min_accuracy=1.0",
                "--set", "evaluate.alias=perfect", expect=1)
    assert "below evaluate.min_accuracy=1.0: not promoted" in gate, gate
    assert "perfect" not in client.get_registered_model("digits_small_cnn").aliases


_RUNNER = """
import json
from dist_dl import HorovodRunner
from dist_dl.core.session import get_spark

def main(scale):
    import os, socket
    import horovod.tensorflow as hvd
    import tensorflow as tf
    hvd.init()
    total = hvd.allreduce(tf.constant([float(hvd.rank() + 1) * scale]), op=hvd.Sum)
    me = {"rank": hvd.rank(), "host": socket.gethostname(),
          "iface": os.environ.get("HOROVOD_GLOO_IFACE"),
          "rendezvous": os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
          "sum": float(total.numpy()[0])}
    return hvd.allgather_object(me)

spark = ready(get_spark(MASTER))
%s
everyone = HorovodRunner(np=2).run(main, scale=10.0)
print(json.dumps({"workers": everyone, "driver": spark.sparkContext.getConf().get("spark.driver.host")}))
"""


@pytest.mark.timeout(600)
@pytest.mark.needs("horovod.tensorflow")
def test_horovod_runner_between_worker_hosts(hosts):
    """HorovodRunner(np=2): one worker on each worker host, Gloo over eth0,
    the rendezvous at the driver's own address. PYTHONHASHSEED=0 makes
    Horovod's own interface choice pick loopback, as it does in about half of
    driver processes (see dist_dl.launch.horovod.spark.cluster_nics)."""
    out = hosts.run_driver(_RUNNER % "", env={"PYTHONHASHSEED": "0"})
    workers = sorted(out["workers"], key=lambda w: w["rank"])
    assert {w["host"] for w in workers} == {"worker1", "worker2"}
    assert out["driver"] == hosts.hosts["driver"].address
    for w in workers:
        assert w["iface"] == "eth0"
        assert w["rendezvous"] == hosts.hosts["driver"].address
        assert w["sum"] == 30.0


_TORCH_DISTRIBUTOR = """
import json
from dist_dl import TorchDistributor
from dist_dl.core.session import get_spark

def main(scale):
    import os, socket
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(total)
    me = {"rank": dist.get_rank(), "host": socket.gethostname(),
          "master": os.environ["MASTER_ADDR"], "sum": float(total[0])}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    return everyone

spark = ready(get_spark(MASTER))
everyone = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(main, 10.0)
print(json.dumps({"workers": everyone}))
"""


@pytest.mark.timeout(600)
@pytest.mark.needs("torch")
@pytest.mark.profile_subset_164
@pytest.mark.profile_dbr19
def test_torch_distributor_between_worker_hosts(hosts):
    """TorchDistributor(num_processes=2, local_mode=False): one process on
    each worker host, Gloo between them, MASTER_ADDR rank 0's own host
    address (not loopback, not the driver); rank 0's result comes back."""
    out = hosts.run_driver(_TORCH_DISTRIBUTOR)
    workers = sorted(out["workers"], key=lambda w: w["rank"])
    assert {w["host"] for w in workers} == {"worker1", "worker2"}
    rank0_host = workers[0]["host"]
    assert {w["master"] for w in workers} == {hosts.hosts[rank0_host].address}
    assert all(w["sum"] == 30.0 for w in workers)


# A Connect server on the driver host (the classic driver of the cluster with
# Spark's Connect plugin, bound to the driver's address), and its client in
# another process there: what serverless compute and standard access mode
# are to a notebook. The client trains from its own DataFrame; the ranks
# run on the worker hosts.
_CONNECT_SERVER = """
import json, socket, subprocess, sys
from dist_dl.core.session import get_spark
conf = {"spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": socket.gethostbyname(socket.gethostname()),
        "spark.connect.grpc.binding.port": "15002"}
spark = ready(get_spark(MASTER, conf=conf))
client = subprocess.run([sys.executable, "-c", CLIENT, SHARED], capture_output=True, text=True)
sys.stderr.write(client.stderr[-12000:])
print(client.stdout.strip().splitlines()[-1] if client.returncode == 0
      else json.dumps({"client_exit": client.returncode, "out": client.stdout[-4000:]}))
"""

_CONNECT_CLIENT = """
import json, os, socket, sys
from pyspark.sql import SparkSession, functions as F
from dist_dl import TorchDistributor, train_distributed
from dist_dl.core.sessionkind import is_connect
from dist_dl.prepare import write_digits_tree

def main(scale):
    import os, socket
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(total)
    me = {"rank": dist.get_rank(), "host": socket.gethostname(), "sum": float(total[0])}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    dist.destroy_process_group()
    return everyone

shared = sys.argv[1]
address = socket.gethostbyname(socket.gethostname())
spark = SparkSession.builder.remote(f"sc://{address}:15002").getOrCreate()
workers = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, spark=spark).run(
    main, 10.0)
train_dir, _ = write_digits_tree(os.path.join(shared, "connect-digits"), image_size=16)
images = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(train_dir)
          .withColumn("digit", F.regexp_extract("path", r"/(\\d)/[^/]+$", 1)))
trained = train_distributed(images, image_col="content", label_col="digit", engine="torch",
                            model="small_cnn", image_size=16, num_workers=2, epochs=3,
                            batch_size=32, spark=spark,
                            output_dir=os.path.join(shared, "connect-out"),
                            tracking_uri="file://" + os.path.join(shared, "connect-mlruns"))
scored = trained.transform(images).agg(F.count("*").alias("rows"),
                                       F.avg((F.col("prediction") == F.col("digit").cast("int"))
                                             .cast("double")).alias("accuracy")).first()
print(json.dumps({"connect": is_connect(spark), "workers": workers,
                  "val_accuracy": trained.history["val_accuracy"][-1],
                  "rows": images.count(), "scored": scored["rows"],
                  "accuracy": scored["accuracy"]}))
"""


@pytest.mark.timeout(900)
@pytest.mark.needs("torch")
@pytest.mark.profile_dbr19
def test_a_connect_client_on_the_driver_host_trains_on_the_worker_hosts(hosts):
    """A Spark Connect server on the driver host, its client in another
    process: TorchDistributor runs one rank on each worker host, and
    train_distributed (torch) trains from the client's DataFrame of images
    on two Spark tasks of the cluster, its model scoring there too."""
    import connect_server

    connect_server.skip_without_a_client()
    out = hosts.run_driver(_CONNECT_SERVER.replace(
        "CLIENT, SHARED", f"{_CONNECT_CLIENT!r}, {str(hosts.shared)!r}"))
    assert out.get("connect") is True, out
    workers = sorted(out["workers"], key=lambda w: w["rank"])
    assert {w["host"] for w in workers} == {"worker1", "worker2"}
    assert all(w["sum"] == 30.0 for w in workers)
    # Three epochs of 16-pixel digits (0.74 validation, 0.66 scored,
    # measured): it learns, and the model scored is the one trained.
    assert out["scored"] == out["rows"] and out["accuracy"] >= 0.4, out
    assert out["val_accuracy"] >= 0.4, out


@pytest.mark.timeout(600)
@pytest.mark.needs("horovod.tensorflow")
def test_nics_setting_overrides_the_interface(hosts):
    """spark.dist_dl.nics names the interface; a name no host has fails
    with Horovod's error, on the driver, within the start timeout."""
    code = _RUNNER.replace("spark = ready(get_spark(MASTER))",
                           "spark = ready(get_spark(MASTER, conf={'spark.dist_dl.nics': 'eth0'}))")
    out = hosts.run_driver(code % "")
    assert {w["iface"] for w in out["workers"]} == {"eth0"}


def _program(body: str) -> str:
    """A driver program: the tests' helpers importable (and shipped to the
    workers by value, as a notebook's own module would be), a session on
    the cluster with both executors registered."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    return f"""
import json, os, sys
sys.path.insert(0, {tests!r})
import cloudpickle
import train_hooks
cloudpickle.register_pickle_by_value(train_hooks)
from dist_dl.core.session import get_spark
spark = ready(get_spark(MASTER))
""" + body


@pytest.mark.timeout(900)
# tf.distribute and torch: Horovod between the worker hosts, its MLflow model
# and scoring are the demo pipeline's (test_demo_pipeline_on_separate_hosts);
# the DataFrame's shards are written by the executors the same way for every
# engine. The torch case runs where torch is installed (the dbr-16.4-ml and
# dbr-17.3-ml profiles).
@pytest.mark.parametrize("engine", [
    "tensorflow",
    pytest.param("torch", marks=[pytest.mark.needs("torch"), pytest.mark.profile_subset_164])])
def test_train_distributed_from_a_dataframe_then_batch_scoring(hosts, engine):
    """train_distributed(df) with the Spark backend: the executors write the
    shards, the workers on the two worker hosts read them, rank 0 logs to the
    shared MLflow store; then transform() scores on the executors. The
    workers take their addresses from the barrier stage (torch's
    MASTER_ADDR: rank 0's host) and send their output to the driver host;
    rank 0 picks the checkpoint to resume from in the shared folder."""
    out = hosts.run_driver(_program(f"ENGINE = {engine!r}\n" + """
from pyspark.sql import functions as F
from dist_dl import train_distributed
from dist_dl.prepare import write_digits_tree
root = os.path.join(SHARED, "df-" + ENGINE)
train_dir, val_dir = write_digits_tree(os.path.join(root, "digits"), image_size=16)
def frame(folder):
    return (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder)
            .withColumn("digit", F.regexp_extract("path", r"/(\\d)/[^/]+$", 1)))
trained = train_distributed(frame(train_dir), validation=frame(val_dir), model="small_cnn",
                            image_size=16, image_col="content", label_col="digit",
                            num_workers=2, backend="spark", epochs=3, batch_size=32,
                            learning_rate=0.1, warmup_epochs=1, augment=False,
                            eval_crop_fraction=1.0, output_dir=os.path.join(root, "out"),
                            tracking_uri=os.path.join(root, "mlruns"), engine=ENGINE)
scored = trained.transform(frame(val_dir).select("content", "digit")).toPandas()
accuracy = float((scored["prediction"].astype(str) == scored["digit"]).mean())
print(json.dumps({"val_accuracy": trained.metrics["val_accuracy"], "scored": len(scored),
                  "accuracy": accuracy, "attempts": trained.attempts,
                  "checkpoints": sorted(os.listdir(trained.checkpoint_dir))}))
"""))
    assert out["attempts"] == 1
    assert out["scored"] > 300
    assert out["val_accuracy"] > 0.5 and abs(out["accuracy"] - out["val_accuracy"]) < 0.05
    assert out["checkpoints"], "rank 0 wrote no checkpoint to the shared folder"


@pytest.mark.timeout(900)
@pytest.mark.needs("tensorflow")
def test_delta_source_and_resume_after_a_killed_worker(hosts):
    """Delta shards written by the executors; a worker on another host is
    killed mid-epoch 2 (SIGKILL): the retry resumes from the checkpoint of
    epoch 1 that rank 0 wrote to the shared folder."""
    out = hosts.run_driver(_program("""
from dist_dl import train_distributed
from dist_dl.prepare import prepare_image_dataset, write_digits_tree
root = os.path.join(SHARED, "delta")
train_dir, _ = write_digits_tree(os.path.join(root, "digits"), image_size=16,
                                 validation_fraction=0.0)
summary = prepare_image_dataset(os.path.join(root, "table"), image_dir=train_dir,
                                format="delta", spark=spark)
log = os.path.join(root, "epochs.log")
trained = train_distributed(os.path.join(root, "table"), model="small_cnn", image_size=16,
                            num_workers=2, backend="spark", epochs=3, batch_size=32,
                            max_retries=1, validation_fraction=0.0, augment=False,
                            output_dir=os.path.join(root, "out"),
                            tracking_uri=os.path.join(root, "mlruns"),
                            callbacks=train_hooks.EpochLog(log, kill_rank=1, kill_epoch=1,
                                                           kill_batch=1))
begun = {}
for line in open(log):
    pid, rank, epoch = map(int, line.split())
    if rank == 0:
        begun.setdefault(pid, []).append(epoch)
print(json.dumps({"rows": summary.rows_written, "delta_log": os.path.isdir(
                      os.path.join(root, "table", "_delta_log")),
                  "attempts": trained.attempts, "begun": list(begun.values()),
                  "killed": os.path.exists(log + ".killed"),
                  "epochs_logged": len(trained.history["loss"])}))
"""))
    assert out["delta_log"] and out["rows"] == 1797
    assert out["killed"] and out["attempts"] == 2
    assert out["begun"] == [[0, 1], [1, 2]]  # epoch 1 was not lost
    assert out["epochs_logged"] == 3


@pytest.mark.timeout(600)
def test_driver_local_paths_are_refused_before_any_worker_starts(hosts):
    """The default output_dir ("runs", relative to the driver's working
    directory in its own /tmp) and a driver-local MLflow store name the
    setting and the fix; nothing starts on the workers."""
    out = hosts.run_driver(_program("""
from dist_dl import train_distributed
from dist_dl.ensemble import train_ensemble
from dist_dl.prepare import make_synthetic_images
from dist_dl.core.storage import NotShared
shards = os.path.join(SHARED, "refused", "shards")
make_synthetic_images(shards, rows=16, image_size=16, classes=2, rows_per_row_group=4)
errors = {}
try:
    train_distributed(shards, num_workers=2, backend="spark", epochs=1, image_size=16,
                      tracking_uri=os.path.join(SHARED, "refused", "mlruns"))
except NotShared as exc:
    errors["output_dir"] = str(exc)
try:
    train_distributed(shards, num_workers=2, backend="spark", epochs=1, image_size=16,
                      output_dir=os.path.join(SHARED, "refused", "out"),
                      tracking_uri="/tmp/driver-only/mlruns")
except NotShared as exc:
    errors["store"] = str(exc)
df = spark.createDataFrame([(float(i), i % 2) for i in range(40)], ["x", "y"])
try:
    train_ensemble(df, lambda i: None, num_models=2, feature_cols=["x"], label_col="y")
except NotShared as exc:
    errors["ensemble"] = str(exc)
print(json.dumps({"errors": errors, "runs_left": os.listdir("runs") if os.path.exists("runs") else []}))
"""))
    errors = out["errors"]
    assert set(errors) == {"output_dir", "store", "ensemble"}, errors
    assert "output_dir = 'runs'" in errors["output_dir"] and "/dbfs/" in errors["output_dir"]
    assert "/Volumes/" in errors["output_dir"]
    assert "MLflow tracking store" in errors["store"] and "/tmp/driver-only/mlruns" in errors["store"]
    assert "output_dir = 'runs'" in errors["ensemble"]
    assert "Horovod" not in out["_stderr"] and "rank 0" not in out["_stdout"]


@pytest.mark.timeout(600)
def test_executors_that_cannot_reach_the_driver_end_in_an_error_not_a_hang(hosts):
    """The driver address the library used to force (127.0.0.1) makes every
    executor exit at start: the job fails within spark.dist_dl.stallTimeout,
    quoting Spark's exit messages and the address the executors were given.
    The watch's wait is set short: the standalone master starts a new
    executor each time one exits (about one CPU-second each) until then."""
    stall = 10
    out = hosts.run_driver(f"STALL = {stall!r}\n" + """
import json, os, time
from dist_dl.prepare import prepare_image_dataset, write_digits_tree
from dist_dl.core.session import get_spark
from dist_dl.core.stall import SparkStalled
spark = get_spark(MASTER, conf={"spark.driver.host": "127.0.0.1",
                                "spark.dist_dl.stallTimeout": str(STALL)})
train_dir, _ = write_digits_tree(os.path.join(SHARED, "stall", "digits"), image_size=8,
                                 validation_fraction=0.0)
start = time.time()
try:
    prepare_image_dataset(os.path.join(SHARED, "stall", "shards"), image_dir=train_dir,
                          spark=spark)
    error = None
except SparkStalled as exc:
    error = str(exc)
print(json.dumps({"error": error, "seconds": time.time() - start}))
""", timeout=400)
    assert out["error"] is not None
    assert "127.0.0.1:" in out["error"] and "spark.driver.host" in out["error"]
    assert "exited with code" in out["error"], out["error"]
    assert out["seconds"] < stall + 60


@pytest.mark.timeout(600)
@pytest.mark.needs("horovod.tensorflow")
def test_a_host_name_resolving_to_loopback_is_named_not_an_abort(hosts):
    """Worker hosts whose own name resolves to 127.0.1.1 (Debian's default
    /etc/hosts): Horovod 0.28.1's Gloo would bind its process sets there and
    every worker would abort with exit code 134 and no message (what the
    issue saw). The workers refuse before hvd.init(), naming the fix."""
    with hosts.loopback_hostnames():
        with pytest.raises(AssertionError) as failed:
            hosts.run_driver(_RUNNER % "", timeout=400)
    text = str(failed.value)
    assert "LoopbackHostname" in text and "resolves to 127.0.1.1" in text, text[-3000:]
    assert "exited with code 134" not in text
