# Databricks notebook source
# MAGIC %md
# MAGIC # HorovodRunner with your own training code
# MAGIC
# MAGIC Run by: no job (interactive); the same launcher runs every `dist-dl train` task of
# MAGIC `jobs/training_workflow_*.json`. Parameters (widgets): `np` (workers: > 0 Spark
# MAGIC tasks, < 0 processes on the driver), `epochs`, `steps_per_epoch`, `batch_size`
# MAGIC (per worker).
# MAGIC
# MAGIC A thin shell over the `dist_dl` wheel: parameters are read once here, then the
# MAGIC training function (`dist_dl.train.smoke.train_small_cnn`: Horovod init,
# MAGIC DistributedOptimizer, broadcast from rank 0) runs on every worker.

# COMMAND ----------

from dist_dl.databricks import read_widgets

params = read_widgets({"np": 2, "epochs": 2, "steps_per_epoch": 20, "batch_size": 32},
                      dbutils=globals().get("dbutils"))
params

# COMMAND ----------

from dist_dl import HorovodRunner
from dist_dl.train.smoke import train_small_cnn

result = HorovodRunner(np=params["np"]).run(
    train_small_cnn, epochs=params["epochs"], steps_per_epoch=params["steps_per_epoch"],
    batch_size=params["batch_size"])
print(f"loss by epoch {result['history']['loss']}, {result['images_per_second']:.1f} images/s "
      f"on {result['num_workers']} workers")
