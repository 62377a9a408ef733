"""databricks.yml, the Databricks Asset Bundle, holds the same jobs as
jobs/*.json: every target, resolved as the Databricks CLI does (its variables
filled in, its resources joined with the top-level ones), has exactly the jobs
of its cloud's JSON files, equal field for field through databricks-sdk's job
settings classes.

The Databricks CLI (a Go binary) is not installed here, so the resolution is
done in this file; it covers what databricks.yml uses: ``${var.<name>}`` in
values, and target resources joined by key (maps key by key, ``tasks`` by
``task_key``, ``job_clusters`` by ``job_cluster_key``, other lists appended).
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from databricks.sdk.service.jobs import JobSettings

from dist_dl.app.databricks.jobs import WHEEL_PLACEHOLDER

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "databricks.yml"
JOB_FILES = sorted((ROOT / "jobs").glob("*.json"))
CLOUDS = ("azure", "aws")
BUNDLE_WHEEL = "./dist/*.whl"  # the bundle's wheel; the JSON names WHEEL_PLACEHOLDER there
_VARIABLE = re.compile(r"\$\{var\.([\w-]+)\}")
_LIST_KEYS = {"tasks": "task_key", "job_clusters": "job_cluster_key"}


def _join(base, override, field: str | None = None):
    """``override`` (a target's setting) joined onto ``base`` (the top level's)."""
    if isinstance(base, dict) and isinstance(override, dict):
        joined = dict(base)
        for key, value in override.items():
            joined[key] = _join(base[key], value, key) if key in base else value
        return joined
    if isinstance(base, list) and isinstance(override, list):
        key = _LIST_KEYS.get(field)
        if key is None:
            return base + override
        joined = list(base)
        for item in override:
            index = next((i for i, old in enumerate(joined) if old.get(key) == item.get(key)), None)
            if index is None:
                joined.append(item)
            else:
                joined[index] = _join(joined[index], item)
        return joined
    return override


def _fill(node, values: dict, where: str):
    """``${var.<name>}`` replaced by the target's value, everywhere in ``node``."""
    if isinstance(node, dict):
        return {k: _fill(v, values, f"{where}.{k}") for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values, f"{where}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str):
        def value(match: re.Match) -> str:
            name = match.group(1)
            assert values.get(name) is not None, \
                f"{where}: variable {name!r} has no value (declare it, give it a default or set " \
                f"it in the target)"
            return str(values[name])
        return _VARIABLE.sub(value, node)
    return node


def resolved_jobs(bundle: dict, target: str) -> dict[str, dict]:
    """Job resource key -> job settings, as the target deploys them."""
    spec = copy.deepcopy(bundle["targets"][target] or {})
    declared = bundle.get("variables") or {}
    values = {name: (d or {}).get("default") for name, d in declared.items()}
    for name, value in (spec.get("variables") or {}).items():
        assert name in declared, f"target {target} sets variable {name!r}, which is not declared"
        values[name] = value["default"] if isinstance(value, dict) else value
    resources = _join(copy.deepcopy(bundle.get("resources") or {}), spec.get("resources") or {})
    return _fill(resources.get("jobs") or {}, values, f"targets.{target}.resources.jobs")


def _as_json_file(job: dict) -> dict:
    """The bundle's job with the JSON files' wheel placeholder where the bundle names its wheel."""
    job = copy.deepcopy(job)
    for task in job.get("tasks") or []:
        task["libraries"] = [{"whl": WHEEL_PLACEHOLDER} if lib == {"whl": BUNDLE_WHEEL} else lib
                             for lib in task.get("libraries") or []]
    return job


def _differences(one, two, path: str = "") -> list[str]:
    if isinstance(one, dict) and isinstance(two, dict):
        out = []
        for key in sorted(set(one) | set(two)):
            here = f"{path}.{key}" if path else key
            if key not in two:
                out.append(f"{here}: only in the bundle")
            elif key not in one:
                out.append(f"{here}: only in the JSON file")
            else:
                out += _differences(one[key], two[key], here)
        return out
    if isinstance(one, list) and isinstance(two, list) and len(one) == len(two):
        return [d for i, (a, b) in enumerate(zip(one, two))
                for d in _differences(a, b, f"{path}[{i}]")]
    return [] if one == two else [f"{path}: bundle {one!r}, JSON {two!r}"]


def bundle_differences(bundle: dict, job_files: list[Path]) -> list[str]:
    """Every way the bundle's targets and the JSON files disagree ([] if none)."""
    problems = []
    targets = bundle.get("targets") or {}
    for cloud in CLOUDS:
        for env in ("dev", "prod"):
            if f"{env}_{cloud}" not in targets:
                problems.append(f"no target {env}_{cloud}")
    for target in targets:
        cloud = target.rsplit("_", 1)[-1]
        if cloud not in CLOUDS:
            problems.append(f"target {target}: name it <env>_<cloud>, cloud one of {CLOUDS}")
            continue
        files = {p.stem[:-len(cloud) - 1]: p for p in job_files if p.stem.endswith(f"_{cloud}")}
        jobs = resolved_jobs(bundle, target)
        for key in sorted(set(files) - set(jobs)):
            problems.append(f"target {target}: no job {key!r} for {files[key].name}")
        for key in sorted(set(jobs) - set(files)):
            problems.append(f"target {target}: job {key!r} has no jobs/{key}_{cloud}.json")
        for key in sorted(set(jobs) & set(files)):
            job = _as_json_file(jobs[key])
            where = f"target {target}: job {key}"
            leftover = [d for d in _differences(job, JobSettings.from_dict(job).as_dict())]
            problems += [f"{where}: {d} (lost when databricks-sdk reads it: a misspelt field?)"
                         for d in leftover]
            ours = JobSettings.from_dict(job).as_dict()
            theirs = JobSettings.from_dict(json.loads(files[key].read_text())).as_dict()
            problems += [f"{where}: {d}" for d in _differences(ours, theirs)]
    return problems


@pytest.fixture(scope="module")
def bundle() -> dict:
    return yaml.safe_load(BUNDLE.read_text())


def test_the_bundle_holds_the_jobs_of_the_json_files(bundle):
    assert JOB_FILES and bundle["resources"]["jobs"], "no jobs to compare"
    assert bundle_differences(bundle, JOB_FILES) == []
    # each cloud's target deploys every job of that cloud's files
    for cloud in CLOUDS:
        files = [p for p in JOB_FILES if p.stem.endswith(f"_{cloud}")]
        assert len(resolved_jobs(bundle, f"prod_{cloud}")) == len(files) >= 3


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
