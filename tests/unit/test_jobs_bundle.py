"""databricks.yml is generated from jobs/*.json (tools.bundle,
``make bundle``): the committed file is what the generator writes, every target
of what it writes resolves to exactly its cloud's job files, and the generator
puts what the clouds share, the variables and each cloud's additions where the
Databricks CLI joins them, or refuses files it cannot write as one bundle."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from databricks.sdk.service.jobs import JobSettings

from dist_dl.app.databricks.jobs import WHEEL_PLACEHOLDER
from tools.bundle import (BUNDLE_WHEEL, CLOUDS, BundleError, build, generate,
                                            main, resolve_target)

pytestmark = [pytest.mark.timeout(60), pytest.mark.repository]

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
BUNDLE = ROOT / "databricks.yml"
# What a history would leave: a date, a time zone, a commit hash (hex with letters and digits).
HISTORY = re.compile(r"\b(19|20)\d\d-\d\d-\d\d\b|\bUTC\b|\b\d\d:\d\d(:\d\d)?\b|"
                     r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def _as_job_file(job: dict) -> dict:
    job = copy.deepcopy(job)
    for task in job["tasks"]:
        task["libraries"] = [{"whl": WHEEL_PLACEHOLDER} if lib == {"whl": BUNDLE_WHEEL} else lib
                             for lib in task["libraries"]]
    return job


def _resolved_equals_files(text: str, folder: Path) -> None:
    """Every target of ``text`` holds exactly the jobs of its cloud's files in ``folder``."""
    bundle = yaml.safe_load(text)
    assert set(bundle["targets"]) == {f"{env}_{cloud}" for env in ("dev", "prod")
                                      for cloud in CLOUDS}
    for target in bundle["targets"]:
        cloud = target.split("_", 1)[1]
        files = {p.stem[:-len(cloud) - 1]: p for p in folder.glob(f"*_{cloud}.json")}
        jobs = resolve_target(bundle, target)
        assert set(jobs) == set(files), target
        for name, job in jobs.items():
            expected = json.loads(files[name].read_text())
            assert _as_job_file(job) == expected, f"{target}: {name}"
            assert JobSettings.from_dict(_as_job_file(job)) == JobSettings.from_dict(expected)


@pytest.fixture
def jobs_copy(tmp_path) -> Path:
    folder = tmp_path / "jobs"
    shutil.copytree(JOBS, folder, ignore=shutil.ignore_patterns("*.md"))
    return folder


def _edit(path: Path, change) -> None:
    job = json.loads(path.read_text())
    change(job)
    path.write_text(json.dumps(job, indent=2))


def _task(job: dict, key: str) -> dict:
    return next(t for t in job["tasks"] if t["task_key"] == key)


# ------------------------------------------------------------------ the committed file

def test_databricks_yml_is_what_the_job_files_generate():
    assert BUNDLE.read_text() == generate(JOBS), \
        "databricks.yml is not what jobs/*.json generate: run `make bundle` (or `python -m " \
        "tools.bundle` in the checkout) and commit databricks.yml"


def test_every_generated_target_resolves_to_its_clouds_job_files():
    _resolved_equals_files(generate(JOBS), JOBS)


def test_the_bundle_and_the_job_files_carry_no_history():
    assert generate(JOBS) == generate(JOBS)
    for path in [BUNDLE, *sorted(JOBS.glob("*.json"))]:
        found = [m.group(0) for m in HISTORY.finditer(path.read_text())]
        assert found == [], f"{path.name}: {found}"


# ------------------------------------------------------------------ what the generator writes

def _small(cloud: str) -> dict:
    azure = cloud == "azure"
    return {
        "name": "small",
        "description": f"On {CLOUDS[cloud]} GPUs; defined in jobs/small_{cloud}.json.",
        "tags": {"project": "dist_dl", "cloud": cloud},
        "parameters": [{"name": "steps", "default": "50"}],
        "job_clusters": [{"job_cluster_key": "gpu", "new_cluster": {
            "spark_version": "15.4.x-gpu-ml-scala2.12",
            "node_type_id": "Standard_NC24ads_A100_v4" if azure else "g5.2xlarge",
            "driver_node_type_id": "Standard_NC4as_T4_v3" if azure else "g4dn.xlarge",
            "num_workers": 2,
            **({"azure_attributes": {"availability": "ON_DEMAND_AZURE"}} if azure else
               {"aws_attributes": {"availability": "ON_DEMAND", "zone_id": "auto"}}),
        }}],
        "tasks": [{"task_key": "bench", "job_cluster_key": "gpu",
                   "python_wheel_task": {"package_name": "dist_dl", "entry_point": "dist-dl",
                                         "parameters": ["bench", "--set",
                                                        "bench.steps={{job.parameters.steps}}"]},
                   "libraries": [{"whl": WHEEL_PLACEHOLDER}],
                   "timeout_seconds": 7200 if azure else 3600}],
    }


@pytest.fixture
def small(tmp_path) -> Path:
    folder = tmp_path / "jobs"
    folder.mkdir()
    for cloud in CLOUDS:
        (folder / f"small_{cloud}.json").write_text(json.dumps(_small(cloud), indent=2))
    return folder


def test_shared_settings_variables_and_each_clouds_additions(small):
    bundle = build(small)
    wheel_task = _small("azure")["tasks"][0]["python_wheel_task"]
    assert bundle["resources"]["jobs"] == {"small": {
        "name": "small",
        "description": "On ${var.cloud_label} GPUs; defined in jobs/small_${var.cloud}.json.",
        "tags": {"project": "dist_dl", "cloud": "${var.cloud}"},
        "parameters": [{"name": "steps", "default": "50"}],
        "job_clusters": [{"job_cluster_key": "gpu", "new_cluster": {
            "spark_version": "15.4.x-gpu-ml-scala2.12",
            # a driver on a cluster keyed "gpu" is a variable; this job's worker type is not
            "driver_node_type_id": "${var.gpu_driver_node_type}", "num_workers": 2}}],
        "tasks": [{"task_key": "bench", "job_cluster_key": "gpu", "python_wheel_task": wheel_task,
                   "libraries": [{"whl": BUNDLE_WHEEL}]}],
    }}
    assert list(bundle["variables"]) == ["cloud", "cloud_label", "gpu_driver_node_type"]
    assert all(v["description"] and "default" not in v for v in bundle["variables"].values())
    targets = bundle["targets"]
    assert list(targets) == ["dev_azure", "prod_azure", "dev_aws", "prod_aws"]
    assert targets["dev_azure"]["default"] is True and "default" not in targets["dev_aws"]
    assert [t["mode"] for t in targets.values()] == ["development", "production"] * 2
    assert targets["dev_aws"]["variables"] == {"cloud": "aws", "cloud_label": "AWS",
                                               "gpu_driver_node_type": "g4dn.xlarge"}
    assert targets["dev_aws"]["resources"] == {"jobs": {"small": {
        "job_clusters": [{"job_cluster_key": "gpu", "new_cluster": {
            "node_type_id": "g5.2xlarge",
            "aws_attributes": {"availability": "ON_DEMAND", "zone_id": "auto"}}}],
        "tasks": [{"task_key": "bench", "timeout_seconds": 3600}]}}}
    # one object per cloud, written once with an alias
    assert targets["prod_aws"]["resources"] is targets["dev_aws"]["resources"]
    text = generate(small)
    assert "resources: &aws_resources" in text and "resources: *aws_resources" in text
    _resolved_equals_files(text, small)


def test_a_setting_only_one_cloud_has_gets_a_default_every_target_can_use(small):
    _edit(small / "small_aws.json", lambda j: j["job_clusters"][0]["new_cluster"][
        "aws_attributes"].__setitem__("instance_profile_arn", "arn:aws:iam::<EDIT:id>:x"))
    bundle = build(small)
    assert bundle["variables"]["instance_profile_arn"]["default"] == "arn:aws:iam::<EDIT:id>:x"
    assert "instance_profile_arn" not in bundle["targets"]["dev_aws"]["variables"]
    _resolved_equals_files(generate(small), small)


def test_a_change_to_one_clouds_file_reaches_only_its_targets(jobs_copy):
    _edit(jobs_copy / "training_workflow_aws.json",
          lambda j: _task(j, "train").__setitem__("timeout_seconds", 1))
    for cloud in CLOUDS:
        _edit(jobs_copy / f"training_workflow_{cloud}.json",
              lambda j: j.__setitem__("max_concurrent_runs", 2))
    bundle = yaml.safe_load(generate(jobs_copy))
    assert bundle["resources"]["jobs"]["training_workflow"]["max_concurrent_runs"] == 2
    for target in ("dev_azure", "prod_aws"):
        train = _task(resolve_target(bundle, target)["training_workflow"], "train")
        assert train["timeout_seconds"] == (1 if target.endswith("aws") else 172800)
    _resolved_equals_files(generate(jobs_copy), jobs_copy)


def test_a_new_pair_of_job_files_becomes_a_resource(jobs_copy):
    for cloud in CLOUDS:
        job = json.loads((jobs_copy / f"ensemble_cpu_{cloud}.json").read_text())
        job["name"] = "dist_dl ensemble (mean)"
        (jobs_copy / f"ensemble_mean_{cloud}.json").write_text(json.dumps(job))
    text = generate(jobs_copy)
    assert "ensemble_mean" in yaml.safe_load(text)["resources"]["jobs"]
    _resolved_equals_files(text, jobs_copy)


@pytest.mark.parametrize("change, message", [
    (lambda folder: (folder / "ensemble_cpu_aws.json").unlink(),
     r"ensemble_cpu_aws\.json is missing: every job has one file per cloud"),
    (lambda folder: (folder / "ensemble_cpu_azure.json").rename(folder / "ensemble.json"),
     r"ensemble\.json: name a job file <job>_<cloud>\.json"),
    (lambda folder: _edit(folder / "ensemble_cpu_aws.json",
                          lambda j: j["parameters"][0].__setitem__("default", "table")),
     r"ensemble_cpu_azure\.json and .*ensemble_cpu_aws\.json: parameters: the clouds' files "
     r"differ here, .* make it the same in every cloud's file"),
    (lambda folder: _edit(folder / "benchmark_gpu_aws.json",
                          lambda j: j["job_clusters"][0]["new_cluster"].__setitem__(
                              "driver_node_type_id", "g5.xlarge")),
     r"variable 'gpu_driver_node_type' is .* elsewhere in the aws files"),
    (lambda folder: _edit(folder / "ensemble_cpu_aws.json",
                          lambda j: j.__setitem__("name", "ensemble ${USER}")),
     r"ensemble_cpu_aws\.json: 'ensemble \$\{USER\}': the Databricks CLI reads"),
])
def test_files_the_bundle_cannot_hold_are_refused_naming_the_file_and_the_fix(jobs_copy, change,
                                                                              message):
    change(jobs_copy)
    with pytest.raises(BundleError, match=message):
        generate(jobs_copy)


# ------------------------------------------------------------------ the command

def test_the_command_writes_checks_and_names_the_fix(small, tmp_path, capsys):
    out = tmp_path / "databricks.yml"
    assert main(["--jobs", str(small), "--output", str(out), "--check"]) == 1
    assert main(["--jobs", str(small), "--output", str(out)]) == 0
    assert out.read_text() == generate(small)
    assert main(["--jobs", str(small), "--output", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("timeout_seconds: 3600", "timeout_seconds: 60"))
    capsys.readouterr()
    assert main(["--jobs", str(small), "--output", str(out), "--check"]) == 1
    assert "run `make bundle` and commit" in capsys.readouterr().err
    (small / "small_aws.json").unlink()
    assert main(["--jobs", str(small), "--output", str(out)]) == 1
    assert "small_aws.json is missing" in capsys.readouterr().err


def test_python_m_checks_the_checkout():
    done = subprocess.run([sys.executable, "-m", "tools.bundle", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "up to date" in done.stdout
