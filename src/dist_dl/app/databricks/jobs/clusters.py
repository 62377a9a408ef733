"""A job cluster's checks: its runtime (ML, in the range the wheel supports,
with Horovod or TensorFlow where its tasks need them), its node types (GPUs
for training) and the checkpoint key a resuming task needs. Part of
`dist_dl.app.databricks.jobs.validation`, which calls them per cluster."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from dist_dl.core.integrity import KEY_ENV

__all__ = ["check_cluster", "check_checkpoint_key", "SECRET_REFERENCE"]

# A Databricks secret reference's body, as in {{secrets/<scope>/<key>}}.
SECRET_REFERENCE = re.compile(r"^secrets/[\w.@-]+/[\w.@-]+$")

# The ML runtimes the wheel runs on: 13.0, the first with Python 3.10 (the
# oldest the wheel supports), to 19.0 ML, the newest a test profile
# reproduces (dbr-19-ml). Databricks removed Horovod and HorovodRunner after
# 15.4 LTS ML, so on 16.x to 18.x only tasks that need no Horovod run
# (train.engine "tensorflow" or "auto" trains with tf.distribute there); and
# 19.0 ML ships no TensorFlow, so there only tasks that need no TensorFlow run
# (train.engine "torch" or "auto" trains with PyTorch there).
# Spark 4 (runtimes 17.0 and later) is built for Scala 2.13 only.
_MIN_RUNTIME = (13, 0)
_LAST_HOROVOD_RUNTIME = (15, 4)
_FIRST_RUNTIME_WITHOUT_TENSORFLOW = (19, 0)
_MAX_RUNTIME = (19, 0)
_FIRST_SCALA_213_ONLY = (17, 0)
_NEWEST = "19.0.x-{kind}-ml-scala2.13"
_NEWEST_TENSORFLOW = "18.0.x-{kind}-ml-scala2.13"
_RUNTIME = re.compile(r"^(\d+)\.(\d+)\.x-(cpu|gpu)-ml-scala(\d+\.\d+)$")
_GPU_NODE = re.compile(r"^(Standard_N|(g4dn|g5|g6|g6e|p3|p4d|p4de|p5|p5e|p5en)\.|(a2|a3|g2)-)")


def check_cluster(cluster: Any, path: tuple, gpu_tasks: list[str],
                   horovod_tasks: Mapping[str, tuple[str, str]],
                   tensorflow_tasks: Mapping[str, tuple[str, str]], add) -> None:
    """The cluster's runtime and node types, for the tasks that run on it:
    ``gpu_tasks`` train, ``horovod_tasks`` (task -> why, what else would do;
    see `validation._horovod_need()`) need Horovod, ``tensorflow_tasks``
    (`validation._tensorflow_need()`) TensorFlow."""
    if not isinstance(cluster, dict):
        add(path, "must be a cluster specification (an object)")
        return
    version = cluster.get("spark_version")
    match = _RUNTIME.match(version) if isinstance(version, str) else None
    if match is None:
        add(path + ("spark_version",),
            f"{version!r} is not a Databricks ML runtime, which the jobs need: e.g. "
            f"'19.0.x-gpu-ml-scala2.13' (PyTorch), '18.0.x-gpu-ml-scala2.13' (tf.distribute) or "
            f"'15.4.x-gpu-ml-scala2.12' (Horovod), the -cpu- variant without GPUs")
        return
    release, kind, scala = (int(match.group(1)), int(match.group(2))), match.group(3), \
        match.group(4)
    newest, newest_tf = _NEWEST.format(kind=kind), _NEWEST_TENSORFLOW.format(kind=kind)
    if release > _MAX_RUNTIME:
        add(path + ("spark_version",),
            f"{version!r} is not supported yet: no test profile reproduces runtimes after 19.0 "
            f"ML: use '{newest}' with the torch engine (train.engine \"torch\" or \"auto\"), "
            f"'{newest_tf}' with tf.distribute, or '15.4.x-{kind}-ml-scala2.12' with Horovod")
    elif release >= _FIRST_SCALA_213_ONLY and scala != "2.13":
        add(path + ("spark_version",),
            f"{version!r} does not exist: runtimes from 17.0 (Spark 4) are built for Scala 2.13 "
            f"only: use '{release[0]}.{release[1]}.x-{kind}-ml-scala2.13'")
    elif release < _MIN_RUNTIME:
        add(path + ("spark_version",),
            f"{version!r} has Python older than 3.10, which the wheel needs: use "
            f"'15.4.x-{kind}-ml-scala2.12' (Horovod), '{newest_tf}' (tf.distribute) or "
            f"'{newest}' (PyTorch)")
    elif release >= _FIRST_RUNTIME_WITHOUT_TENSORFLOW:
        # Horovod here is Horovod with TensorFlow: said once, as TensorFlow.
        for task, (why, other) in tensorflow_tasks.items():
            add(path + ("spark_version",),
                f"task {task!r} {why}, and {version!r} has no TensorFlow (Databricks ML runtimes "
                f"19.0 and later ship none): use '{newest_tf}'{other}")
    elif release > _LAST_HOROVOD_RUNTIME:
        for task, (why, other) in horovod_tasks.items():
            add(path + ("spark_version",),
                f"task {task!r} {why}, and {version!r} has no Horovod (Databricks ML runtimes "
                f"16.0 and later ship none): use '15.4.x-{kind}-ml-scala2.12'{other}")
    if gpu_tasks and kind != "gpu":
        add(path + ("spark_version",),
            f"tasks {', '.join(gpu_tasks)} run distributed training, which needs a GPU ML "
            f"runtime ('{release[0]}.{release[1]}.x-gpu-ml-scala2.12') on GPU nodes, not "
            f"{version!r}")
    if kind == "gpu":
        for key in ("node_type_id", "driver_node_type_id"):
            node = cluster.get(key)
            if isinstance(node, str) and not _GPU_NODE.match(node):
                add(path + (key,),
                    f"{node!r} is not a GPU instance type, and a GPU runtime needs GPU types for "
                    f"the driver and the workers (e.g. Standard_NC24ads_A100_v4, g5.2xlarge); "
                    f"if it is one, add its family to _GPU_NODE in {Path(__file__).name}")


def check_checkpoint_key(cluster: Any, path: tuple, tasks: list[str], add) -> None:
    """Tasks that resume from a ``train.checkpoint_dir`` need the checkpoint
    signing key from a secret scope: a retried task or a repaired run gets a
    new job cluster, whose driver has a new home and so, without
    ``DIST_DL_CHECKPOINT_KEY``, a new key that refuses the checkpoints
    (`dist_dl.core.integrity.checkpoint_key()`)."""
    if not tasks or not isinstance(cluster, dict):
        return
    env = cluster.get("spark_env_vars")
    value = env.get(KEY_ENV) if isinstance(env, dict) else None
    if not (isinstance(value, str) and SECRET_REFERENCE.match(value.strip().strip("{}"))):
        add(path + ("spark_env_vars", KEY_ENV),
            f"tasks {', '.join(tasks)} resume from train.checkpoint_dir, whose checkpoints are "
            f"signed with the driver's key: set {KEY_ENV} here to a secret reference such as "
            "\"{{secrets/dist_dl/checkpoint-key}}\" (a random value of 16 characters or more), "
            "or a retried task or repaired run, on a new cluster with a new key, refuses them")
