"""``dist-dl``: the command line. Parses arguments and calls the library.

Every step takes a configuration (``--config``: a YAML file, or the name of
one shipped in ``conf/``) and ``--set section.key=value`` overrides, so a job
definition, a notebook and a terminal run the same step the same way:

    dist-dl prepare-data --config imagenet_resnet50 --set data.output=/Volumes/x
    dist-dl train --config demo --set train.epochs=2
"""
from __future__ import annotations

import argparse
import sys

from dist_dl.app.databricks.jobs import add_jobs_command
from dist_dl.app.steps import STEPS, add_steps

__all__ = ["main", "build_parser", "STEPS"]  # STEPS: dist_dl.app.steps, kept here for callers


def _load(args):
    from dist_dl.app.config import PipelineConfig, load_config, parse_overrides

    return load_config(PipelineConfig, args.config, parse_overrides(args.set))


def _step(function: str):
    def run(args) -> int:
        from dist_dl.app import pipeline

        getattr(pipeline, function)(_load(args), master=args.master)
        return 0

    return run


def _configs(args) -> int:
    from dist_dl.app.config import PipelineConfig, config_names, config_path, load_config, to_dict

    if args.name is None:
        for name in config_names():
            print(f"{name:24s} {config_path(name)}")
        return 0
    import yaml

    print(yaml.safe_dump(to_dict(load_config(PipelineConfig, args.name,
                                             _overrides(args.set))), sort_keys=False))
    return 0


def _overrides(items):
    from dist_dl.app.config import parse_overrides

    return parse_overrides(items)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dist-dl", description="Distributed deep learning on Spark.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_steps(sub, _step)
    add_jobs_command(sub)

    configs = sub.add_parser("configs", help="list the shipped configurations, or print one "
                                             "with its defaults filled in")
    configs.add_argument("name", nargs="?", help="a configuration name or YAML path")
    configs.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    configs.set_defaults(func=_configs)

    return parser


def main(argv: list[str] | None = None) -> int:
    from dist_dl.core.quiet import quiet_defaults

    quiet_defaults()  # before TensorFlow, MLflow or Spark's JVM start
    from dist_dl.app.pipeline import GateFailed
    from dist_dl.train import TrainingFailed

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: one clear line, not a traceback (the message names the fix).
        parser.exit(2, f"dist-dl {args.command}: error: {exc}\n")
    except (GateFailed, TrainingFailed) as exc:
        parser.exit(1, f"dist-dl {args.command}: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
