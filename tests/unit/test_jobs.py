"""The cases of tests/integration/test_jobs.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import copy
import io
import json
import re
import time
import zipfile
from pathlib import Path

import pytest
from databricks.sdk.service.jobs import JobSettings

from jobs_fixtures import job_file, wheel, workspace  # noqa: F401 (fixtures)
from dist_dl.app.databricks.jobs import (WHEEL_PLACEHOLDER, AuthenticationError, JobFileError,
                                     JobsError, RunFailedError, deploy, load_job, main, run,
                                     validate)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
JOB_FILES = sorted(JOBS.glob("*.json"))
GPU_RUNTIME = "15.4.x-gpu-ml-scala2.12"
CPU_RUNTIME = "15.4.x-cpu-ml-scala2.12"
# Runtimes 16.4 and 17.3 LTS ML ship no Horovod: the tf.distribute jobs (train.engine=tensorflow)
# run there, training_tfdist_* on 16.4 and training_tfdist_17_* on 17.3 (Spark 4: Scala 2.13 only).
TFDIST_GPU_RUNTIME = "16.4.x-gpu-ml-scala2.12"
TFDIST_CPU_RUNTIME = "16.4.x-cpu-ml-scala2.12"
TFDIST_17_GPU_RUNTIME = "17.3.x-gpu-ml-scala2.13"
TFDIST_17_CPU_RUNTIME = "17.3.x-cpu-ml-scala2.13"
# Job file name (without the cloud) -> (runtime of CPU clusters, of GPU clusters).
RUNTIMES = {"training_tfdist": (TFDIST_CPU_RUNTIME, TFDIST_GPU_RUNTIME),
            "training_tfdist_17": (TFDIST_17_CPU_RUNTIME, TFDIST_17_GPU_RUNTIME),
            "training_torch_17": (TFDIST_17_CPU_RUNTIME, TFDIST_17_GPU_RUNTIME)}
# The engine each job of a runtime without Horovod trains with.
ENGINES = {"training_tfdist": "tensorflow", "training_tfdist_17": "tensorflow",
           "training_torch_17": "torch"}


def test_jobs_folder_holds_the_job_definitions():
    assert JOB_FILES, "jobs/ holds no job file"
    names = {p.name for p in JOB_FILES}
    for cloud in ("azure", "aws"):
        assert {f"training_workflow_{cloud}.json", f"training_tfdist_{cloud}.json",
                f"training_tfdist_17_{cloud}.json",
                f"benchmark_gpu_{cloud}.json", f"ensemble_cpu_{cloud}.json"} <= names


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.stem)
def test_job_file_is_valid(path):
    assert [str(p) for p in validate(path)] == []


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.stem)
def test_job_file_round_trips_through_databricks_sdk(path):
    raw = json.loads(path.read_text())
    assert JobSettings.from_dict(raw).as_dict() == raw
    assert load_job(path).as_dict() == raw


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.stem)
def test_job_file_runs_the_wheel_with_parameters_not_literal_paths(path):
    job = json.loads(path.read_text())
    declared = {p["name"] for p in job["parameters"]}
    assert declared and all(isinstance(p["default"], str) for p in job["parameters"])
    for task in job["tasks"]:
        wheel_task = task["python_wheel_task"]
        assert (wheel_task["package_name"], wheel_task["entry_point"]) == ("dist_dl", "dist-dl")
        assert {"whl": WHEEL_PLACEHOLDER} in task["libraries"]
        argv = wheel_task["parameters"]
        for flag, value in zip(argv, argv[1:]):
            if flag == "--set":
                setting = value.split("=", 1)[1]
                assert "/" not in setting or setting.startswith("{{job.parameters."), \
                    f"{path.name}: task {task['task_key']}: {value} hard-codes a path"


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.stem)
def test_clusters_run_the_ml_runtime_of_their_engine(path):
    """15.4 LTS ML, the last with Horovod; 16.4 or 17.3 LTS ML for the
    tf.distribute and torch jobs, whose training tasks choose their engine
    explicitly."""
    job = json.loads(path.read_text())
    stem = path.stem.rsplit("_", 1)[0]
    tfdist = stem in RUNTIMES
    clusters = {c["job_cluster_key"]: c["new_cluster"] for c in job["job_clusters"]}
    for task in job["tasks"]:
        argv = task["python_wheel_task"]["parameters"]
        runtime = clusters[task["job_cluster_key"]]["spark_version"]
        gpu = argv[0] in ("train", "bench", "evaluate", "score")
        expected = RUNTIMES.get(stem, (CPU_RUNTIME, GPU_RUNTIME))[gpu]
        assert runtime == expected, \
            f"{path.name}: task {task['task_key']} runs on {runtime}"
        if tfdist:
            assert argv[0] != "bench", f"{path.name}: bench needs Horovod"
            if argv[0] in ("train", "pipeline"):
                assert f"train.engine={ENGINES[stem]}" in argv, f"{path.name}: {task['task_key']}"


@pytest.mark.parametrize("stem", ["training_workflow", "training_tfdist", "training_tfdist_17",
                                  "training_torch_17"])
def test_training_workflow_chains_prepare_train_evaluate_score(stem):
    for cloud in ("azure", "aws"):
        job = json.loads((JOBS / f"{stem}_{cloud}.json").read_text())
        chain = {t["task_key"]: [d["task_key"] for d in t.get("depends_on", [])]
                 for t in job["tasks"]}
        assert chain == {"prepare": [], "train": ["prepare"], "evaluate": ["train"],
                         "score": ["evaluate"]}
        assert [t["python_wheel_task"]["parameters"][0] for t in job["tasks"]] == \
            ["prepare-data", "train", "evaluate", "score"]


def _cloud_neutral(job: dict) -> dict:
    job = copy.deepcopy(job)
    job["tags"].pop("cloud")
    job["description"] = re.sub(r"azure|aws", "CLOUD", job["description"], flags=re.I)
    for entry in job["job_clusters"]:
        cluster = entry["new_cluster"]
        for key in ("node_type_id", "driver_node_type_id", "azure_attributes", "aws_attributes"):
            cluster.pop(key, None)
        conf = {k: v for k, v in cluster.pop("spark_conf", {}).items()
                if not k.startswith("spark.hadoop.fs.azure.")}
        if conf:
            cluster["spark_conf"] = conf
    return job


def test_azure_and_aws_files_describe_the_same_job():
    stems = {p.stem.rsplit("_", 1)[0] for p in JOB_FILES}
    for stem in stems:
        azure, aws = JOBS / f"{stem}_azure.json", JOBS / f"{stem}_aws.json"
        assert azure.is_file() and aws.is_file(), f"{stem}: one file per cloud"
        assert _cloud_neutral(json.loads(azure.read_text())) == \
            _cloud_neutral(json.loads(aws.read_text())), f"{stem}: the clouds' files differ"


def test_secrets_are_scope_references_in_cluster_environment_only():
    for path in JOB_FILES:
        text = path.read_text()
        for reference in re.findall(r"\{\{secrets/[^}]*\}\}", text):
            assert re.fullmatch(r"\{\{secrets/dist_dl/[a-z-]+\}\}", reference)
    gpu = json.loads((JOBS / "training_workflow_azure.json").read_text())["job_clusters"][1]
    env = gpu["new_cluster"]["spark_env_vars"]
    assert env["DATABRICKS_TOKEN"] == "{{secrets/dist_dl/databricks-token}}"
    assert any(k.startswith("spark.hadoop.fs.azure.sas.fixed.token.")
               and v == "{{secrets/dist_dl/adls-sas-token}}"
               for k, v in gpu["new_cluster"]["spark_conf"].items())


def test_training_clusters_have_a_fixed_size_and_no_photon():
    """docs/limits.md: a barrier stage needs all its workers from the start
    (no autoscaling), and training runs in Python, not Photon."""
    for path in JOB_FILES:
        job = json.loads(path.read_text())
        training = {t.get("job_cluster_key") for t in job["tasks"]
                    if (t.get("python_wheel_task") or {}).get("parameters", [""])[0]
                    in ("train", "bench", "search", "pipeline")}
        for entry in job["job_clusters"]:
            cluster = entry["new_cluster"]
            if entry["job_cluster_key"] in training:
                assert "autoscale" not in cluster and cluster["num_workers"] > 0, path.name
            if "-gpu-" in cluster["spark_version"]:
                assert cluster.get("runtime_engine") == "STANDARD", path.name


def small_job() -> dict:
    wheel_task = {"package_name": "dist_dl", "entry_point": "dist-dl"}
    return {
        "name": "small job",
        "parameters": [{"name": "shards", "default": "/tmp/shards"}],
        "job_clusters": [{"job_cluster_key": "gpu", "new_cluster": {
            "spark_version": GPU_RUNTIME, "node_type_id": "g5.2xlarge", "num_workers": 2,
            "spark_env_vars": {"DATABRICKS_TOKEN": "{{secrets/dist_dl/databricks-token}}"}}}],
        "tasks": [
            {"task_key": "prepare", "job_cluster_key": "gpu",
             "python_wheel_task": dict(wheel_task, parameters=[
                 "prepare-data", "--config", "defaults",
                 "--set", "data.output={{job.parameters.shards}}"]),
             "libraries": [{"whl": WHEEL_PLACEHOLDER}]},
            {"task_key": "train", "depends_on": [{"task_key": "prepare"}], "job_cluster_key": "gpu",
             "python_wheel_task": dict(wheel_task, parameters=[
                 "train", "--config", "defaults", "--set", "data.output={{job.parameters.shards}}",
                 "--set", "train.epochs=2", "--set", "tracking.run_name=train-{{job.run_id}}"]),
             "libraries": [{"whl": WHEEL_PLACEHOLDER}]},
        ],
    }


def _train(job):
    return job["tasks"][1]


def _train_args(job):
    return _train(job)["python_wheel_task"]["parameters"]


def _cluster(job):
    return job["job_clusters"][0]["new_cluster"]


def _as_notebook(path: str):
    def change(job):
        del _train(job)["python_wheel_task"]
        _train(job)["notebook_task"] = {"notebook_path": path}
    return change


def _on_existing_cluster(job):
    del _train(job)["job_cluster_key"]
    _train(job)["existing_cluster_id"] = "0101-abc"


def test_the_small_job_is_valid():
    assert validate(small_job(), source="bad.json") == []


# (id, change to small_job, task named, field containing, message containing)
MISTAKES = [
    ("misspelt-field", lambda j: _train(j).__setitem__("job_cluser_key", "gpu"),
     "train", "job_cluser_key", "is lost when databricks-sdk reads the job"),
    ("invalid-enum", lambda j: _cluster(j).__setitem__("data_security_mode", "SINGLEUSER"),
     None, "job_clusters[gpu].new_cluster.data_security_mode", "is lost"),
    ("undeclared-parameter",
     lambda j: _train_args(j).extend(["--set", "train.batch_size={{job.parameters.batch}}"]),
     "train", "python_wheel_task.parameters[", "names no declared job parameter"),
    ("unused-parameter", lambda j: j["parameters"].append({"name": "spare", "default": "x"}),
     None, "parameters[spare]", "no task uses it"),
    ("parameter-without-default", lambda j: j["parameters"][0].pop("default"),
     None, "parameters[shards].default", "needs a default"),
    ("unknown-dependency", lambda j: _train(j).__setitem__("depends_on", [{"task_key": "prep"}]),
     "train", "depends_on[0]", "'prep', which is not a task of this job"),
    ("dependency-cycle", lambda j: j["tasks"][0].__setitem__("depends_on", [{"task_key": "train"}]),
     "train", "depends_on", "cycle: prepare -> train -> prepare"),
    ("other-package", lambda j: _train(j)["python_wheel_task"].__setitem__("package_name", "dl"),
     "train", "python_wheel_task.package_name", "this project's wheel is 'dist_dl'"),
    ("other-entry-point",
     lambda j: _train(j)["python_wheel_task"].__setitem__("entry_point", "main"),
     "train", "python_wheel_task.entry_point", "console script 'dist-dl'"),
    ("named-parameters",
     lambda j: _train(j)["python_wheel_task"].__setitem__("named_parameters", {"a": "b"}),
     "train", "python_wheel_task.named_parameters", "positional"),
    ("unknown-command", lambda j: _train_args(j).__setitem__(0, "fit"),
     "train", "python_wheel_task.parameters", "does not parse"),
    ("not-a-step", lambda j: _train(j)["python_wheel_task"].__setitem__("parameters", ["configs"]),
     "train", "python_wheel_task.parameters", "runs `dist-dl configs`"),
    ("unknown-config-key", lambda j: _train_args(j).extend(["--set", "train.epoch=3"]),
     "train", "python_wheel_task.parameters", "unknown key 'train.epoch'"),
    ("bad-config-value", lambda j: _train_args(j).extend(["--set", "train.epochs=many"]),
     "train", "python_wheel_task.parameters", "'train.epochs'"),
    ("unknown-config-name", lambda j: _train_args(j).__setitem__(2, "imagenet"),
     "train", "python_wheel_task.parameters", "no configuration 'imagenet'"),
    ("no-wheel-library", lambda j: _train(j).__setitem__("libraries", [{"pypi": {"package": "x"}}]),
     "train", "libraries", WHEEL_PLACEHOLDER),
    ("notebook-outside-notebooks", _as_notebook("/Users/me/train"),
     "train", "notebook_task.notebook_path", "under notebooks/"),
    ("missing-notebook", _as_notebook("notebooks/no_such_notebook"),
     "train", "notebook_task.notebook_path", "not a notebook of this project"),
    ("two-task-types", lambda j: _train(j).__setitem__("spark_python_task",
                                                       {"python_file": "train.py"}),
     "train", "(task)", "one of them"),
    ("existing-cluster", _on_existing_cluster, "train", "existing_cluster_id", "job cluster"),
    ("undefined-job-cluster", lambda j: _train(j).__setitem__("job_cluster_key", "gpus"),
     "train", "job_cluster_key", "not in job_clusters"),
    ("no-name", lambda j: j.pop("name"), None, "name", "needs a name"),
    ("duplicate-task", lambda j: _train(j).__setitem__("task_key", "prepare"),
     None, "tasks", "more than once"),
    ("token-literal", lambda j: _cluster(j)["spark_env_vars"].__setitem__(
        "DATABRICKS_TOKEN", "dapi" + "0123456789abcdef" * 2),
     None, "spark_env_vars.DATABRICKS_TOKEN", "a Databricks personal access token"),
    ("sas-literal", lambda j: _cluster(j).__setitem__("spark_conf", {
        "spark.hadoop.fs.azure.sas.fixed.token.acct.dfs.core.windows.net":
            "sv=2022-11-02&ss=b&srt=co&sig=AbCdEf0123456789%3D"}),
     None, "spark_conf.spark.hadoop.fs.azure.sas.fixed.token", "a SAS signature"),
    ("aws-key-id", lambda j: j["parameters"][0].__setitem__("default", "AKIAABCDEFGHIJKLMNOP"),
     None, "parameters[shards].default", "an AWS access key id"),
    ("base64-secret", lambda j: _train_args(j).extend(
        ["--set", "tracking.tracking_uri=q8Zr3WmX0bT5yLk2VfN7sHd9Jc4Ga1PeUo6Ri0Mn"]),
     "train", "python_wheel_task.parameters[", "a long random (base64) string"),
    ("credential-literal", lambda j: _cluster(j)["spark_env_vars"].__setitem__(
        "AWS_SECRET_ACCESS_KEY", "short"),
     None, "spark_env_vars.AWS_SECRET_ACCESS_KEY", "must be a {{secrets/<scope>/<key>}} reference"),
    ("secret-in-task-parameter", lambda j: _train_args(j).extend(
        ["--set", "tracking.tracking_uri={{secrets/dist_dl/uri}}"]),
     "train", "python_wheel_task.parameters[", "only in spark_conf and spark_env_vars"),
    ("malformed-secret", lambda j: _cluster(j)["spark_env_vars"].__setitem__(
        "DATABRICKS_TOKEN", "{{secrets/dist_dl}}"),
     None, "spark_env_vars.DATABRICKS_TOKEN", "is not a secret reference"),
    ("parameter-in-cluster", lambda j: _cluster(j)["spark_env_vars"].__setitem__(
        "SHARDS", "{{job.parameters.shards}}"),
     None, "spark_env_vars.SHARDS", "task parameters"),
    ("unknown-reference", lambda j: _train_args(j).extend(["--set", "data.output={{shards}}"]),
     "train", "python_wheel_task.parameters[", "unknown reference {{shards}}"),
    ("horovod-engine-on-runtime-without-horovod", lambda j: (
        _cluster(j).__setitem__("spark_version", TFDIST_GPU_RUNTIME),
        _train_args(j).extend(["--set", "train.engine=horovod"])),
     None, "new_cluster.spark_version", "task 'train' runs `dist-dl train` with train.engine"),
    ("bench-on-runtime-without-horovod", lambda j: (
        _cluster(j).__setitem__("spark_version", TFDIST_GPU_RUNTIME),
        _train_args(j).__setitem__(0, "bench")),
     None, "new_cluster.spark_version", "task 'train' runs `dist-dl bench`"),
    ("runtime-not-supported-yet", lambda j: _cluster(j).__setitem__(
        "spark_version", "20.0.x-gpu-ml-scala2.13"),
     None, "new_cluster.spark_version", "is not supported yet"),
    ("spark-4-runtime-with-scala-2.12", lambda j: _cluster(j).__setitem__(
        "spark_version", "17.3.x-gpu-ml-scala2.12"),
     None, "new_cluster.spark_version", "built for Scala 2.13 only"),
    ("runtime-too-old",
     lambda j: _cluster(j).__setitem__("spark_version", "12.2.x-gpu-ml-scala2.12"),
     None, "new_cluster.spark_version", "older than 3.10"),
    ("not-ml-runtime", lambda j: _cluster(j).__setitem__("spark_version", "15.4.x-scala2.12"),
     None, "new_cluster.spark_version", "not a Databricks ML runtime"),
    ("cpu-runtime-for-training", lambda j: _cluster(j).__setitem__("spark_version", CPU_RUNTIME),
     None, "new_cluster.spark_version", "tasks train run distributed training"),
    ("cpu-driver-on-gpu-runtime", lambda j: _cluster(j).__setitem__(
        "driver_node_type_id", "m5d.2xlarge"),
     None, "new_cluster.driver_node_type_id", "not a GPU instance type"),
    ("checkpoint-dir-without-key", lambda j: _train_args(j).extend(
        ["--set", "train.checkpoint_dir=/Volumes/main/runs/ckpt/{{job.run_id}}"]),
     None, "spark_env_vars.DIST_DL_CHECKPOINT_KEY", "repaired run, on a new cluster with a new key"),
    ("checkpoint-key-literal", lambda j: (
        _train_args(j).extend(["--set", "train.checkpoint_dir=/Volumes/main/runs/ckpt"]),
        _cluster(j)["spark_env_vars"].__setitem__("DIST_DL_CHECKPOINT_KEY", "a-literal-key-1234")),
     None, "spark_env_vars.DIST_DL_CHECKPOINT_KEY", "a secret reference such as"),
    ("unused-job-cluster", lambda j: j["job_clusters"].append(
        {"job_cluster_key": "spare", "new_cluster": copy.deepcopy(_cluster(j))}),
     None, "job_clusters[spare]", "no task uses it"),
]


@pytest.mark.parametrize("change, task, field, message", [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_validation_catches(change, task, field, message):
    job = small_job()
    change(job)
    problems = validate(job, source="bad.json")
    matching = [p for p in problems if p.task == task and field in p.field and message in p.message]
    assert matching, "\n".join(map(str, problems)) or "no problem found"
    assert all(p.file == "bad.json" for p in problems)
    text = str(matching[0])
    assert text.startswith("bad.json: ") and (task is None or f"task {task!r}" in text)


def test_a_task_resuming_from_a_checkpoint_dir_takes_the_key_from_a_secret_scope():
    job = small_job()
    _train_args(job).extend(["--set", "train.checkpoint_dir=/Volumes/main/runs/{{job.run_id}}"])
    _cluster(job)["spark_env_vars"]["DIST_DL_CHECKPOINT_KEY"] = "{{secrets/dist_dl/checkpoint-key}}"
    assert validate(job) == []
    # Every shipped job that trains into a checkpoint_dir resumes on a new cluster.
    resuming = [p for p in JOB_FILES if "train.checkpoint_dir=" in p.read_text()]
    assert len(resuming) >= 8, [p.name for p in resuming]
    for path in resuming:
        clusters = json.loads(path.read_text())["job_clusters"]
        assert any(c["new_cluster"].get("spark_env_vars", {}).get("DIST_DL_CHECKPOINT_KEY")
                   == "{{secrets/dist_dl/checkpoint-key}}" for c in clusters), path.name


def _on_runtime(job: dict, runtime: str, *train_args: str) -> dict:
    _cluster(job)["spark_version"] = runtime
    _train_args(job).extend(train_args)
    return job


@pytest.mark.parametrize("engine", ["auto", "tensorflow"])
@pytest.mark.parametrize("runtime", [TFDIST_GPU_RUNTIME, TFDIST_17_GPU_RUNTIME])
def test_runtimes_16_and_17_run_training_without_horovod(runtime, engine):
    release = runtime.split(".x-")[0]
    for version in (runtime, runtime.replace(release, release.split(".")[0] + ".0"), GPU_RUNTIME):
        job = _on_runtime(small_job(), version, "--set", f"train.engine={engine}")
        assert validate(job) == [], version
    job = _on_runtime(small_job(), runtime, "--set", f"train.engine={engine}")
    _train_args(job)[0] = "pipeline"
    assert validate(job) == []


def _spark_version_problems(job: dict) -> list[str]:
    return [p.message for p in validate(job) if p.field.endswith("spark_version")]


def test_runtime_19_runs_the_torch_engine_and_refuses_what_needs_tensorflow():
    """Databricks Runtime 19.0 ML ships no TensorFlow (profile dbr-19-ml):
    engine "torch" or "auto" trains there; the TensorFlow engines, the
    benchmark and the search job are refused naming why and the fix. 18.0
    LTS ML still runs tf.distribute."""
    runtime = "19.0.x-gpu-ml-scala2.13"
    for engine in ("torch", "auto"):
        for step in ("train", "pipeline"):
            job = _on_runtime(small_job(), runtime, "--set", f"train.engine={engine}")
            _train_args(job)[0] = step
            assert validate(job) == [], (engine, step)
    for stem in ("training_torch_17_aws", "training_torch_17_azure"):
        job = json.loads((JOBS / f"{stem}.json").read_text())
        for cluster in job["job_clusters"]:
            cluster["new_cluster"]["spark_version"] = cluster["new_cluster"][
                "spark_version"].replace("17.3.x", "19.0.x")
        assert validate(job) == [], stem
    assert validate(_on_runtime(small_job(), "18.0.x-gpu-ml-scala2.13", "--set",
                                "train.engine=tensorflow")) == []
    torch_fix = ('use \'18.0.x-gpu-ml-scala2.13\', or set train.engine to "torch" or "auto" '
                 '(`--set train.engine=torch`) to train with PyTorch')
    for engine in ("tensorflow", "horovod"):  # Horovod's is said once, as TensorFlow
        job = _on_runtime(small_job(), runtime, "--set", f"train.engine={engine}")
        assert _spark_version_problems(job) == [
            f'task \'train\' runs `dist-dl train` with train.engine "{engine}", and '
            f'\'{runtime}\' has no TensorFlow (Databricks ML runtimes 19.0 and later ship none): '
            + torch_fix]
    for step, config, why in (("bench", "synthetic_benchmark", "whose setups train Keras models"),
                              ("search", "demo", "whose trials train Keras models")):
        job = _on_runtime(small_job(), runtime)
        _train(job)["python_wheel_task"]["parameters"] = [step, "--config", config]
        assert _spark_version_problems(job) == [
            f"task 'train' runs `dist-dl {step}`, {why}, and '{runtime}' has no TensorFlow "
            "(Databricks ML runtimes 19.0 and later ship none): use '18.0.x-gpu-ml-scala2.13'"]


@pytest.mark.parametrize("runtime", [TFDIST_GPU_RUNTIME, TFDIST_17_GPU_RUNTIME])
def test_tasks_that_need_horovod_are_refused_on_16_and_17_naming_why_and_the_fix(runtime):
    tf_fix = ('use \'15.4.x-gpu-ml-scala2.12\', or set train.engine to "tensorflow" or "auto" '
              '(`--set train.engine=tensorflow`) to train with tf.distribute')
    horovod = _on_runtime(small_job(), runtime, "--set", "train.engine=horovod")
    assert _spark_version_problems(horovod) == [
        'task \'train\' runs `dist-dl train` with train.engine "horovod", and '
        f'\'{runtime}\' has no Horovod (Databricks ML runtimes 16.0 and later ship '
        'none): ' + tf_fix]
    bench = _on_runtime(small_job(), "16.2.x-gpu-ml-scala2.12")
    _train(bench)["python_wheel_task"]["parameters"] = ["bench", "--config",
                                                        "synthetic_benchmark"]
    assert _spark_version_problems(bench) == [
        "task 'train' runs `dist-dl bench`, whose baseline setups start HorovodRunner, and "
        "'16.2.x-gpu-ml-scala2.12' has no Horovod (Databricks ML runtimes 16.0 and later ship "
        "none): use '15.4.x-gpu-ml-scala2.12'"]
    # the same tasks on 15.4, which ships Horovod
    assert validate(_on_runtime(small_job(), GPU_RUNTIME, "--set", "train.engine=horovod")) == []
    assert _spark_version_problems(_on_runtime(bench, GPU_RUNTIME)) == []


def test_the_engine_is_the_one_a_run_would_load():
    """A job parameter's value as a run passes it, and an engine that cannot
    be known (an undeclared parameter) counts as possibly Horovod."""
    job = _on_runtime(small_job(), TFDIST_GPU_RUNTIME,
                      "--set", "train.engine={{job.parameters.engine}}")
    assert any("cannot be known from the job" in m and "may need Horovod" in m
               for m in _spark_version_problems(job))
    job["parameters"].append({"name": "engine", "default": "tensorflow"})
    assert validate(job) == []
    assert any('with train.engine "horovod"' in p.message
               for p in validate(job, parameter_values={"engine": "horovod"}))
    # a configuration that does not load still tells its engine where it can
    _train_args(job)[-1] = "train.engine=tensorflow"
    _train_args(job).extend(["--set", "train.epoch=3"])
    assert _spark_version_problems(job) == []


def test_runtimes_after_19_0_are_refused_naming_why_and_the_fix():
    job = _on_runtime(small_job(), "20.0.x-cpu-ml-scala2.13")
    _train_args(job)[0] = "evaluate"  # no training step: the runtime alone is refused
    assert _spark_version_problems(job) == [
        "'20.0.x-cpu-ml-scala2.13' is not supported yet: no test profile reproduces runtimes "
        "after 19.0 ML: use '19.0.x-cpu-ml-scala2.13' with the torch engine (train.engine "
        "\"torch\" or \"auto\"), '18.0.x-cpu-ml-scala2.13' with tf.distribute, or "
        "'15.4.x-cpu-ml-scala2.12' with Horovod"]
    scala = _on_runtime(small_job(), "17.3.x-cpu-ml-scala2.12")
    _train_args(scala)[0] = "evaluate"
    assert _spark_version_problems(scala) == [
        "'17.3.x-cpu-ml-scala2.12' does not exist: runtimes from 17.0 (Spark 4) are built for "
        "Scala 2.13 only: use '17.3.x-cpu-ml-scala2.13'"]


def test_a_notebook_task_under_notebooks_is_accepted():
    job = small_job()
    del _train(job)["python_wheel_task"]
    _train(job)["notebook_task"] = {"notebook_path": "notebooks/03_horovod_runner",
                                    "source": "GIT"}
    assert validate(job) == []


def test_parameter_values_of_a_run_are_validated_too():
    job = small_job()
    job["parameters"].append({"name": "epochs", "default": "2"})
    _train_args(job).extend(["--set", "train.epochs={{job.parameters.epochs}}"])
    assert validate(job, parameter_values={"epochs": "5"}) == []
    assert any("'train.epochs'" in p.message
               for p in validate(job, parameter_values={"epochs": "five"}))
    assert any(p.field == "parameters" and "'epoch'" in p.message
               for p in validate(job, parameter_values={"epoch": "5"}))


def test_validate_command_lists_problems_and_fails(tmp_path, capsys):
    job = small_job()
    _train_args(job).extend(["--set", "train.epoch=3"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(job))
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x",')
    good = tmp_path / "good.json"
    good.write_text(json.dumps(small_job()))
    assert main(["jobs", "validate", str(good), str(bad), str(broken)]) == 1
    out = capsys.readouterr().out
    assert f"{good}: ok" in out
    assert f"{bad}: task 'train': python_wheel_task.parameters: the configuration does not load: " \
           f"unknown key 'train.epoch'" in out
    assert f"{broken}: line 1: not valid JSON" in out


def test_validate_command_defaults_to_jobs_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # a project's folder: its jobs/
    assert main(["jobs", "validate"]) == 0
    out = capsys.readouterr().out
    assert all(f"{p.name}: ok" in out for p in JOB_FILES)
    # Elsewhere no jobs/ (the installed wheel does not reach into a checkout),
    # and an empty jobs/, are errors, not a pass.
    monkeypatch.chdir(tmp_path)
    assert main(["jobs", "validate"]) == 1
    assert "no job files" in capsys.readouterr().err
    (tmp_path / "jobs").mkdir()
    assert main(["jobs", "validate"]) == 1
    assert "no job files" in capsys.readouterr().err


def test_deploy_creates_the_job_then_updates_it(workspace, job_file, wheel):
    printed = io.StringIO()
    job_id = deploy(job_file, wheel, out=printed)

    digest = __import__("hashlib").sha256(wheel.read_bytes()).hexdigest()[:12]
    uploaded = f"/Users/{workspace.user_name}/dist_dl/wheels/{digest}/{wheel.name}"
    assert workspace.files == {uploaded: wheel.read_bytes()}
    expected = json.loads(job_file.read_text())
    for task in expected["tasks"]:
        task["libraries"] = [{"whl": "/Workspace" + uploaded}]
    assert workspace.jobs == {job_id: expected}  # every field arrived, the wheel's path in place
    assert [len(workspace.calls(p)) for p in ("jobs/create", "jobs/reset")] == [1, 0]
    assert f"created job {job_id}" in printed.getvalue()

    changed = json.loads(job_file.read_text())
    changed["parameters"][-3]["default"] = "1"  # epochs
    job_file.write_text(json.dumps(changed))
    assert deploy(job_file, wheel, out=printed) == job_id
    assert [len(workspace.calls(p)) for p in ("jobs/create", "jobs/reset")] == [1, 1]
    assert workspace.calls("jobs/reset")[0].body["job_id"] == job_id
    assert len(workspace.jobs) == 1
    epochs = {p["name"]: p["default"] for p in workspace.jobs[job_id]["parameters"]}["epochs"]
    assert epochs == "1"
    assert f"updated job {job_id}" in printed.getvalue()


def test_deploy_refuses_values_left_to_edit_before_any_request(workspace, wheel):
    with pytest.raises(JobFileError) as caught:
        deploy(JOBS / "training_workflow_azure.json", wheel)
    message = str(caught.value)
    assert "values to edit" in message and "<EDIT:storage-account>" in message
    assert "job_clusters[gpu].new_cluster.spark_conf" in message
    assert workspace.requests == []


def test_deploy_refuses_a_file_that_is_not_the_wheel(workspace, job_file, tmp_path):
    text = tmp_path / "dist_dl-0.1.0-py3-none-any.whl"
    text.write_text("not a zip")
    with pytest.raises(JobsError, match="is not a wheel"):
        deploy(job_file, text)
    other = tmp_path / "other" / "dist_dl-0.1.0-py3-none-any.whl"
    other.parent.mkdir()
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("dist_dl-0.1.0.dist-info/entry_points.txt", "[console_scripts]\n")
    with pytest.raises(JobsError, match="declares no 'dist-dl' console script"):
        deploy(job_file, other)
    assert workspace.files == {} and workspace.jobs == {}


def test_deploy_command_needs_the_wheel(workspace, job_file, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["jobs", "deploy", str(job_file)])
    assert exit_info.value.code == 2 and "--wheel" in capsys.readouterr().err
    with pytest.raises(JobsError, match=r"no wheel to deploy: build it .*make wheel"):
        deploy(job_file, None)
    assert workspace.requests == []


def test_deploy_refuses_an_invalid_job_file(workspace, tmp_path, wheel):
    job = small_job()
    _train(job)["depends_on"] = [{"task_key": "missing"}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(job))
    with pytest.raises(JobFileError, match="depends on 'missing'"):
        deploy(bad, wheel)
    assert workspace.requests == []


def test_run_follows_the_run_to_success(workspace, job_file, wheel):
    job_id = deploy(job_file, wheel, out=io.StringIO())
    printed = io.StringIO()
    result = run(job_file, params={"epochs": "1"}, poll_seconds=0.01, out=printed)

    assert (result.job_id, result.life_cycle_state, result.result_state) == \
        (job_id, "TERMINATED", "SUCCESS")
    assert workspace.calls("jobs/run-now")[0].body == {"job_id": job_id,
                                                       "job_parameters": {"epochs": "1"}}
    lines = printed.getvalue().splitlines()
    run_lines = [line for line in lines if re.match(rf"\[ *\d+\.\ds\] run {result.run_id}: ", line)]
    assert [line.split(": ")[1] for line in run_lines] == \
        ["PENDING", "RUNNING", "TERMINATED SUCCESS"]
    for task in ("prepare", "train", "evaluate", "score"):
        assert any(line.endswith(f"task {task}: RUNNING") for line in lines)
        assert any(line.endswith(f"task {task}: TERMINATED SUCCESS") for line in lines)


def test_a_failed_run_names_the_failed_task_and_the_run_page(workspace, job_file, wheel):
    job_id = deploy(job_file, wheel, out=io.StringIO())
    workspace.fail_task = "train"
    with pytest.raises(RunFailedError) as caught:
        run(job_id=job_id, poll_seconds=0.01, out=io.StringIO())
    failure = caught.value
    assert failure.failed_tasks == ["train"]
    assert failure.url == f"{workspace.host}/#job/{job_id}/run/{failure.run_id}"
    message = str(failure)
    assert "ended FAILED" in message and "task 'train' FAILED" in message
    assert "ValueError: train failed in the stand-in" in message  # the task's own error
    assert "evaluate UPSTREAM_FAILED" in message and failure.url in message


def test_run_reads_the_newer_status_field_when_state_is_absent(workspace, job_file, wheel):
    import dataclasses

    from databricks.sdk.service.jobs import Run

    job_id = deploy(job_file, wheel, out=io.StringIO())
    workspace.legacy_state = False
    if "status" not in {f.name for f in dataclasses.fields(Run)}:
        # databricks-sdk 0.20 (runtime 15.4) cannot read 'status': a clear
        # error instead of polling for ever.
        with pytest.raises(JobsError, match=r"cannot read its replacement 'status'.*"
                                            r"Upgrade databricks-sdk"):
            run(job_id=job_id, poll_seconds=0.01, out=io.StringIO())
        return
    assert run(job_id=job_id, poll_seconds=0.01, out=io.StringIO()).result_state == "SUCCESS"
    workspace.fail_task = "evaluate"
    with pytest.raises(RunFailedError) as caught:
        run(job_id=job_id, poll_seconds=0.01, out=io.StringIO())
    assert caught.value.failed_tasks == ["evaluate"]


def test_run_stops_following_after_its_timeout(workspace, job_file, wheel):
    job_id = deploy(job_file, wheel, out=io.StringIO())
    with pytest.raises(JobsError, match=r"still PENDING after 0 s; it keeps running: http"):
        run(job_id=job_id, timeout=0, poll_seconds=0.01, out=io.StringIO())
    assert len(workspace.calls("jobs/runs/get")) == 1


def test_run_command_by_job_id_without_waiting(workspace, job_file, wheel, capsys):
    job_id = deploy(job_file, wheel, out=io.StringIO())
    assert main(["jobs", "run", "--job-id", str(job_id), "--no-wait"]) == 0
    assert "started run" in capsys.readouterr().out
    assert workspace.calls("jobs/run-now")[0].body == {"job_id": job_id}
    assert len(workspace.calls("jobs/runs/get")) == 1


def test_run_command_reports_a_failed_run(workspace, job_file, wheel, capsys, monkeypatch):
    deploy(job_file, wheel, out=io.StringIO())
    workspace.fail_task = "score"
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    assert main(["jobs", "run", str(job_file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dist-dl jobs run: error: run ") and "task 'score' FAILED" in err


def test_run_checks_parameters_before_starting(workspace, job_file, wheel):
    job_id = deploy(job_file, wheel, out=io.StringIO())
    with pytest.raises(JobFileError, match="no job parameter 'epoch' to set; declared: config, "):
        run(job_file, params={"epoch": "1"})
    with pytest.raises(JobFileError, match="'train.epochs'"):
        run(job_file, params={"epochs": "many"})
    with pytest.raises(JobFileError, match="no job parameter 'epoch'"):
        run(job_id=job_id, params={"epoch": "1"})  # checked against the deployed job
    assert workspace.calls("jobs/run-now") == []


def test_run_of_a_job_that_is_not_deployed(workspace, job_file):
    with pytest.raises(JobsError,
                       match="no job named 'dist_dl imagenet training'.*deploy it first"):
        run(job_file)


def test_a_wrong_token_gives_one_clear_error(workspace, job_file, wheel, monkeypatch, capsys):
    monkeypatch.setenv("DATABRICKS_TOKEN", "not-the-token")
    with pytest.raises(AuthenticationError) as caught:
        deploy(job_file, wheel)
    message = str(caught.value)
    assert "HTTP 401" in message and "DATABRICKS_TOKEN" in message and "--profile" in message
    assert main(["jobs", "run", "--job-id", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dist-dl jobs run: error: ") and "HTTP 401" in err
    assert "Traceback" not in err and workspace.jobs == {}


def test_a_token_without_permission_gives_one_clear_error(workspace, job_file, wheel, monkeypatch):
    monkeypatch.setenv("DATABRICKS_TOKEN", workspace.forbidden_token)
    with pytest.raises(AuthenticationError, match=r"HTTP 403.*allowed to read the current user"):
        deploy(job_file, wheel)


def test_no_credentials_gives_one_clear_error(job_file, wheel, capsys):
    with pytest.raises(AuthenticationError) as caught:
        deploy(job_file, wheel)
    message = str(caught.value)
    assert message.startswith("no usable Databricks credentials: set DATABRICKS_HOST")
    assert "DATABRICKS_TOKEN" in message and "--profile" in message
    assert main(["jobs", "run", "--job-id", "1", "--profile", "nightly"]) == 1
    err = capsys.readouterr().err
    assert "no usable Databricks credentials" in err and "nightly" in err
