"""Databricks jobs: check the job definitions in ``jobs/``, deploy them with
this project's wheel, start a run and follow it to the end.

Driver side: this runs where you develop (a laptop, CI) and talks to a
workspace through databricks-sdk. The job files are Jobs API 2.1 JSON (what
``POST /api/2.1/jobs/create`` takes; the SDK sends the same body to 2.2)::

    dist-dl jobs validate                              # every jobs/*.json
    dist-dl jobs deploy jobs/training_workflow_azure.json
    dist-dl jobs run jobs/training_workflow_azure.json --param epochs=1

Authentication is databricks-sdk's own: ``DATABRICKS_HOST`` and
``DATABRICKS_TOKEN``, or a profile of ``~/.databrickscfg`` (``--profile``).

The wheel: a job file's libraries name :data:`WHEEL_PLACEHOLDER`;
:func:`deploy` uploads the wheel as a workspace file and puts its
``/Workspace/...`` path there. Values a user must set are written
``<EDIT:what>``; :func:`validate` accepts them (the files are templates) and
:func:`deploy` refuses to send them.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping

from dist_dl import compat

__all__ = ["WHEEL_PLACEHOLDER", "Problem", "JobsError", "JobFileError", "AuthenticationError",
           "RunFailedError", "RunResult", "validate", "load_job", "deploy", "run",
           "add_jobs_command", "main"]

WHEEL_PLACEHOLDER = "${DIST_DL_WHEEL}"
"""Library path in a job file that :func:`deploy` replaces with the uploaded wheel's."""

_PACKAGE = "dist_dl"
_ENTRY_POINT = "dist-dl"
_REPO = Path(__file__).resolve().parents[3]  # src/dist_dl/databricks/jobs.py -> the checkout

# Databricks removed HorovodRunner (and Horovod) from the ML runtimes after
# 15.4 LTS ML; 13.0 is the first with Python 3.10, the oldest the wheel supports.
_MAX_RUNTIME = (15, 4)
_MIN_RUNTIME = (13, 0)
_RUNTIME = re.compile(r"^(\d+)\.(\d+)\.x-(cpu|gpu)-ml-scala\d+\.\d+$")
# Steps that start Horovod workers: their cluster must be a GPU ML runtime on
# GPU machines (Databricks wants GPU types for the driver too).
_GPU_COMMANDS = frozenset({"train", "bench", "search", "pipeline"})
_GPU_NODE = re.compile(r"^(Standard_N|(g4dn|g5|g6|g6e|p3|p4d|p4de|p5|p5e|p5en)\.|(a2|a3|g2)-)")
_TASK_TYPES = ("python_wheel_task", "notebook_task")

_REFERENCE = re.compile(r"\{\{(.*?)\}\}")
_SECRET_REFERENCE = re.compile(r"^secrets/[\w.@-]+/[\w.@-]+$")
_DYNAMIC_NAMESPACES = ("job", "task", "tasks", "workspace", "backfill")
_EDIT_MARKER = re.compile(r"<EDIT:[^>]*>")
_WHEEL_PATH = re.compile(r"(^|/)dist_dl-[^/]+\.whl$")

# Secret-looking literals. The generic base64 rule also asks for mixed case
# and digits and skips absolute paths, so that paths and names do not trip it;
# the hex rule skips MLflow run ids in runs:/ URIs (32 hex digits, no secret).
_SECRET_PATTERNS = (
    ("a Databricks personal access token", re.compile(r"\bdapi[0-9a-f]{16,}")),
    ("a SAS signature (sig=...)", re.compile(r"\bsig=[A-Za-z0-9%+/=]{8,}")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a JSON web token", re.compile(r"\beyJ[\w-]{10,}\.[\w-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a long hex string", re.compile(r"(?<!runs:/)\b[0-9a-fA-F]{32,}\b")),
)
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/=]{32,}")
# Keys that name a credential must take a secret reference; "*.type" settings
# (fs.azure.sas.token.provider.type, ...) choose a mechanism and hold no secret.
_CREDENTIAL_KEY = re.compile(r"(?i)(token|secret|password|passwd|credential|\bsas\b|sas[._]|"
                             r"access[._-]?key|account[._-]key|private[._-]key)")

_AUTH_HELP = ("set DATABRICKS_HOST (your workspace URL, e.g. "
              "https://adb-<id>.<n>.azuredatabricks.net or "
              "https://<name>.cloud.databricks.com) and DATABRICKS_TOKEN (a personal access "
              "token: User settings > Developer > Access tokens), or pass --profile NAME for a "
              "profile in ~/.databrickscfg (`databricks auth login` writes one)")


# ------------------------------------------------------------------ errors and results

@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a job file.

    Attributes:
        file: The job file (or the name given for a job dict).
        task: The task's key, or None for a job-level field.
        field: Where in the job (or the task), e.g. ``python_wheel_task.parameters``.
        message: What is wrong and how to fix it.
    """

    file: str
    task: str | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"task {self.task!r}: " if self.task is not None else ""
        return f"{self.file}: {where}{self.field}: {self.message}"


class JobsError(RuntimeError):
    """A job could not be deployed or run; the message says why and what to do."""


class JobFileError(JobsError):
    """A job file has problems (:attr:`problems`, one per line in the message)."""

    def __init__(self, problems: list[Problem], headline: str):
        self.problems = list(problems)
        super().__init__("\n  ".join([headline, *map(str, self.problems)]))


class AuthenticationError(JobsError):
    """No credentials, or the workspace rejected them (HTTP 401/403)."""


class RunFailedError(JobsError):
    """A run ended without success.

    Attributes:
        run_id: The run.
        url: The run's page in the workspace.
        failed_tasks: Keys of the tasks that failed (not those skipped after them).
    """

    def __init__(self, message: str, run_id: int, url: str, failed_tasks: list[str]):
        super().__init__(message)
        self.run_id = run_id
        self.url = url
        self.failed_tasks = failed_tasks


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Where a run is (or ended).

    Attributes:
        run_id: The run.
        job_id: Its job.
        url: The run's page in the workspace.
        life_cycle_state: ``PENDING``, ``RUNNING``, ... ``TERMINATED``.
        result_state: ``SUCCESS``, ``FAILED``, ... once it has one, else None.
        message: The state message Databricks gives, if any.
    """

    run_id: int
    job_id: int
    url: str
    life_cycle_state: str | None
    result_state: str | None
    message: str = ""


# ------------------------------------------------------------------ walking a job dict

def _label(item: Any, index: int) -> str:
    if isinstance(item, dict):
        for key in ("task_key", "job_cluster_key", "name"):
            if isinstance(item.get(key), str):
                return f"[{item[key]}]"
    return f"[{index}]"


def _format(path: tuple) -> str:
    return "".join(p if p.startswith("[") else "." + p for p in path).lstrip(".") or "(job)"


def _split(path: tuple) -> tuple[str | None, str]:
    """(task key, field) of a path: fields under ``tasks[<key>]`` belong to that task."""
    if len(path) > 1 and path[0] == "tasks":
        return path[1][1:-1], _format(path[2:]) if len(path) > 2 else "(task)"
    return None, _format(path)


def _strings(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, str, bool]]:
    """(path, text, is_key) for every string in ``node``, keys included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (str(key),), str(key), True
            yield from _strings(value, path + (str(key),))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _strings(item, path + (_label(item, index),))
    elif isinstance(node, str):
        yield path, node, False


def _round_trip_losses(before: Any, after: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in before.items():
            if key not in after:
                yield path + (key,), (
                    "is lost when databricks-sdk reads the job (JobSettings.from_dict): a "
                    "misspelt or misplaced field, a value outside the field's allowed values, or "
                    "an empty value")
            else:
                yield from _round_trip_losses(value, after[key], path + (key,))
        for key in after:
            if key not in before:
                yield path + (key,), "appears only after databricks-sdk reads the job"
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (one, two) in enumerate(zip(before, after)):
            yield from _round_trip_losses(one, two, path + (_label(one, index),))
    elif before != after:
        yield path, f"{before!r} becomes {after!r} when databricks-sdk reads the job"


# ------------------------------------------------------------------ validation

def _read(path: Path) -> dict:
    try:
        job = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no job file {str(path)!r}") from None
    except json.JSONDecodeError as exc:
        raise JobFileError([Problem(str(path), None, f"line {exc.lineno}",
                                    f"not valid JSON: {exc.msg}")],
                           f"{path} is not a job definition") from None
    if not isinstance(job, dict):
        raise JobFileError([Problem(str(path), None, "(job)", "must be a JSON object of job "
                                    "settings")], f"{path} is not a job definition")
    return job


@functools.lru_cache(maxsize=1)
def _console_scripts() -> frozenset[str]:
    """Console scripts that setup.py declares (or, installed from a wheel, the
    distribution's metadata)."""
    setup = _REPO / "setup.py"
    if setup.is_file():
        for node in ast.walk(ast.parse(setup.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "entry_points":
                try:
                    points = ast.literal_eval(node.value)
                except ValueError:
                    break
                return frozenset(item.split("=")[0].strip()
                                 for item in points.get("console_scripts", []))
    from importlib import metadata

    try:
        return frozenset(e.name for e in metadata.distribution(_PACKAGE).entry_points
                         if e.group == "console_scripts")
    except metadata.PackageNotFoundError:
        return frozenset()


def _substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` as a task would see it: job parameters replaced by ``values``,
    other dynamic references (``{{job.run_id}}``, ...) by a sample value."""
    def one(match: re.Match) -> str:
        inner = match.group(1).strip()
        if inner.startswith("job.parameters."):
            return values.get(inner[len("job.parameters."):], match.group(0))
        if inner.split(".")[0] in _DYNAMIC_NAMESPACES:
            return "1"
        return match.group(0)

    return _REFERENCE.sub(one, text)


def _check_command(argv: list[str], config_values: Mapping[str, str], add) -> str | None:
    """Parse a wheel task's parameters like the console script would and load
    its configuration; returns the command."""
    from dist_dl.cli import STEPS, build_parser
    from dist_dl.config import PipelineConfig, load_config, parse_overrides

    field = "python_wheel_task.parameters"
    argv = [_substitute(a, config_values) if isinstance(a, str) else a for a in argv]
    if not all(isinstance(a, str) for a in argv):
        add(field, "must be a list of strings (the dist-dl command line)")
        return None
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            args = build_parser().parse_args(argv)
    except SystemExit:
        lines = captured.getvalue().strip().splitlines()
        add(field, f"`dist-dl {' '.join(argv)}` does not parse: "
                   f"{lines[-1] if lines else 'argparse exited'}")
        return None
    if args.command not in STEPS:
        add(field, f"runs `dist-dl {args.command}`; a job task runs one of the steps "
                   f"({', '.join(STEPS)})")
        return args.command
    if any(_REFERENCE.search(a) for a in argv):
        return args.command  # a reference left unresolved is reported where it is written
    try:
        load_config(PipelineConfig, args.config, parse_overrides(args.set))
    except Exception as exc:  # any configuration error, named by load_config
        add(field, f"the configuration does not load: {exc}")
    return args.command


def _looks_secret(text: str) -> str | None:
    """What kind of secret ``text`` seems to hold, or None."""
    for kind, pattern in _SECRET_PATTERNS:
        if pattern.search(text):
            return kind
    for match in _BASE64_RUN.finditer(text):
        run = match.group(0)
        if run.startswith("/"):
            continue  # an absolute path
        if not (re.search(r"[a-z]", run) and re.search(r"[A-Z]", run) and re.search(r"\d", run)):
            continue
        counts = Counter(run)
        entropy = -sum(c / len(run) * math.log2(c / len(run)) for c in counts.values())
        if entropy >= 4.0:
            return "a long random (base64) string"
    return None


def _check_cluster(cluster: Any, path: tuple, gpu_tasks: list[str], add) -> None:
    if not isinstance(cluster, dict):
        add(path, "must be a cluster specification (an object)")
        return
    version = cluster.get("spark_version")
    match = _RUNTIME.match(version) if isinstance(version, str) else None
    if match is None:
        add(path + ("spark_version",),
            f"{version!r} is not a Databricks ML runtime; the jobs need one that ships Horovod, "
            f"e.g. '15.4.x-gpu-ml-scala2.12' (or '15.4.x-cpu-ml-scala2.12' without GPUs)")
        return
    release, kind = (int(match.group(1)), int(match.group(2))), match.group(3)
    if release > _MAX_RUNTIME:
        add(path + ("spark_version",),
            f"{version!r} does not ship Horovod (Databricks removed HorovodRunner after 15.4 LTS "
            f"ML): use '15.4.x-{kind}-ml-scala2.12'")
    elif release < _MIN_RUNTIME:
        add(path + ("spark_version",),
            f"{version!r} has Python older than 3.10, which the wheel needs: use "
            f"'15.4.x-{kind}-ml-scala2.12'")
    if gpu_tasks and kind != "gpu":
        add(path + ("spark_version",),
            f"tasks {', '.join(gpu_tasks)} start Horovod training, which needs a GPU ML runtime "
            f"('15.4.x-gpu-ml-scala2.12') on GPU nodes, not {version!r}")
    if kind == "gpu":
        for key in ("node_type_id", "driver_node_type_id"):
            node = cluster.get(key)
            if isinstance(node, str) and not _GPU_NODE.match(node):
                add(path + (key,),
                    f"{node!r} is not a GPU instance type, and a GPU runtime needs GPU types for "
                    f"the driver and the workers (e.g. Standard_NC24ads_A100_v4, g5.2xlarge); "
                    f"if it is one, add its family to _GPU_NODE in {Path(__file__).name}")


def validate(job: str | os.PathLike | Mapping[str, Any], *, source: str | None = None,
             parameter_values: Mapping[str, str] | None = None) -> list[Problem]:
    """Check a job definition; an empty list means it is fine.

    Checks: the job survives databricks-sdk's ``JobSettings`` unchanged; every
    ``{{job.parameters.X}}`` is declared (and every declared one used); every
    ``depends_on`` names a task, without cycles; every task runs this
    project's console script (``python_wheel_task``, ``dist_dl`` /
    ``dist-dl``) with parameters that parse with ``dist_dl.cli`` and a
    configuration that loads (job parameters take their defaults, or
    ``parameter_values``), or a notebook under ``notebooks/``; tasks install
    the wheel on a job cluster; secrets appear only as ``{{secrets/...}}``
    references in ``spark_conf`` / ``spark_env_vars``; clusters run an ML
    runtime that ships Horovod, a GPU one for Horovod steps.

    Args:
        job: A job file's path, or the job as a dict.
        source: Name used in the problems (default: the path, or ``"job"``).
        parameter_values: Values for job parameters, as for a run
            (``run(..., params=...)``); default: the declared defaults.

    Returns:
        The problems found, each naming the file, the task and the field.

    Raises:
        FileNotFoundError: ``job`` is a path that does not exist.
        JobFileError: The file is not JSON, or not a JSON object.
    """
    if isinstance(job, Mapping):
        data, file, base = copy.deepcopy(dict(job)), source or "job", _REPO
    else:
        path = Path(job)
        data, file, base = _read(path), source or str(job), path.resolve().parent.parent
    problems: list[Problem] = []

    def add(where, message: str, task: str | None = None) -> None:
        if isinstance(where, tuple):
            owner, field = _split(where)
        else:
            owner, field = None, where
        problems.append(Problem(file, task if task is not None else owner, field, message))

    from databricks.sdk.service.jobs import JobSettings

    for where, message in _round_trip_losses(data, JobSettings.from_dict(data).as_dict()):
        add(where, message)
    if not isinstance(data.get("name"), str) or not data["name"].strip():
        add(("name",), "the job needs a name: `jobs deploy` finds the job to update by it")
    declared, values = _check_parameters(data, parameter_values or {}, add)
    used = _check_text(data, declared, add)
    for name in declared:
        if name not in used:
            add(("parameters", f"[{name}]"), f"job parameter {name!r} is declared but no task "
                                             "uses it ({{job.parameters." + name + "}})")

    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        add(("tasks",), "the job has no tasks")
        tasks = []
    clusters = {c.get("job_cluster_key"): c for c in data.get("job_clusters") or []
                if isinstance(c, dict)}
    keys = [t.get("task_key") for t in tasks if isinstance(t, dict)]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        add(("tasks",), f"task keys {sorted(map(str, duplicates))} are used more than once")
    gpu_tasks: dict[str, list[str]] = {}  # job cluster -> tasks that start Horovod on it
    for index, task in enumerate(tasks):
        where = ("tasks", _label(task, index))
        if not isinstance(task, dict) or not isinstance(task.get("task_key"), str):
            add(where, "a task needs a task_key")
            continue
        command = _check_task(task, where, keys, clusters, values, base, add)
        if command in _GPU_COMMANDS:
            gpu_tasks.setdefault(task.get("job_cluster_key"), []).append(task["task_key"])
        if "new_cluster" in task:
            _check_cluster(task["new_cluster"], where + ("new_cluster",),
                           [task["task_key"]] if command in _GPU_COMMANDS else [], add)
    _check_cycles(tasks, add)

    used_clusters = {t.get("job_cluster_key") for t in tasks if isinstance(t, dict)}
    for index, entry in enumerate(data.get("job_clusters") or []):
        where = ("job_clusters", _label(entry, index))
        cluster_key = entry.get("job_cluster_key") if isinstance(entry, dict) else None
        if cluster_key not in used_clusters:
            add(where, f"job cluster {cluster_key!r} is defined but no task uses it")
        if isinstance(entry, dict):
            _check_cluster(entry.get("new_cluster"), where + ("new_cluster",),
                           gpu_tasks.get(cluster_key, []), add)
    return problems


def _check_parameters(data: dict, given: Mapping[str, str], add):
    """Job parameters are declared once, with a default; returns (declared
    name -> default, the values a run would see with ``given``)."""
    declared: dict[str, str] = {}
    for index, param in enumerate(data.get("parameters") or []):
        where = ("parameters", _label(param, index))
        if not isinstance(param, dict) or not isinstance(param.get("name"), str) \
                or not re.fullmatch(r"[\w.-]+", param["name"]):
            add(where, "a job parameter needs a name of letters, digits, _, - or .")
            continue
        if param["name"] in declared:
            add(where, f"job parameter {param['name']!r} is declared twice")
        default = param.get("default")
        if not isinstance(default, str):
            add(where + ("default",), "a job parameter needs a default (a string; \"\" for none)")
        declared[param["name"]] = default if isinstance(default, str) else ""
    values = dict(declared)
    for name, value in given.items():
        if name not in declared:
            add(("parameters",), f"no job parameter {name!r} to set; declared: "
                                 f"{', '.join(declared) or 'none'}")
        values[name] = str(value)
    return declared, values


def _check_text(data: dict, declared: Mapping[str, str], add) -> set[str]:
    """References and secrets in every string of the job (keys included);
    returns the job parameters referenced."""
    used: set[str] = set()
    for where, text, is_key in _strings(data):
        # Dynamic values resolve in task parameters, and {{job.*}} in job
        # parameters' defaults; secrets in Spark conf and environment values.
        in_parameters = (where[:1] == ("tasks",) and any(
            p in ("parameters", "base_parameters") for p in where[2:])) or (
            where[:1] == ("parameters",) and where[-1:] == ("default",))
        in_cluster_env = not is_key and len(where) >= 2 and where[-2] in ("spark_conf",
                                                                          "spark_env_vars")
        for match in _REFERENCE.finditer(text):
            reference, inner = match.group(0), match.group(1).strip()
            if inner.startswith("secrets/"):
                if not _SECRET_REFERENCE.match(inner):
                    add(where, f"{reference} is not a secret reference: write "
                               "{{secrets/<scope>/<key>}}")
                elif not in_cluster_env:
                    add(where, f"{reference}: Databricks resolves secret references only in "
                               "spark_conf and spark_env_vars values; elsewhere the text is passed "
                               "on as it is")
            elif inner.split(".")[0] in _DYNAMIC_NAMESPACES:
                is_parameter = inner.startswith("job.parameters.")
                if is_parameter:
                    used.add(inner[len("job.parameters."):])
                    if inner[len("job.parameters."):] not in declared:
                        add(where, f"{reference} names no declared job parameter; declared: "
                                   f"{', '.join(declared) or 'none'}")
                if not in_parameters or (is_parameter and where[0] == "parameters"):
                    add(where, f"{reference}: Databricks resolves dynamic value references in "
                               "task parameters (and {{job.*}} values in job parameters' defaults) "
                               "only, not in cluster or job settings")
            else:
                add(where, f"unknown reference {reference}: Databricks resolves "
                           "{{job.parameters.<name>}}, {{job.*}}, {{task.*}}, {{tasks.*}} and "
                           "{{secrets/<scope>/<key>}}")
        kind = _looks_secret(_REFERENCE.sub("", text))
        if kind:
            add(where, f"holds what looks like {kind}: put secrets in a secret scope and write "
                       "{{secrets/<scope>/<key>}} in spark_conf or spark_env_vars")
        elif in_cluster_env and _CREDENTIAL_KEY.search(where[-1]) \
                and not re.search(r"\.type(\.|$)", where[-1]) \
                and not _SECRET_REFERENCE.match(text.strip().strip("{}")):
            add(where, "names a credential, so its value must be a {{secrets/<scope>/<key>}} "
                       "reference, not a literal")
    return used


def _check_task(task: dict, where: tuple, keys: list, clusters: Mapping, values: Mapping,
                base: Path, add) -> str | None:
    """Dependencies, compute and task type of one task; returns its dist-dl
    command (None if it runs none)."""
    key = task["task_key"]
    for index, dep in enumerate(task.get("depends_on") or []):
        target = dep.get("task_key") if isinstance(dep, dict) else None
        if target not in keys:
            add(where + ("depends_on", f"[{index}]"),
                f"depends on {target!r}, which is not a task of this job; tasks: "
                f"{', '.join(map(str, keys))}")
        elif target == key:
            add(where + ("depends_on", f"[{index}]"), "a task cannot depend on itself")
    if "existing_cluster_id" in task:
        add(where + ("existing_cluster_id",),
            "runs on an existing cluster: give the task a job cluster (job_cluster_key) so the "
            "job brings its own runtime and installs the wheel")
    elif "job_cluster_key" in task:
        if task["job_cluster_key"] not in clusters:
            add(where + ("job_cluster_key",),
                f"{task['job_cluster_key']!r} is not in job_clusters; defined: "
                f"{', '.join(map(str, clusters)) or 'none'}")
    elif "new_cluster" not in task:
        add(where + ("job_cluster_key",), "the task has no cluster: set job_cluster_key")
    kinds = [k for k in task if k.endswith("_task")]
    if len(kinds) != 1 or kinds[0] not in _TASK_TYPES:
        add(where, f"a task here runs python_wheel_task (the dist-dl console script) or "
                   f"notebook_task, one of them; found {kinds or 'none'}")
    notebook = task.get("notebook_task")
    if isinstance(notebook, dict):
        target = str(notebook.get("notebook_path", "")).lstrip("/")
        candidates = [base / target, base / f"{target}.py"]
        if not target.startswith("notebooks/") or not any(c.is_file() for c in candidates):
            known = sorted(f"notebooks/{p.stem}" for p in (base / "notebooks").glob("*.py"))
            add(where + ("notebook_task", "notebook_path"),
                f"{notebook.get('notebook_path')!r} is not a notebook of this project: give a "
                f"path under notebooks/, one of: {', '.join(known) or 'none found'}")
    if isinstance(task.get("python_wheel_task"), dict):
        return _check_wheel_task(task, where, values, add)
    return None


def _check_wheel_task(task: dict, where: tuple, values: Mapping, add) -> str | None:
    """This project's package and console script, a command line that parses
    and loads, and the wheel among the libraries."""
    wheel_task = task["python_wheel_task"]
    if wheel_task.get("package_name") != _PACKAGE:
        add(where + ("python_wheel_task", "package_name"),
            f"is {wheel_task.get('package_name')!r}; this project's wheel is {_PACKAGE!r}")
    scripts = _console_scripts()
    if wheel_task.get("entry_point") != _ENTRY_POINT or _ENTRY_POINT not in scripts:
        add(where + ("python_wheel_task", "entry_point"),
            f"is {wheel_task.get('entry_point')!r}; the job runs the console script "
            f"{_ENTRY_POINT!r} (setup.py declares {sorted(scripts) or 'none'})")
    if "named_parameters" in wheel_task:
        add(where + ("python_wheel_task", "named_parameters"),
            "dist-dl takes a command and flags: use positional `parameters`")
    if not any(isinstance(lib, dict) and isinstance(lib.get("whl"), str)
               and (lib["whl"] == WHEEL_PLACEHOLDER or _WHEEL_PATH.search(lib["whl"]))
               for lib in task.get("libraries") or []):
        add(where + ("libraries",),
            f"does not install the project's wheel: add {{\"whl\": \"{WHEEL_PLACEHOLDER}\"}} "
            f"(`jobs deploy` puts the uploaded wheel's path there)")
    return _check_command(list(wheel_task.get("parameters") or []), values,
                          lambda field, message: add(field, message, task=task["task_key"]))


def _check_cycles(tasks: list, add) -> None:
    graph = {t["task_key"]: [d.get("task_key") for d in t.get("depends_on") or []
                             if isinstance(d, dict)]
             for t in tasks if isinstance(t, dict) and isinstance(t.get("task_key"), str)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(key: str, trail: list[str]) -> None:
        state[key] = 1
        for dep in graph.get(key, []):
            if state.get(dep) == 1:
                cycle = trail[trail.index(dep):] + [dep] if dep in trail else [key, dep]
                add(("tasks", f"[{key}]", "depends_on"),
                    f"tasks depend on each other in a cycle: {' -> '.join(cycle)}")
            elif dep in graph and dep not in state:
                visit(dep, trail + [dep])
        state[key] = 2

    for key in graph:
        if key not in state:
            visit(key, [key])


def _edit_markers(job: Mapping, file: str) -> list[Problem]:
    """A problem for each place that still holds an ``<EDIT:...>`` value."""
    problems = []
    for where, text, _ in _strings(dict(job)):
        markers = sorted(set(_EDIT_MARKER.findall(text)))
        if markers:
            task, field = _split(where)
            problems.append(Problem(file, task, field, f"replace {', '.join(markers)} with your "
                                    f"value (or remove the setting if you do not need it; see "
                                    f"jobs/README.md)"))
    return problems


def load_job(path: str | os.PathLike, *, parameter_values: Mapping[str, str] | None = None):
    """Read and validate a job file and convert it to databricks-sdk's settings.

    Args:
        path: The job file.
        parameter_values: Job parameter values to validate with (see :func:`validate`).

    Returns:
        ``databricks.sdk.service.jobs.JobSettings``.

    Raises:
        JobFileError: The file has problems (all of them are listed).
    """
    from databricks.sdk.service.jobs import JobSettings

    problems = validate(path, parameter_values=parameter_values)
    if problems:
        raise JobFileError(problems, f"{path} has {len(problems)} problem(s):")
    return JobSettings.from_dict(_read(Path(path)))


# ------------------------------------------------------------------ the workspace

def _client(profile: str | None = None):
    from databricks.sdk import WorkspaceClient

    try:
        return WorkspaceClient(profile=profile)
    except ValueError as exc:
        raise AuthenticationError(f"no usable Databricks credentials: {_AUTH_HELP}. "
                                  f"(databricks-sdk: {exc})") from None


@contextlib.contextmanager
def _calling(w, action: str):
    """Turn the SDK's errors into one clear message naming what was being done."""
    from databricks.sdk.errors import DatabricksError, PermissionDenied, Unauthenticated

    host = w.config.host
    try:
        yield
    except Unauthenticated as exc:
        raise AuthenticationError(
            f"{host} rejected the credentials (HTTP 401: {exc}) while trying to {action}: the "
            f"token is wrong or expired; {_AUTH_HELP}") from None
    except PermissionDenied as exc:
        raise AuthenticationError(
            f"{host} refused to let these credentials ({w.config.auth_type}) {action} (HTTP 403: "
            f"{exc}): use a token of a user or service principal allowed to {action} (set "
            f"DATABRICKS_TOKEN or --profile), or ask a workspace admin for the permission"
        ) from None
    except DatabricksError as exc:
        raise JobsError(f"{host} could not {action}: {exc}") from None


def _build_wheel(dest: Path) -> Path:
    """``pip wheel --no-deps`` of this checkout, built from a copy in a temporary
    folder so that the build leaves nothing in the checkout."""
    if not (_REPO / "setup.py").is_file():
        raise JobsError(f"no setup.py beside {_PACKAGE} ({_REPO}) to build the wheel from: "
                        f"build it with `pip wheel --no-deps <checkout>` and pass --wheel PATH")
    source = dest / "source"
    top_level = {".git", ".venv", "build", "dist", "mlruns", "runs", "spark-warehouse",
                 "metastore_db", ".pytest_cache"}  # checkout clutter, not package folders
    everywhere = shutil.ignore_patterns("__pycache__", "*.egg-info")

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(everywhere(folder, names))
        if Path(folder) != _REPO:
            return skipped
        # .venv-<profile>: the Makefile's environments of the other profiles.
        return skipped | {n for n in names if n in top_level or n.startswith(".venv-")}

    shutil.copytree(_REPO, source, ignore=ignore)
    out = dest / "wheel"
    # --no-build-isolation: the environment's setuptools builds it, no download
    # needed (the same reason the Makefile uses it).
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
               "--quiet", "-w", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(out.glob(f"{_PACKAGE}-*.whl")) if out.is_dir() else []
    if done.returncode != 0 or not wheels:
        raise JobsError(f"building the wheel failed ({' '.join(command)}):\n"
                        f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return wheels[0]


def _check_wheel(path: Path) -> None:
    """``path`` is a wheel of this project that declares the console script the
    tasks run."""
    problem = None
    if not path.is_file() or not _WHEEL_PATH.search(path.name):
        problem = "is not a file named dist_dl-<version>-...whl"
    elif not zipfile.is_zipfile(path):
        problem = "is not a wheel (a zip archive)"
    else:
        with zipfile.ZipFile(path) as archive:
            points = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
            text = archive.read(points[0]).decode() if points else ""
        if not re.search(rf"^\s*{re.escape(_ENTRY_POINT)}\s*=", text, re.MULTILINE):
            problem = f"declares no {_ENTRY_POINT!r} console script, which the job tasks run"
    if problem:
        raise JobsError(f"{str(path)!r} {problem}: build the wheel from this checkout "
                        f"(pip wheel --no-deps .) or leave out --wheel")


def _find_job(w, name: str) -> int | None:
    with _calling(w, f"list the jobs named {name!r}"):
        # the API's name filter ignores case; deploy matches the exact name
        found = [j.job_id for j in w.jobs.list(name=name) if j.settings and j.settings.name == name]
    if len(found) > 1:
        raise JobsError(f"{len(found)} jobs are named {name!r} in {w.config.host} (ids "
                        f"{', '.join(map(str, found))}): delete the extra ones, or rename the job "
                        f"in its file, so that deploy knows which to update")
    return found[0] if found else None


def _print(out, text: str) -> None:
    print(text, file=out if out is not None else sys.stdout, flush=True)


def deploy(path: str | os.PathLike, wheel: str | os.PathLike | None = None, *,
           profile: str | None = None, client=None, workspace_dir: str | None = None,
           out=None) -> int:
    """Upload the wheel, then create the job of ``path`` or reset the one with its name.

    The wheel goes to the workspace as a workspace file,
    ``<workspace_dir>/<sha256 prefix>/<wheel name>``: a new path for new
    content, so a run already started keeps the wheel it installed. Its
    ``/Workspace/...`` path replaces :data:`WHEEL_PLACEHOLDER` in the job.

    Args:
        path: The job file (no ``<EDIT:...>`` values left).
        wheel: The built wheel; None: built with ``pip wheel --no-deps``.
        profile: A ``~/.databrickscfg`` profile; default: databricks-sdk's
            own resolution (``DATABRICKS_HOST``/``DATABRICKS_TOKEN``, then
            the DEFAULT profile).
        client: A ``databricks.sdk.WorkspaceClient`` to use instead.
        workspace_dir: Workspace folder for wheels; default
            ``/Users/<you>/dist_dl/wheels``.
        out: Stream for progress lines; default stdout.

    Returns:
        The job id.

    Raises:
        JobFileError: The file has problems or unedited ``<EDIT:...>`` values.
        AuthenticationError: No credentials, or the workspace rejected them.
        JobsError: Building or uploading the wheel, or the Jobs API, failed.
    """
    from databricks.sdk.service.jobs import JobSettings
    from databricks.sdk.service.workspace import ImportFormat

    path = Path(path)
    load_job(path)
    job = _read(path)
    markers = _edit_markers(job, str(path))
    if markers:
        raise JobFileError(markers, f"{path} still has values to edit before it can be deployed:")
    w = client if client is not None else _client(profile)
    with tempfile.TemporaryDirectory(prefix="dist_dl_wheel_") as tmp:
        built = Path(wheel) if wheel is not None else _build_wheel(Path(tmp))
        _check_wheel(built)
        content = built.read_bytes()
    if workspace_dir is None:
        with _calling(w, "read the current user"):
            workspace_dir = f"/Users/{w.current_user.me().user_name}/dist_dl/wheels"
    # The Workspace API names files without the /Workspace prefix that
    # clusters use to read them.
    folder = "/" + workspace_dir.strip("/").removeprefix("Workspace/")
    folder = f"{folder}/{hashlib.sha256(content).hexdigest()[:12]}"
    target = f"{folder}/{built.name}"
    with _calling(w, f"upload the wheel to {target}"):
        w.workspace.mkdirs(folder)
        w.workspace.upload(target, content, format=ImportFormat.AUTO, overwrite=True)
    _print(out, f"uploaded {built.name} to /Workspace{target}")

    for task in job.get("tasks", []):
        for library in task.get("libraries") or []:
            if library.get("whl") == WHEEL_PLACEHOLDER:
                library["whl"] = f"/Workspace{target}"
    settings = JobSettings.from_dict(job)
    job_id = _find_job(w, settings.name)
    if job_id is None:
        with _calling(w, f"create the job {settings.name!r}"):
            job_id = w.jobs.create(**compat.shallow_fields(settings)).job_id
        _print(out, f"created job {job_id} {settings.name!r}: {w.config.host}/jobs/{job_id}")
    else:
        with _calling(w, f"update job {job_id} {settings.name!r}"):
            w.jobs.reset(job_id, settings)
        _print(out, f"updated job {job_id} {settings.name!r}: {w.config.host}/jobs/{job_id}")
    return job_id


# ------------------------------------------------------------------ runs

_TERMINAL = frozenset({"TERMINATED", "SKIPPED", "INTERNAL_ERROR"})
# Results of tasks that did not run because of another one (state and status vocabularies).
_NOT_RUN = frozenset({"UPSTREAM_FAILED", "UPSTREAM_CANCELED", "EXCLUDED", "DISABLED", "SKIPPED"})


def _state(obj) -> tuple[str | None, str | None, str]:
    """(life cycle state, result state, message) of a run or a task run.

    ``state`` is the Jobs API field; it is deprecated in favour of ``status``,
    which is read when ``state`` is absent."""
    state = getattr(obj, "state", None)
    if state is not None and state.life_cycle_state is not None:
        return (state.life_cycle_state.value,
                state.result_state.value if state.result_state else None,
                state.state_message or "")
    status = getattr(obj, "status", None)
    if status is None or status.state is None:
        return None, None, ""
    details = status.termination_details
    result = details.code.value if details is not None and details.code is not None else None
    return status.state.value, result, (details.message or "") if details else ""


def _follow(w, run_id: int, poll_seconds: float, timeout: float | None, out, url: str):
    start = time.monotonic()
    last_run, last_tasks = None, {}
    while True:
        with _calling(w, f"read run {run_id}"):
            current = w.jobs.get_run(run_id)
        url = current.run_page_url or url
        elapsed = time.monotonic() - start
        life, result, message = _state(current)
        if (life, result) != last_run:
            last_run = (life, result)
            text = " ".join(s for s in (life, result) if s)
            detail = f": {message}" if message else ""
            _print(out, f"[{elapsed:7.1f}s] run {run_id}: {text}{detail}")
        for task in current.tasks or []:
            task_life, task_result, _ = _state(task)
            if last_tasks.get(task.task_key) != (task_life, task_result):
                last_tasks[task.task_key] = (task_life, task_result)
                text = " ".join(s for s in (task_life, task_result) if s)
                _print(out, f"[{elapsed:7.1f}s]   task {task.task_key}: {text}")
        if life in _TERMINAL:
            return current, url
        if timeout is not None and elapsed > timeout:
            raise JobsError(f"run {run_id} is still {life} after {timeout:.0f} s; it keeps "
                            f"running: {url}")
        time.sleep(poll_seconds)


def _failure(w, current, job_name: str, url: str) -> RunFailedError:
    life, result, message = _state(current)
    failed, skipped, details = [], [], []
    for task in current.tasks or []:
        task_life, task_result, task_message = _state(task)
        if task_life == "INTERNAL_ERROR" or (task_result not in (None, "SUCCESS")
                                             and task_result not in _NOT_RUN):
            failed.append(task.task_key)
            text = f"task {task.task_key!r} {task_result or task_life}"
            if task_message:
                text += f": {task_message}"
            try:  # the task's own error (the Python exception), when Databricks kept it
                error = w.jobs.get_run_output(task.run_id).error if task.run_id else None
            except Exception:  # best effort: the state message above still names the failure
                error = None
            if error and error not in text:
                text += f" ({error.strip().splitlines()[-1]})"
            details.append(text)
        elif task_result and task_result != "SUCCESS":
            skipped.append(f"{task.task_key} {task_result}")
    summary = "; ".join(details) or f"no task failed; the run: {message or life}"
    if skipped:
        summary += f"; not run: {', '.join(skipped)}"
    return RunFailedError(f"run {current.run_id} of job {job_name!r} ended {result or life}: "
                          f"{summary}. Run page: {url}", current.run_id, url, failed)


def run(path: str | os.PathLike | None = None, *, job_id: int | None = None,
        params: Mapping[str, str] | None = None, wait: bool = True, profile: str | None = None,
        client=None, poll_seconds: float = 10.0, timeout: float | None = None,
        out=None) -> RunResult:
    """Start a run of a deployed job (run-now) and follow it to the end.

    Every change of the run's state, and of its tasks' states, is printed
    with the time since the start.

    Args:
        path: The job file; the job with its name in the workspace is run
            (deploy it first). Give ``path`` or ``job_id``.
        job_id: The job to run.
        params: Job parameter values for this run (``{"epochs": "1"}``),
            checked against the job's declared parameters (and, with
            ``path``, validated like the file's defaults).
        wait: False: return right after starting.
        profile: A ``~/.databrickscfg`` profile (see :func:`deploy`).
        client: A ``databricks.sdk.WorkspaceClient`` to use instead.
        poll_seconds: Seconds between state checks.
        timeout: Stop following after this many seconds (the run goes on).
        out: Stream for progress lines; default stdout.

    Returns:
        The final state (with ``wait=False``, the state at the start).

    Raises:
        RunFailedError: The run ended without success; the message names the
            failed task and the run's page.
        JobFileError: ``params`` do not fit the job.
        AuthenticationError: No credentials, or the workspace rejected them.
        JobsError: The job is not deployed, or the Jobs API failed.
    """
    if (path is None) == (job_id is None):
        raise ValueError("give the job file or job_id, one of them")
    params = {str(k): str(v) for k, v in (params or {}).items()}
    name = None
    if path is not None:
        name = load_job(path, parameter_values=params).name
    w = client if client is not None else _client(profile)
    if job_id is None:
        job_id = _find_job(w, name)
        if job_id is None:
            raise JobsError(f"no job named {name!r} in {w.config.host}: deploy it first with "
                            f"`dist-dl jobs deploy {path}`")
    with _calling(w, f"read job {job_id}"):
        settings = w.jobs.get(job_id).settings
    name = settings.name if settings and settings.name else str(job_id)
    declared = [p.name for p in (settings.parameters or [])] if settings else []
    unknown = sorted(set(params) - set(declared))
    if unknown:
        source = str(path or f"job {job_id}")
        raise JobFileError([Problem(source, None, "parameters", f"no job parameter {u!r}; "
                                    f"declared: {', '.join(declared) or 'none'}") for u in unknown],
                           f"cannot run job {name!r} with these --param values:")
    with _calling(w, f"start job {job_id} {name!r}"):
        run_id = w.jobs.run_now(job_id, job_parameters=params or None).response.run_id
    url = f"{w.config.host}/jobs/{job_id}/runs/{run_id}"
    _print(out, f"started run {run_id} of job {job_id} {name!r}: {url}")
    if not wait:
        with _calling(w, f"read run {run_id}"):
            current = w.jobs.get_run(run_id)
        life, result, message = _state(current)
        return RunResult(run_id, job_id, current.run_page_url or url, life, result, message)
    try:
        current, url = _follow(w, run_id, poll_seconds, timeout, out, url)
    except KeyboardInterrupt:
        _print(out, f"stopped following run {run_id}; it goes on: {url}")
        raise
    life, result, message = _state(current)
    if result != "SUCCESS":
        raise _failure(w, current, name, url)
    return RunResult(run_id, job_id, url, life, result, message)


# ------------------------------------------------------------------ command line

def _default_files() -> list[Path]:
    folder = Path("jobs") if Path("jobs").is_dir() else _REPO / "jobs"
    return sorted(folder.glob("*.json"))


def _cmd_validate(args) -> int:
    files = [Path(f) for f in args.files] or _default_files()
    if not files:
        print("dist-dl jobs validate: error: no job files: jobs/ holds no *.json (give FILES)",
              file=sys.stderr)
        return 1
    bad = 0
    for file in files:
        try:
            problems = validate(file)
        except (FileNotFoundError, JobFileError) as exc:
            problems = getattr(exc, "problems", None) or [Problem(str(file), None, "(file)",
                                                                  str(exc))]
        if problems:
            bad += 1
            print(f"{file}: {len(problems)} problem(s)")
            for problem in problems:
                print(f"  {problem}")
            continue
        markers = _edit_markers(_read(file), str(file))
        note = f" ({len(markers)} <EDIT:...> value(s) to set before deploying)" if markers else ""
        print(f"{file}: ok{note}")
    return 1 if bad else 0


def _guarded(command: str, function):
    def call(args) -> int:
        try:
            return function(args)
        except (JobsError, FileNotFoundError, ValueError) as exc:
            print(f"dist-dl jobs {command}: error: {exc}", file=sys.stderr)
            return 1
    return call


def _cmd_deploy(args) -> int:
    deploy(args.file, args.wheel, profile=args.profile, workspace_dir=args.workspace_dir)
    return 0


def _cmd_run(args) -> int:
    # Ctrl-C stops following (run() says the run goes on), not the run.
    params = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {item!r} must look like KEY=VALUE")
        params[key] = value
    try:
        run(args.file, job_id=args.job_id, params=params, wait=not args.no_wait,
            profile=args.profile)
    except KeyboardInterrupt:
        return 130
    return 0


def add_jobs_command(subparsers) -> argparse.ArgumentParser:
    """Add ``jobs validate | deploy | run`` to a ``dist-dl`` parser's subcommands.

    Each subcommand sets ``func(args) -> exit code``, as the other ``dist-dl``
    commands do.

    Args:
        subparsers: What ``parser.add_subparsers()`` returned.

    Returns:
        The ``jobs`` parser.
    """
    jobs = subparsers.add_parser("jobs", help="validate, deploy and run the Databricks job "
                                              "definitions in jobs/",
                                 description="Databricks jobs (Jobs API 2.1 JSON in jobs/). "
                                             "Credentials: DATABRICKS_HOST and DATABRICKS_TOKEN, "
                                             "or --profile.")
    sub = jobs.add_subparsers(dest="jobs_command", required=True)

    check = sub.add_parser("validate", help="check job files (default: jobs/*.json)")
    check.add_argument("files", nargs="*", metavar="FILE")
    check.set_defaults(func=_guarded("validate", _cmd_validate))

    push = sub.add_parser("deploy", help="upload the wheel, create or update the job")
    push.add_argument("file", metavar="FILE")
    push.add_argument("--wheel", help="the built wheel (default: build it with "
                                      "pip wheel --no-deps)")
    push.add_argument("--profile", help="~/.databrickscfg profile")
    push.add_argument("--workspace-dir", help="workspace folder for the wheel "
                                              "(default /Users/<you>/dist_dl/wheels)")
    push.set_defaults(func=_guarded("deploy", _cmd_deploy))

    start = sub.add_parser("run", help="start a run of a deployed job and follow it")
    which = start.add_mutually_exclusive_group(required=True)
    which.add_argument("file", nargs="?", metavar="FILE", help="job file (the job with its name)")
    which.add_argument("--job-id", type=int)
    start.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="job parameter for this run (repeatable)")
    start.add_argument("--no-wait", action="store_true", help="return once the run has started")
    start.add_argument("--profile", help="~/.databrickscfg profile")
    start.set_defaults(func=_guarded("run", _cmd_run))
    return jobs


def main(argv: list[str] | None = None) -> int:
    """``dist-dl jobs ...`` on its own (for tests, and until the CLI includes it).

    Args:
        argv: Arguments after the program name, e.g. ``["jobs", "validate"]``.

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(prog="dist-dl")
    add_jobs_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
