"""The demo job: HorovodRunner trains a small CNN on synthetic images on a
Spark session, and the driver logs the run to MLflow. Driver side; called by
``dist-dl demo`` and the demo notebook."""
from __future__ import annotations

import os

from dist_dl.config import DemoConfig

__all__ = ["run_demo"]


def run_demo(config: DemoConfig, spark=None) -> dict:
    """Run the demo job; returns the MLflow run id, tracking URI and results."""
    import mlflow

    from dist_dl import HorovodRunner
    from dist_dl.session import get_spark
    from dist_dl.tracking.target import mlflow_target
    from dist_dl.train.smoke import train_small_cnn

    out = os.path.abspath(config.output)
    tracking_uri = f"file://{os.path.join(out, 'mlruns')}"
    spark = spark or get_spark(config.master)
    print(f"Spark {spark.version} on {spark.sparkContext.master}; {config.np} Horovod workers")
    params = dict(epochs=config.epochs, steps_per_epoch=config.steps_per_epoch,
                  batch_size=config.batch_size, image_size=config.image_size,
                  classes=config.classes, learning_rate=config.learning_rate, seed=0)
    with mlflow_target(tracking_uri, "dist_dl-demo") as experiment_id, \
            mlflow.start_run(run_name="small-cnn-synthetic", experiment_id=experiment_id) as run:
        mlflow.log_params({**params, "np": config.np, "model": "small_cnn", "data": "synthetic"})
        result = HorovodRunner(np=config.np, spark=spark).run(train_small_cnn, **params)
        for name, values in result["history"].items():
            for epoch, value in enumerate(values):
                mlflow.log_metric(name, value, step=epoch)
        mlflow.log_metric("images_per_second", result["images_per_second"])
        mlflow.log_metric("num_workers", result["num_workers"])
    history = result["history"]
    print(f"final loss {history['loss'][-1]:.4f}, accuracy {history['accuracy'][-1]:.3f}, "
          f"{result['images_per_second']:.1f} images/s on {result['num_workers']} workers")
    print(f"MLflow run {run.info.run_id} in {tracking_uri}")
    print(f"  browse: mlflow ui --backend-store-uri {tracking_uri}")
    return {"run_id": run.info.run_id, "tracking_uri": tracking_uri, **result}
