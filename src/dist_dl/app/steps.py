"""The steps of a job as ``dist-dl`` commands: their names, the function of
`dist_dl.app.pipeline` each runs, and their options.

Below both the command line (`dist_dl.app.cli`) and job validation
(`dist_dl.app.databricks.jobs`), which parses a job task's parameters with
`step_parser()` exactly as the console script would: neither imports the
other.
"""
from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["STEPS", "add_steps", "step_parser"]

# Command -> (function in dist_dl.app.pipeline, help).
STEPS = {
    "prepare-data": ("prepare_data", "write image shards (Parquet or Delta) from a folder tree, "
                                     "a table, or synthetic/sample images"),
    "train": ("train", "train_distributed on the shards of the data section"),
    "evaluate": ("evaluate", "accuracy of a logged model on the validation shards; promote it "
                             "(registry alias) if it passes"),
    "score": ("score", "batch-score images with a logged model on the executors"),
    "bench": ("bench", "throughput and scaling benchmark of data-parallel training"),
    "ensemble": ("ensemble", "one random forest per Spark partition, combined"),
    "search": ("search", "parallel hyperparameter trials of the train settings"),
    "pipeline": ("run_pipeline", "prepare-data, train, evaluate and score in one go "
                                 "(what `make demo` runs)"),
}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="YAML file, or the name of a shipped one (see `dist-dl configs`); "
                             "default: every section's defaults")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting (repeatable), e.g. --set train.epochs=3")


def add_steps(subparsers, handler: Callable[[str], Callable] | None = None) -> None:
    """Add one subcommand per step to a ``dist-dl`` parser.

    Args:
        subparsers: What ``parser.add_subparsers()`` returned.
        handler: Given the step's pipeline function name, returns the
            subcommand's ``func(args) -> exit code``; None: no ``func``.
    """
    for command, (function, text) in STEPS.items():
        step = subparsers.add_parser(command, help=text, description=text)
        _add_config_options(step)
        step.add_argument("--master", default=None,
                          help="Spark master URL when no session is active (default local[2]; "
                               "on Databricks the cluster's session is used)")
        if handler is not None:
            step.set_defaults(func=handler(function))


def step_parser() -> argparse.ArgumentParser:
    """A ``dist-dl`` parser of the steps alone: what a job task may run."""
    parser = argparse.ArgumentParser(prog="dist-dl")
    add_steps(parser.add_subparsers(dest="command", required=True))
    return parser
