"""``dist-dl``: the command line. Parses arguments and calls the library."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args) -> int:
    from dist_dl.config import DemoConfig, load_config
    from dist_dl.demo import run_demo

    overrides = {"np": args.np, "master": args.master, "epochs": args.epochs,
                 "steps_per_epoch": args.steps, "batch_size": args.batch_size,
                 "image_size": args.image_size, "output": args.output}
    run_demo(load_config(DemoConfig, args.config, overrides))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dist-dl", description="Distributed deep learning on Spark.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small CNN on synthetic images with "
                                       "HorovodRunner on a local Spark session, log to MLflow")
    demo.add_argument("--config", help="YAML file of DemoConfig keys (e.g. conf/demo.yaml); "
                                       "flags override it")
    demo.add_argument("--np", type=int, help="workers (>0 Spark tasks, <0 local processes); default 2")
    demo.add_argument("--master", help="Spark master URL; default local[2]")
    demo.add_argument("--epochs", type=int)
    demo.add_argument("--steps", type=int, help="steps per epoch")
    demo.add_argument("--batch-size", type=int, help="per-worker batch size")
    demo.add_argument("--image-size", type=int)
    demo.add_argument("--output", help="folder for the MLflow store; default runs")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
