"""Checking a job definition before it reaches a workspace: the job survives
databricks-sdk unchanged, its references, tasks, clusters and secrets are
sound, and each task's ``dist-dl`` command line parses and loads.

Problems are collected, not raised one at a time, so that a user sees every
mistake in a file at once; each names the file, the task and the field.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from dist_dl.app.databricks.jobs.errors import JobFileError, Problem
from dist_dl.app.databricks.jobs.walk import label, round_trip_losses, strings, task_and_field
from dist_dl.app.steps import STEPS, step_parser
from dist_dl.app.databricks.jobs.clusters import (SECRET_REFERENCE, check_checkpoint_key,
                                                 check_cluster)

__all__ = ["WHEEL_PLACEHOLDER", "WHEEL_NAME", "PACKAGE", "ENTRY_POINT", "validate", "load_job",
           "read_job", "edit_markers", "default_job_files"]

WHEEL_PLACEHOLDER = "${DIST_DL_WHEEL}"
"""Library path in a job file that ``deploy`` replaces with the uploaded wheel's."""
WHEEL_NAME = re.compile(r"(^|/)dist_dl-[^/]+\.whl$")
"""What the file name of this project's wheel looks like."""

PACKAGE = "dist_dl"
"""The package a wheel task imports."""
ENTRY_POINT = "dist-dl"
"""The console script a wheel task runs (``dist_dl.cli:main``; tests check setup.py declares it)."""

# Steps that start training workers (Horovod or tf.distribute): their cluster
# must be a GPU ML runtime on GPU machines (Databricks wants GPU types for the
# driver too).
_GPU_COMMANDS = frozenset({"train", "bench", "search", "pipeline"})
# Steps that train with train_distributed, and so with Horovod when the
# configuration's train.engine is "horovod".
_ENGINE_COMMANDS = frozenset({"train", "pipeline"})
_TASK_TYPES = ("python_wheel_task", "notebook_task")

_REFERENCE = re.compile(r"\{\{(.*?)\}\}")
_DYNAMIC_NAMESPACES = ("job", "task", "tasks", "workspace", "backfill")
_EDIT_MARKER = re.compile(r"<EDIT:[^>]*>")

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


def default_job_files() -> list[Path]:
    """``jobs/*.json`` of the current folder (a project's, holding its jobs/
    and notebooks/)."""
    return sorted(Path("jobs").glob("*.json"))


def read_job(path: Path) -> dict:
    """A job file's JSON object (not yet validated)."""
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


class _Command(NamedTuple):
    """A task's dist-dl step and its configuration's ``train.engine`` (None
    where it cannot be known: the configuration does not load, or a reference
    in the command line is left unresolved)."""

    step: str | None
    engine: str | None = None
    checkpoint_dir: str | None = None


def _check_command(argv: list[str], config_values: Mapping[str, str], add) -> _Command:
    """Parse a wheel task's parameters like the console script would and load
    its configuration; returns the command."""
    from dist_dl.app.config import PipelineConfig, load_config, parse_overrides

    field = "python_wheel_task.parameters"
    argv = [_substitute(a, config_values) if isinstance(a, str) else a for a in argv]
    if not all(isinstance(a, str) for a in argv):
        add(field, "must be a list of strings (the dist-dl command line)")
        return _Command(None)
    if argv and argv[0] not in STEPS:
        # Other commands (`configs`, `jobs`, a typo) are no job task's business.
        add(field, f"runs `dist-dl {argv[0]}`, which does not parse as a step: a job task runs "
                   f"one of the steps ({', '.join(STEPS)})")
        return _Command(argv[0])
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            args = step_parser().parse_args(argv)
    except SystemExit:
        lines = captured.getvalue().strip().splitlines()
        add(field, f"`dist-dl {' '.join(argv)}` does not parse: "
                   f"{lines[-1] if lines else 'argparse exited'}")
        return _Command(None)
    # A checkpoint folder given on the command line; the loaded configuration's where it loads.
    given = [s.partition("=")[2].strip() for s in args.set or []
             if s.partition("=")[0].strip() == "train.checkpoint_dir"][-1:]
    checkpoint_dir = given[0] if given and given[0] not in ("", "null", "~") else None
    if any(_REFERENCE.search(a) for a in argv):
        # a reference left unresolved is reported where it is written
        return _Command(args.command, _known_engine(args), checkpoint_dir)
    try:
        config = load_config(PipelineConfig, args.config, parse_overrides(args.set))
    except Exception as exc:  # any configuration error, named by load_config
        add(field, f"the configuration does not load: {exc}")
        return _Command(args.command, _known_engine(args), checkpoint_dir)
    return _Command(args.command, config.train.engine, config.train.checkpoint_dir)


def _known_engine(args) -> str | None:
    """``train.engine`` as far as a command line whose whole configuration
    does not load tells it: its last ``--set train.engine=...`` on the named
    configuration; None where that is unresolved too or does not load."""
    from dist_dl.app.config import PipelineConfig, load_config, parse_overrides

    engine = [s for s in args.set or [] if s.partition("=")[0].strip() == "train.engine"][-1:]
    if any(_REFERENCE.search(s) for s in engine + [args.config or ""]):
        return None
    try:
        return load_config(PipelineConfig, args.config, parse_overrides(engine)).train.engine
    except Exception:  # the configuration's own error is reported already
        return None


def _horovod_need(command: _Command) -> tuple[str, str] | None:
    """Why a task needs Horovod and what else than a runtime with Horovod
    would do (None: it needs no Horovod)."""
    if command.step == "bench":
        return "runs `dist-dl bench`, whose baseline setups start HorovodRunner", ""
    if command.step not in _ENGINE_COMMANDS or command.engine not in ("horovod", None):
        return None
    other = (', or set train.engine to "tensorflow" or "auto" (`--set train.engine=tensorflow`) '
             'to train with tf.distribute')
    if command.engine == "horovod":
        return f'runs `dist-dl {command.step}` with train.engine "horovod"', other
    return (f"runs `dist-dl {command.step}` with a train.engine that cannot be known from the "
            f"job (a reference left unresolved, or a configuration that does not load: see its "
            f"other problems), so it may need Horovod", other)


def _tensorflow_need(command: _Command) -> tuple[str, str] | None:
    """Why a task needs TensorFlow and what else than a runtime with
    TensorFlow would do (None: it needs no TensorFlow)."""
    if command.step == "bench":
        return "runs `dist-dl bench`, whose setups train Keras models", ""
    if command.step == "search":
        return "runs `dist-dl search`, whose trials train Keras models", ""
    if command.step not in _ENGINE_COMMANDS or command.engine not in ("horovod", "tensorflow",
                                                                       None):
        return None
    other = (', or set train.engine to "torch" or "auto" (`--set train.engine=torch`) to train '
             'with PyTorch')
    if command.engine is not None:
        return f'runs `dist-dl {command.step}` with train.engine "{command.engine}"', other
    return (f"runs `dist-dl {command.step}` with a train.engine that cannot be known from the "
            f"job (a reference left unresolved, or a configuration that does not load: see its "
            f"other problems), so it may need TensorFlow", other)


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
    runtime from 13.0 to 19.0 (Scala 2.13 from 17.0), a GPU one for training
    steps, one that ships Horovod (15.4 or older) for the tasks that need
    it: ``bench``, and
    ``train`` / ``pipeline`` with ``train.engine`` "horovod"; one that
    ships TensorFlow (18.0 or older) for ``bench``, ``search``, and ``train``
    / ``pipeline`` with ``train.engine`` "horovod" or "tensorflow"; the
    cluster of a ``train`` / ``pipeline`` task with a ``train.checkpoint_dir``
    sets ``DIST_DL_CHECKPOINT_KEY`` from a secret scope (so that a retried
    task or a repaired run, on a new cluster, resumes).

    Args:
        job: A job file's path (its notebooks are looked for in notebooks/
            beside its folder), or the job as a dict (in the current folder's
            notebooks/).
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
        data, file, base = copy.deepcopy(dict(job)), source or "job", Path.cwd()
    else:
        path = Path(job)
        data, file, base = read_job(path), source or str(job), path.resolve().parent.parent
    problems: list[Problem] = []

    def add(where, message: str, task: str | None = None) -> None:
        if isinstance(where, tuple):
            owner, field = task_and_field(where)
        else:
            owner, field = None, where
        problems.append(Problem(file, task if task is not None else owner, field, message))

    from databricks.sdk.service.jobs import JobSettings

    for where, message in round_trip_losses(data, JobSettings.from_dict(data).as_dict()):
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
    gpu_tasks: dict[str, list[str]] = {}  # job cluster -> tasks that train on it
    horovod_tasks: dict[str, dict] = {}  # job cluster -> task -> why it needs Horovod
    resuming_tasks: dict[str, list[str]] = {}  # job cluster -> tasks with a checkpoint_dir
    tensorflow_tasks: dict[str, dict] = {}  # job cluster -> task -> why it needs TensorFlow
    for index, task in enumerate(tasks):
        where = ("tasks", label(task, index))
        if not isinstance(task, dict) or not isinstance(task.get("task_key"), str):
            add(where, "a task needs a task_key")
            continue
        command = _check_task(task, where, keys, clusters, values, base, add)
        gpu = [task["task_key"]] if command.step in _GPU_COMMANDS else []
        need = _horovod_need(command)
        horovod = {task["task_key"]: need} if need else {}
        need = _tensorflow_need(command)
        tensorflow = {task["task_key"]: need} if need else {}
        resumes = [task["task_key"]] if command.step in _ENGINE_COMMANDS \
            and command.checkpoint_dir else []
        gpu_tasks.setdefault(task.get("job_cluster_key"), []).extend(gpu)
        horovod_tasks.setdefault(task.get("job_cluster_key"), {}).update(horovod)
        tensorflow_tasks.setdefault(task.get("job_cluster_key"), {}).update(tensorflow)
        resuming_tasks.setdefault(task.get("job_cluster_key"), []).extend(resumes)
        if "new_cluster" in task:
            check_cluster(task["new_cluster"], where + ("new_cluster",), gpu, horovod,
                           tensorflow, add)
            check_checkpoint_key(task["new_cluster"], where + ("new_cluster",), resumes, add)
    _check_cycles(tasks, add)

    used_clusters = {t.get("job_cluster_key") for t in tasks if isinstance(t, dict)}
    for index, entry in enumerate(data.get("job_clusters") or []):
        where = ("job_clusters", label(entry, index))
        cluster_key = entry.get("job_cluster_key") if isinstance(entry, dict) else None
        if cluster_key not in used_clusters:
            add(where, f"job cluster {cluster_key!r} is defined but no task uses it")
        if isinstance(entry, dict):
            check_cluster(entry.get("new_cluster"), where + ("new_cluster",),
                           gpu_tasks.get(cluster_key, []), horovod_tasks.get(cluster_key, {}),
                           tensorflow_tasks.get(cluster_key, {}), add)
            check_checkpoint_key(entry.get("new_cluster"), where + ("new_cluster",),
                                  resuming_tasks.get(cluster_key, []), add)
    return problems


def _check_parameters(data: dict, given: Mapping[str, str], add):
    """Job parameters are declared once, with a default; returns (declared
    name -> default, the values a run would see with ``given``)."""
    declared: dict[str, str] = {}
    for index, param in enumerate(data.get("parameters") or []):
        where = ("parameters", label(param, index))
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
    for where, text, is_key in strings(data):
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
                if not SECRET_REFERENCE.match(inner):
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
                and not SECRET_REFERENCE.match(text.strip().strip("{}")):
            add(where, "names a credential, so its value must be a {{secrets/<scope>/<key>}} "
                       "reference, not a literal")
    return used


def _check_task(task: dict, where: tuple, keys: list, clusters: Mapping, values: Mapping,
                base: Path, add) -> _Command:
    """Dependencies, compute and task type of one task; returns its dist-dl
    command (its step None if it runs none)."""
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
    return _Command(None)


def _check_wheel_task(task: dict, where: tuple, values: Mapping, add) -> _Command:
    """This project's package and console script, a command line that parses
    and loads, and the wheel among the libraries."""
    wheel_task = task["python_wheel_task"]
    if wheel_task.get("package_name") != PACKAGE:
        add(where + ("python_wheel_task", "package_name"),
            f"is {wheel_task.get('package_name')!r}; this project's wheel is {PACKAGE!r}")
    if wheel_task.get("entry_point") != ENTRY_POINT:
        add(where + ("python_wheel_task", "entry_point"),
            f"is {wheel_task.get('entry_point')!r}; the job runs the console script "
            f"{ENTRY_POINT!r} (dist_dl.cli:main), which the wheel declares")
    if "named_parameters" in wheel_task:
        add(where + ("python_wheel_task", "named_parameters"),
            "dist-dl takes a command and flags: use positional `parameters`")
    if not any(isinstance(lib, dict) and isinstance(lib.get("whl"), str)
               and (lib["whl"] == WHEEL_PLACEHOLDER or WHEEL_NAME.search(lib["whl"]))
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


def edit_markers(job: Mapping, file: str) -> list[Problem]:
    """A problem for each place that still holds an ``<EDIT:...>`` value."""
    problems = []
    for where, text, _ in strings(dict(job)):
        markers = sorted(set(_EDIT_MARKER.findall(text)))
        if markers:
            task, field = task_and_field(where)
            problems.append(Problem(file, task, field, f"replace {', '.join(markers)} with your "
                                    f"value (or remove the setting if you do not need it; see "
                                    f"jobs/README.md)"))
    return problems


def load_job(path: str | os.PathLike, *, parameter_values: Mapping[str, str] | None = None):
    """Read and validate a job file and convert it to databricks-sdk's settings.

    Args:
        path: The job file.
        parameter_values: Job parameter values to validate with (see `validate()`).

    Returns:
        ``databricks.sdk.service.jobs.JobSettings``.

    Raises:
        JobFileError: The file has problems (all of them are listed).
    """
    from databricks.sdk.service.jobs import JobSettings

    problems = validate(path, parameter_values=parameter_values)
    if problems:
        raise JobFileError(problems, f"{path} has {len(problems)} problem(s):")
    return JobSettings.from_dict(read_job(Path(path)))
