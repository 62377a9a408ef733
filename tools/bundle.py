"""``databricks.yml``, the Databricks Asset Bundle, generated from ``jobs/*.json``.

The job files are the one source of the jobs: ``dist-dl jobs validate | deploy
| run`` and ``databricks jobs create --json`` read them as they are; the bundle
holds the same jobs for ``databricks bundle deploy``::

    make bundle                                        # databricks.yml from jobs/*.json
    python -m tools.bundle --check   # exit 1 if databricks.yml is not current

Each job has one file per cloud, ``jobs/<job>_<cloud>.json``. What the clouds'
files share is the top-level resource (a text that differs only by the cloud's
name says ``${var.cloud}`` or ``${var.cloud_label}``); a field that
`VARIABLES` names is a variable each cloud's targets set; whatever else
differs goes into the cloud's targets, which the Databricks CLI joins with the
resource. `generate()` reads back what it writes and checks that every
target (`resolve_target()`) holds exactly its cloud's files' jobs.
"""
from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from databricks.sdk.service.jobs import JobSettings

from dist_dl.app.databricks.jobs.errors import JobFileError
from dist_dl.app.databricks.jobs.validation import WHEEL_PLACEHOLDER, read_job
from dist_dl.app.databricks.jobs.walk import strings

__all__ = ["CLOUDS", "BUNDLE_WHEEL", "VARIABLES", "Variable", "BundleError", "job_files",
           "build", "generate", "resolve_target", "bundle_differences", "main"]

CLOUDS = {"azure": "Azure", "aws": "AWS"}
"""A job file's cloud suffix -> the cloud's name in descriptions (``${var.cloud_label}``)."""
BUNDLE_WHEEL = "./dist/*.whl"
"""The tasks' library in the bundle: the wheel its artifact builds (``make wheel``)."""
COMMAND = "make bundle"
"""What regenerates databricks.yml in a checkout."""


class Variable(NamedTuple):
    """A bundle variable and the job files' fields it stands for.

    Attributes:
        name: The variable (``${var.<name>}``, ``--var <name>=...``).
        description: Its description in databricks.yml.
        fields: ``<job>/<job_cluster_key>/<field under new_cluster>`` patterns
            (``fnmatch``; nested fields joined by dots). Empty for ``cloud`` and
            ``cloud_label``, which stand for the cloud's name inside strings.
    """

    name: str
    description: str
    fields: tuple[str, ...] = ()


VARIABLES = (
    Variable("cloud", "The workspace's cloud as the job files name it (azure or aws)."),
    Variable("cloud_label", "The cloud's name in the job descriptions."),
    Variable("prepare_node_type",
             "CPU workers and driver that prepare the ImageNet shards (JPEG decoding).",
             ("training_*/cpu_prepare/node_type_id", "training_*/cpu_prepare/driver_node_type_id")),
    Variable("train_node_type",
             "GPU workers of the training workflows, 4 GPUs each (the job parameter num_workers "
             "is 2 x 4).", ("training_*/gpu/node_type_id",)),
    Variable("gpu_driver_node_type",
             "Driver of the GPU clusters, the smallest GPU type (the training workers run on the "
             "cluster's workers).", ("*/gpu/driver_node_type_id",)),
    Variable("bench_node_type", "GPU workers of the benchmark, 1 GPU each.",
             ("benchmark_gpu/gpu/node_type_id",)),
    Variable("ensemble_node_type", "CPU workers and driver of the ensemble job (spot).",
             ("ensemble_cpu/cpu/node_type_id", "ensemble_cpu/cpu/driver_node_type_id")),
    Variable("instance_profile_arn",
             "AWS: an instance profile registered in the workspace that can read your S3 data "
             "(with Unity Catalog only, delete aws_attributes.instance_profile_arn from the AWS "
             f"job files and run `{COMMAND}`).",
             ("*/*/aws_attributes.instance_profile_arn",)),
)
"""The bundle's variables, in the order databricks.yml declares them."""

# Bundle settings that are no job's: the targets' modes and folders, the wheel's build.
_TARGETS = {
    "dev": {"mode": "development"},
    # prod: one deployment per target, wherever it is deployed from (the bundle templates' choice)
    "prod": {"mode": "production", "workspace": {"root_path": (
        "/Workspace/Users/${workspace.current_user.userName}/.bundle/${bundle.name}/"
        "${bundle.target}")}},
}
_ARTIFACTS = {"dist_dl": {"type": "whl", "path": ".", "build": "make wheel"}}
_LIST_KEYS = {"tasks": "task_key", "job_clusters": "job_cluster_key"}
_VARIABLE = re.compile(r"\$\{var\.([\w-]+)\}")
_MISSING = object()

_HEADER = """\
# Generated from {source} by `{command}` (python -m tools.bundle): do not
# edit. Change the job files and run `{command}`; tests/unit/test_jobs_bundle.py fails while
# this file is not what the command writes.
#
# Databricks Asset Bundle: the jobs of {source} as bundle resources, for deploying with
# the Databricks CLI instead of `dist-dl jobs deploy`:
#
#   databricks bundle validate -t dev_azure
#   databricks bundle deploy -t dev_azure        # builds the wheel (make wheel), uploads it
#   databricks bundle run -t dev_azure training_workflow --params epochs=1
#
# Each job is the Jobs API settings of jobs/<job>_<cloud>.json: what the clouds' files share is
# the resource below; the node types are variables that each cloud's targets set (override one
# with --var train_node_type=...); the cloud's attributes and Azure's storage keys are in the
# targets, joined with the resources by job_cluster_key. Targets: dev_<cloud> (mode
# development: jobs named "[dev <you>] ...", schedules paused, deployed under your user folder)
# and prod_<cloud> (mode production). The workspace is the one your CLI profile or
# DATABRICKS_HOST names. Values marked <EDIT:...> must be set before deploying: in the job
# files, then `{command}` (the AWS instance profile also with --var instance_profile_arn=...);
# <EDIT:storage-account> is your ADLS Gen2 account (with Unity Catalog volumes and tables,
# delete the three spark.hadoop.fs.azure.* keys from the Azure job files instead).
# Field-by-field notes, and the secrets to create before the first deploy: jobs/README.md.
"""


class BundleError(ValueError):
    """The job files cannot be written as one bundle; the message names the file and field."""


def job_files(folder: Path) -> dict[str, dict[str, Path]]:
    """The job files of ``folder``: job name -> cloud -> file, every job with every cloud's.

    Raises:
        BundleError: A file's name has no cloud suffix, or a job lacks a cloud's file.
    """
    jobs: dict[str, dict[str, Path]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        cloud = next((c for c in CLOUDS if path.stem.endswith(f"_{c}")), None)
        if cloud is None:
            raise BundleError(f"{path}: name a job file <job>_<cloud>.json, <cloud> one of "
                              f"{', '.join(CLOUDS)}")
        jobs.setdefault(path.stem[:-len(cloud) - 1], {})[cloud] = path
    for job, files in jobs.items():
        for cloud in CLOUDS:
            if cloud not in files:
                raise BundleError(
                    f"{Path(folder) / f'{job}_{cloud}.json'} is missing: every job has one file "
                    f"per cloud ({', '.join(CLOUDS)}), and the bundle's targets deploy each")
    return {job: {cloud: files[cloud] for cloud in CLOUDS} for job, files in jobs.items()}


def _where(path: tuple) -> str:
    return "".join(f"[{p}]" if i and path[i - 1] in _LIST_KEYS else f".{p}"
                   for i, p in enumerate(path)).lstrip(".") or "(job)"


def _in_cloud_terms(text: str, cloud: str) -> str:
    """``text`` with the cloud's name and label replaced by the variables that hold them."""
    for word, variable in ((CLOUDS[cloud], "cloud_label"), (cloud, "cloud")):
        text = re.sub(rf"(?<![A-Za-z]){re.escape(word)}(?![A-Za-z])", f"${{var.{variable}}}", text)
    return text


class _Splitter:
    """One job's files split into the resource all clouds share and each cloud's additions."""

    def __init__(self, job: str, files: dict[str, Path], values: dict[str, dict[str, Any]]):
        self.job, self.files, self.values = job, files, values

    def _variable(self, path: tuple) -> Variable | None:
        if len(path) < 4 or path[0] != "job_clusters" or path[2] != "new_cluster":
            return None
        field = f"{self.job}/{path[1]}/{'.'.join(path[3:])}"
        return next((v for v in VARIABLES if any(fnmatch.fnmatchcase(field, pattern)
                                                 for pattern in v.fields)), None)

    def _set(self, name: str, cloud: str, value: Any, path: tuple) -> str:
        known = self.values.setdefault(name, {})
        if known.setdefault(cloud, value) != value:
            raise BundleError(
                f"{self.files[cloud]}: {_where(path)} is {value!r}, but variable {name!r} is "
                f"{known[cloud]!r} elsewhere in the {cloud} files: make them equal, or give this "
                f"field its own variable in tools.bundle.VARIABLES")
        return f"${{var.{name}}}"

    def own(self, value: Any, cloud: str, path: tuple) -> Any:
        """A value only ``cloud``'s files have, with its variables' references in it."""
        if isinstance(value, dict):
            return {k: self.own(v, cloud, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            key = _LIST_KEYS.get(path[-1] if path else None)
            return [self.own(v, cloud, path + (v[key] if key and key in v else i,))
                    for i, v in enumerate(value)]
        variable = self._variable(path)
        return self._set(variable.name, cloud, value, path) if variable else value

    def split(self, values: dict[str, Any], path: tuple = ()) -> tuple[Any, dict[str, Any]]:
        """(what every cloud's value shares, or _MISSING; cloud -> what its targets add)."""
        first = values[next(iter(CLOUDS))]
        variable = self._variable(path)
        if variable is not None and any(v != first for v in values.values()):
            return self._set_all(variable.name, values, path), {}
        if all(v == first for v in values.values()):
            return first, {}
        if all(isinstance(v, dict) for v in values.values()):
            return self._split_map(values, path)
        if all(isinstance(v, list) for v in values.values()) and path and path[-1] in _LIST_KEYS:
            return self._split_keyed(values, path)
        if all(isinstance(v, list) for v in values.values()):
            raise BundleError(
                f"{' and '.join(str(f) for f in self.files.values())}: {_where(path)}: the "
                f"clouds' files differ here, and a bundle target can only append to this list: "
                f"make it the same in every cloud's file")
        if all(isinstance(v, str) for v in values.values()):
            neutral = {c: _in_cloud_terms(v, c) for c, v in values.items()}
            if len(set(neutral.values())) == 1:
                text = neutral[next(iter(CLOUDS))]
                for name in set(_VARIABLE.findall(text)) & {"cloud", "cloud_label"}:
                    self._set_all(name, {c: c if name == "cloud" else CLOUDS[c] for c in CLOUDS},
                                  path)
                return text, {}
        return _MISSING, {c: self.own(v, c, path) for c, v in values.items()}

    def _set_all(self, name: str, values: dict[str, Any], path: tuple) -> str:
        for cloud, value in values.items():
            self._set(name, cloud, value, path)
        return f"${{var.{name}}}"

    def _split_map(self, values, path):
        keys = list(dict.fromkeys(k for v in values.values() for k in v))
        shared, added = {}, {c: {} for c in CLOUDS}
        for key in keys:
            here = path + (key,)
            having = {c: v[key] for c, v in values.items() if key in v}
            if len(having) < len(CLOUDS):
                for cloud, value in having.items():
                    added[cloud][key] = self.own(value, cloud, here)
                continue
            common, extra = self.split(having, here)
            if common is not _MISSING:
                shared[key] = common
            for cloud, value in extra.items():
                added[cloud][key] = value
        if not shared and any(values.values()):
            shared = _MISSING
        return shared, {c: a for c, a in added.items() if a}

    def _split_keyed(self, values, path):
        key = _LIST_KEYS[path[-1]]
        order = {c: [item.get(key) for item in v] for c, v in values.items()}
        if len({tuple(o) for o in order.values()}) > 1:
            raise BundleError(
                f"{' and '.join(str(f) for f in self.files.values())}: {_where(path)}: the clouds' "
                f"files have different {key}s or order ({order}): make them the same")
        shared, added = [], {c: [] for c in CLOUDS}
        for index, name in enumerate(order[next(iter(CLOUDS))]):
            common, extra = self.split({c: v[index] for c, v in values.items()}, path + (name,))
            shared.append(common)
            for cloud, value in extra.items():
                added[cloud].append({key: name, **value})
        return shared, {c: a for c, a in added.items() if a}


def _with_bundle_wheel(job: dict, path: Path) -> dict:
    job = copy.deepcopy(job)
    for task in job.get("tasks") or []:
        task["libraries"] = [{"whl": BUNDLE_WHEEL} if lib == {"whl": WHEEL_PLACEHOLDER} else lib
                             for lib in task.get("libraries") or []]
    for _, text, _ in strings(job):
        if "${" in text:
            raise BundleError(f"{path}: {text!r}: the Databricks CLI reads ${{...}} in a bundle as "
                              f"a reference; a job file uses it only as {WHEEL_PLACEHOLDER} in a "
                              f"task's libraries")
    return job


def build(folder: Path) -> dict:
    """The bundle (databricks.yml as a dict) that holds the jobs of ``folder``'s files.

    The ``dev_`` and ``prod_`` targets of a cloud share their ``variables`` and
    ``resources`` objects (written once in YAML, with an alias).

    Raises:
        BundleError: The files cannot be written as one bundle (the message says why).
        JobFileError: A file is not a JSON object.
    """
    values: dict[str, dict[str, Any]] = {}
    resources, added = {}, {c: {} for c in CLOUDS}
    for job, files in job_files(folder).items():
        jobs = {c: _with_bundle_wheel(read_job(files[c]), files[c]) for c in CLOUDS}
        shared, extra = _Splitter(job, files, values).split(jobs)
        resources[job] = {} if shared is _MISSING else shared
        for cloud, value in extra.items():
            added[cloud][job] = value
    if not resources:
        raise BundleError(f"{folder} holds no job files (<job>_<cloud>.json)")
    variables = {}
    for variable in VARIABLES:
        if variable.name not in values:
            continue
        declared = variables[variable.name] = {"description": variable.description}
        per_cloud = values[variable.name]
        if len(per_cloud) < len(CLOUDS):
            # every target needs a value, those of clouds without the field too (the CLI refuses
            # a declared variable without one)
            (value, *others) = set(map(json.dumps, per_cloud.values()))
            if others:
                raise BundleError(f"variable {variable.name!r} has different values in the "
                                  f"{' and '.join(per_cloud)} files and none in the others")
            declared["default"] = json.loads(value)
    targets = {}
    for cloud in CLOUDS:
        cloud_values = {n: values[n][cloud] for n in variables
                        if "default" not in variables[n]}
        cloud_resources = {"jobs": added[cloud]} if added[cloud] else None
        for env, settings in _TARGETS.items():
            target = targets[f"{env}_{cloud}"] = copy.deepcopy(settings)
            if len(targets) == 1:
                target["default"] = True
            if cloud_values:
                target["variables"] = cloud_values
            if cloud_resources:
                target["resources"] = cloud_resources
    return {"bundle": {"name": "dist_dl"}, "variables": variables, "artifacts": _ARTIFACTS,
            "resources": {"jobs": resources}, "targets": targets}


# ------------------------------------------------------------------ YAML


class _Dumper(yaml.SafeDumper):
    """Block style with indented lists; flat maps on one line in a list or when short; long
    prose folded; aliases only for the objects named in ``anchor_names`` (id -> anchor)."""

    anchor_names: dict[int, str] = {}

    def ignore_aliases(self, data) -> bool:
        return id(data) not in self.anchor_names

    def generate_anchor(self, node) -> str:
        return next(self.anchor_names[key] for key, known in self.represented_objects.items()
                    if known is node)

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _flat(node) -> bool:
    return isinstance(node, yaml.MappingNode) and bool(node.value) and \
        all(isinstance(value, yaml.ScalarNode) for _, value in node.value)


def _represent_map(dumper, data):
    node = dumper.represent_mapping("tag:yaml.org,2002:map", data.items())
    node.flow_style = _flat(node) and len(json.dumps(data)) <= 48
    return node


def _represent_list(dumper, data):
    node = dumper.represent_sequence("tag:yaml.org,2002:seq", data)
    for item in node.value:
        if _flat(item):
            item.flow_style = True
    return node


def _represent_str(dumper, data):
    prose = len(data) > 90 and " " in data and "\n" not in data and data == data.strip()
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=">" if prose else None)


_Dumper.add_representer(dict, _represent_map)
_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def _yaml(bundle: dict) -> str:
    names = {}
    for name, target in bundle["targets"].items():
        cloud = name.split("_", 1)[1]
        for part in ("variables", "resources"):
            if part in target:
                names.setdefault(id(target[part]), f"{cloud}_{part}")
    dumper = type("_NamedDumper", (_Dumper,), {"anchor_names": names})
    blocks = [yaml.dump({key: value}, Dumper=dumper, sort_keys=False, width=100,
                        default_flow_style=False, allow_unicode=True)
              for key, value in bundle.items()]
    return "\n".join(blocks)


def generate(folder: Path) -> str:
    """databricks.yml's text for the job files of ``folder``, checked before it is returned.

    Raises:
        BundleError: The files cannot be written as one bundle, or (a bug here) the text
            does not resolve to the files' jobs.
    """
    folder = Path(folder)
    bundle = build(folder)
    text = _HEADER.format(source=f"{folder.name}/*.json", command=COMMAND) + "\n" + _yaml(bundle)
    problems = bundle_differences(yaml.safe_load(text), sorted(folder.glob("*.json")))
    if problems:
        raise BundleError("the generated bundle does not hold the job files' jobs (a bug in "
                          "tools.bundle):\n  " + "\n  ".join(problems))
    return text


# ------------------------------------------------------------------ resolving a target


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
            if values.get(name) is None:
                raise BundleError(f"{where}: variable {name!r} has no value (declare it, give it a "
                                  f"default or set it in the target)")
            return str(values[name])
        return _VARIABLE.sub(value, node)
    return node


def resolve_target(bundle: dict, target: str) -> dict[str, dict]:
    """Job resource key -> job settings, as ``target`` deploys them.

    What the Databricks CLI does with what databricks.yml uses: the target's
    variables (else the declared defaults) fill ``${var.<name>}``, and the
    target's resources are joined onto the top-level ones: maps key by key,
    ``tasks`` by ``task_key``, ``job_clusters`` by ``job_cluster_key``, other
    lists appended. The mode's changes (``[dev <you>]`` names, paused
    schedules) are not applied.

    Raises:
        BundleError: The target sets an undeclared variable, or a used one has no value.
    """
    spec = copy.deepcopy(bundle["targets"][target] or {})
    declared = bundle.get("variables") or {}
    values = {name: (d or {}).get("default") for name, d in declared.items()}
    for name, value in (spec.get("variables") or {}).items():
        if name not in declared:
            raise BundleError(f"target {target} sets variable {name!r}, which is not declared")
        values[name] = value["default"] if isinstance(value, dict) else value
    resources = _join(copy.deepcopy(bundle.get("resources") or {}), spec.get("resources") or {})
    return _fill(resources.get("jobs") or {}, values, f"targets.{target}.resources.jobs")


def _as_job_file(job: dict) -> dict:
    """A bundle job with the job files' wheel placeholder where the bundle names its wheel."""
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


def bundle_differences(bundle: dict, files: list[Path]) -> list[str]:
    """Every way the bundle's targets and the job files disagree (``[]`` if none).

    Each target is named ``<env>_<cloud>``; resolved, it must hold one job per
    file of its cloud, ``<job>_<cloud>.json`` as resource ``<job>``, equal to
    the file through databricks-sdk's ``JobSettings`` (which also finds a field
    the SDK does not know).
    """
    problems = []
    targets = bundle.get("targets") or {}
    for cloud in CLOUDS:
        for env in _TARGETS:
            if f"{env}_{cloud}" not in targets:
                problems.append(f"no target {env}_{cloud}")
    for target in targets:
        cloud = target.rsplit("_", 1)[-1]
        if cloud not in CLOUDS:
            problems.append(f"target {target}: name it <env>_<cloud>, cloud one of "
                            f"{tuple(CLOUDS)}")
            continue
        by_job = {p.stem[:-len(cloud) - 1]: p for p in files if p.stem.endswith(f"_{cloud}")}
        try:
            jobs = resolve_target(bundle, target)
        except BundleError as exc:
            problems.append(f"target {target}: {exc}")
            continue
        for key in sorted(set(by_job) - set(jobs)):
            problems.append(f"target {target}: no job {key!r} for {by_job[key].name}")
        for key in sorted(set(jobs) - set(by_job)):
            problems.append(f"target {target}: job {key!r} has no jobs/{key}_{cloud}.json")
        for key in sorted(set(jobs) & set(by_job)):
            job = _as_job_file(jobs[key])
            where = f"target {target}: job {key}"
            ours = JobSettings.from_dict(job).as_dict()
            problems += [f"{where}: {d} (lost when databricks-sdk reads it: a misspelt field?)"
                         for d in _differences(job, ours)]
            theirs = JobSettings.from_dict(json.loads(by_job[key].read_text())).as_dict()
            problems += [f"{where}: {d}" for d in _differences(ours, theirs)]
    return problems


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.bundle [--jobs DIR] [--output FILE] [--check]``.

    Args:
        argv: The arguments after the program name.

    Returns:
        The exit code: 1 if the files cannot be written as a bundle, or with
        ``--check`` if the output file is not what they generate.
    """
    prog = "python -m tools.bundle"
    parser = argparse.ArgumentParser(
        prog=prog, description="Write databricks.yml, the Databricks Asset Bundle, from the job "
                               "files jobs/<job>_<cloud>.json (their one source).")
    parser.add_argument("--jobs", type=Path, default=Path("jobs"),
                        help="the folder of the job files (default: jobs)")
    parser.add_argument("--output", type=Path, default=Path("databricks.yml"),
                        help="the bundle file to write (default: databricks.yml)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the output file is not what the job files "
                             "generate")
    args = parser.parse_args(argv)
    try:
        text = generate(args.jobs)
    except (BundleError, JobFileError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    if args.check:
        current = args.output.read_text() if args.output.is_file() else None
        if current != text:
            print(f"{prog}: {args.output} is not what {args.jobs}/*.json generate: run "
                  f"`{COMMAND}` and commit {args.output}", file=sys.stderr)
            return 1
        print(f"{args.output}: generated from {args.jobs}/*.json, up to date")
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output} from {args.jobs}/*.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
