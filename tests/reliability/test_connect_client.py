"""F11: the Spark Connect client killed mid-training.

On Databricks Connect the client is a laptop's process; on serverless
compute, a notebook's. When it dies, Spark's Connect server does not notice
at once: an operation's response stream sends nothing while training runs
(the rows come when the stage ends), so the server finds the client gone
when the stream reaches its longest duration
(``spark.connect.execute.reattachable.senderMaxStreamDuration``, 2 minutes
by default) and no client attaches again; it keeps the operation running
for ``spark.connect.execute.manager.detachedTimeout`` (5 minutes) more, then
removes it and interrupts its jobs. Training must end then, leave no process
behind, and the next run pointed at the same checkpoints resumes. The server
here runs with both at 5 s so that the test takes seconds, not minutes.

Runs where a Connect session can be made (tests/support/connect_server.py):
the CI stages of dbr-17.3-ml and dbr-18-ml (its client processes with the
profile's client overlay, the server without).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import connect_server  # noqa: E402

connect_server.skip_without_a_client()

from waits import workers_left  # noqa: E402

pytestmark = [pytest.mark.profile_subset_164,
              pytest.mark.xdist_group("connect_client")]

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
# The server's longest response stream and its patience with a detached
# operation (each; seconds).
DETACHED_S = 5

_CLIENT = '''
import json, sys
sys.path.insert(0, SUPPORT)
import cloudpickle, train_hooks
cloudpickle.register_pickle_by_value(train_hooks)
from mlflow.tracking import MlflowClient
from pyspark.sql import SparkSession
from dist_dl import train_distributed

spark = SparkSession.builder.remote(REMOTE).getOrCreate()
print("training", flush=True)
result = train_distributed(SHARDS, engine="torch", model=train_hooks.TorchHoldAt(HOLD, 6),
                           epochs=4, num_workers=2, batch_size=4, image_size=16, spark=spark,
                           tracking_uri=MLRUNS, output_dir=OUT, checkpoint_dir=CHECKPOINTS)
run = MlflowClient(MLRUNS).get_run(result.run_id)
print(json.dumps({"status": run.info.status,
                  "initial_epoch": run.data.tags.get("dist_dl.initial_epoch"),
                  "epochs": len(result.history["loss"])}), flush=True)
'''


@pytest.mark.timeout(600)
def test_a_killed_connect_client_ends_its_training_and_the_next_run_resumes(scenario, shards,
                                                                             tmp_path):
    from dist_dl.train.checkpoint import CheckpointManager

    s = scenario("F11 local", "Spark Connect client killed mid-training",
                 "train_distributed(shards, engine='torch', num_workers=2, epochs=4, "
                 "checkpoint_dir=...) from a client process of a Spark Connect server "
                 f"(local[2], its longest response stream and its detached-operation timeout "
                 f"at {DETACHED_S} s each instead of 2 and 5 min); the client gets SIGKILL once the second checkpoint is published, "
                 "while the workers wait at the third epoch's first step (the test's model, "
                 "so the kill lands inside the training whatever the machine's pace); then "
                 "the same program runs again from a new client",
                 "every worker of the killed client's job ends within the server's two "
                 "timeouts + 60 s, with no process left; the new client's run starts from the last "
                 "complete checkpoint's epoch and finishes")
    checkpoints = str(tmp_path / "checkpoints")
    hold = str(tmp_path / f"hold-{uuid.uuid4().hex}")
    conf = {"spark.connect.execute.reattachable.senderMaxStreamDuration": f"{DETACHED_S}s",
            "spark.connect.execute.manager.detachedTimeout": f"{DETACHED_S}s",
            "spark.connect.execute.manager.maintenanceInterval": "1s"}
    with connect_server.serving(conf) as (server, port):
        settings = dict(SUPPORT=SUPPORT, REMOTE=f"sc://127.0.0.1:{port}", SHARDS=shards,
                        HOLD=hold, MLRUNS=(tmp_path / "mlruns").as_uri(),
                        OUT=str(tmp_path / "out"), CHECKPOINTS=checkpoints)
        code = "".join(f"{k} = {v!r}\n" for k, v in settings.items()) + _CLIENT
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        log = tmp_path / "first-client.log"
        with open(log, "w") as out:
            first = subprocess.Popen([sys.executable, "-c", code], stdout=out,
                                     stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 400
            while not (os.path.exists(hold + ".rank0") and os.path.exists(hold + ".rank1")):
                assert first.poll() is None, log.read_text(errors="replace")[-4000:]
                assert time.monotonic() < deadline, "the workers did not reach epoch 3 in 400 s"
                time.sleep(0.2)
            assert workers_left(server.pid, within=0), "no worker of the job was seen running"
            latest = CheckpointManager(checkpoints).latest()
            assert latest is not None and latest.epoch == 2, latest
            first.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        left = workers_left(server.pid, within=2 * DETACHED_S + 60)
        assert left == [], f"workers of the killed client still run {2 * DETACHED_S + 60} s on: {left}"
        gone_after = time.monotonic() - killed
        s.figure(f"every worker of the killed client's job gone {gone_after:.1f} s after the "
                 f"kill (the server's two timeouts: {DETACHED_S} s each)")

        open(hold, "w").close()  # the new client's workers do not wait
        again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env=env, timeout=400)
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        out = json.loads(again.stdout.strip().splitlines()[-1])
        # Epochs 3 and 4 trained by this run.
        assert out == {"status": "FINISHED", "initial_epoch": "2", "epochs": 2}, out
        assert workers_left(server.pid) == []
    s.figure("the new client's run resumed after epoch 2 (the last complete checkpoint when "
             "the old client was killed) and finished epoch 4")
