"""``dist-dl jobs validate | deploy | run``: the command line of the jobs
package (``dist_dl.app.cli`` adds it to ``dist-dl``; ``python -m
dist_dl.app.databricks.jobs`` runs it alone)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dist_dl.app.databricks.jobs.errors import JobFileError, JobsError, Problem
from dist_dl.app.databricks.jobs.runs import run
from dist_dl.app.databricks.jobs.validation import (default_job_files, edit_markers, read_job,
                                                    validate)
from dist_dl.app.databricks.jobs.workspace import deploy

__all__ = ["add_jobs_command", "main"]


def _cmd_validate(args) -> int:
    files = [Path(f) for f in args.files] or default_job_files()
    if not files:
        where = "jobs/ holds no *.json" if Path("jobs").is_dir() else \
            f"no jobs/ folder in {Path.cwd()}"
        print(f"dist-dl jobs validate: error: no job files: {where} (run it in the project's "
              f"folder, or give FILES)", file=sys.stderr)
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
        markers = edit_markers(read_job(file), str(file))
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
    push.add_argument("--wheel", required=True, metavar="PATH",
                      help="the built wheel: `make wheel` in a checkout writes it to dist/ "
                           "(or `python -m build --wheel`)")
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
    """``dist-dl jobs ...`` on its own, without the steps' commands.

    Args:
        argv: Arguments after the program name, e.g. ``["jobs", "validate"]``.

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(prog="dist-dl")
    add_jobs_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
