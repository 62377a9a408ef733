"""``dist-dl``: the command line. Parses arguments and calls the library."""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def _demo(args) -> int:
    import mlflow

    from dist_dl import HorovodRunner
    from dist_dl.session import get_spark
    from dist_dl.train.smoke import train_small_cnn

    out = os.path.abspath(args.output)
    tracking_uri = f"file://{os.path.join(out, 'mlruns')}"
    spark = get_spark(args.master)
    print(f"Spark {spark.version} on {spark.sparkContext.master}; {args.np} Horovod workers")
    params = dict(epochs=args.epochs, steps_per_epoch=args.steps, batch_size=args.batch_size,
                  image_size=args.image_size, classes=4, learning_rate=0.01, seed=0)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("dist_dl-demo")
    with mlflow.start_run(run_name="small-cnn-synthetic") as run:
        mlflow.log_params({**params, "np": args.np, "model": "small_cnn", "data": "synthetic"})
        result = HorovodRunner(np=args.np, spark=spark).run(train_small_cnn, **params)
        for name, values in result["history"].items():
            for epoch, value in enumerate(values):
                mlflow.log_metric(name, value, step=epoch)
        mlflow.log_metric("images_per_second", result["images_per_second"])
        mlflow.log_metric("num_workers", result["num_workers"])
    print(f"final loss {result['history']['loss'][-1]:.4f}, "
          f"accuracy {result['history']['accuracy'][-1]:.3f}, "
          f"{result['images_per_second']:.1f} images/s on {result['num_workers']} workers")
    print(f"MLflow run {run.info.run_id} in {tracking_uri}")
    print(f"  browse: {sys.executable} -m mlflow ui --backend-store-uri {tracking_uri}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dist-dl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small CNN on synthetic images with "
                                       "HorovodRunner on a local Spark session, log to MLflow")
    demo.add_argument("--np", type=int, default=2, help="workers (>0 Spark tasks, <0 local processes)")
    demo.add_argument("--master", default="local[2]", help="Spark master URL")
    demo.add_argument("--epochs", type=int, default=3)
    demo.add_argument("--steps", type=int, default=30, help="steps per epoch")
    demo.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    demo.add_argument("--image-size", type=int, default=32)
    demo.add_argument("--output", default="runs", help="folder for the MLflow store")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
