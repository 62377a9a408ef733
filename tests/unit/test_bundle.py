"""databricks.yml, the Databricks Asset Bundle generated from jobs/*.json
(``make bundle``), holds the same jobs as the files: every target, resolved as
the Databricks CLI does (its variables filled in, its resources joined with the
top-level ones), has exactly the jobs of its cloud's JSON files, equal field
for field through databricks-sdk's job settings classes.

The Databricks CLI (a Go binary) is not installed here; the resolution is
tools.bundle.resolve_target, which covers what databricks.yml
uses: ``${var.<name>}`` in values, and target resources joined by key (maps key
by key, ``tasks`` by ``task_key``, ``job_clusters`` by ``job_cluster_key``,
other lists appended). tests/unit/test_jobs_bundle.py checks that the committed
file is what the generator writes.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dist_dl.app.databricks.jobs import WHEEL_PLACEHOLDER
from tools.bundle import (BUNDLE_WHEEL, CLOUDS, bundle_differences,
                                                resolve_target)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "databricks.yml"
JOB_FILES = sorted((ROOT / "jobs").glob("*.json"))


@pytest.fixture(scope="module")
def bundle() -> dict:
    return yaml.safe_load(BUNDLE.read_text())


def test_the_bundle_holds_the_jobs_of_the_json_files(bundle):
    assert JOB_FILES and bundle["resources"]["jobs"], "no jobs to compare"
    assert bundle_differences(bundle, JOB_FILES) == []
    # each cloud's target deploys every job of that cloud's files
    for cloud in CLOUDS:
        files = [p for p in JOB_FILES if p.stem.endswith(f"_{cloud}")]
        assert len(resolve_target(bundle, f"prod_{cloud}")) == len(files) >= 3


def test_the_bundle_builds_and_installs_the_wheel(bundle):
    (artifact,) = bundle["artifacts"].values()
    assert artifact["type"] == "whl" and artifact["build"].startswith("make wheel")
    for job in bundle["resources"]["jobs"].values():
        for task in job["tasks"]:
            assert task["libraries"] == [{"whl": BUNDLE_WHEEL}]
            assert task["python_wheel_task"]["entry_point"] == "dist-dl"


def _changed(bundle: dict, change) -> dict:
    bundle = copy.deepcopy(bundle)
    change(bundle)
    return bundle


def test_the_comparison_finds_each_kind_of_difference(bundle):
    jobs = lambda b: b["resources"]["jobs"]  # noqa: E731
    training = lambda b: jobs(b)["training_workflow"]  # noqa: E731

    def drop_ensemble(b):
        for resources in [b["resources"]] + [t["resources"] for t in b["targets"].values()]:
            resources["jobs"].pop("ensemble_cpu", None)

    missing = _changed(bundle, drop_ensemble)
    assert "target dev_aws: no job 'ensemble_cpu' for ensemble_cpu_aws.json" in \
        bundle_differences(missing, JOB_FILES)
    extra = _changed(bundle, lambda b: jobs(b).__setitem__("spare", training(b)))
    assert "target prod_azure: job 'spare' has no jobs/spare_azure.json" in \
        bundle_differences(extra, JOB_FILES)
    dropped = _changed(bundle, lambda b: training(b).pop("queue"))
    assert "target dev_azure: job training_workflow: queue: only in the JSON file" in \
        bundle_differences(dropped, JOB_FILES)

    field = _changed(bundle, lambda b: training(b)["tasks"][1].__setitem__("timeout_seconds", 1))
    assert "target dev_azure: job training_workflow: tasks[1].timeout_seconds: bundle 1, " \
           "JSON 172800" in bundle_differences(field, JOB_FILES)
    per_cloud = _changed(bundle, lambda b: b["targets"]["dev_aws"]["variables"].__setitem__(
        "train_node_type", "g5.48xlarge"))
    found = bundle_differences(per_cloud, JOB_FILES)
    assert any(p.startswith("target dev_aws: job training_workflow: job_clusters[1]."
                            "new_cluster.node_type_id: bundle 'g5.48xlarge'") for p in found)
    # prod_aws takes dev_aws's variables by a YAML alias: one edit changes both
    assert any(p.startswith("target prod_aws: job training_workflow") for p in found)
    assert not any(p.startswith("target dev_azure") for p in found)
    misspelt = _changed(bundle, lambda b: training(b).__setitem__("max_concurent_runs", 1))
    assert any("max_concurent_runs" in p and "misspelt" in p
               for p in bundle_differences(misspelt, JOB_FILES))
    no_target = _changed(bundle, lambda b: b["targets"].pop("prod_aws"))
    assert "no target prod_aws" in bundle_differences(no_target, JOB_FILES)
