# Databricks notebook source
# MAGIC %md
# MAGIC # HorovodRunner demo: a small CNN, data-parallel, on synthetic images
# MAGIC
# MAGIC Run by: the `dist_dl` demo (locally `make demo` runs the same code through
# MAGIC `dist-dl demo`). Parameters (widgets): `np` (workers: > 0 Spark tasks,
# MAGIC < 0 processes on the driver), `epochs`, `steps_per_epoch`, `batch_size`
# MAGIC (per worker), `output` (folder of the local MLflow store; on Databricks the
# MAGIC workspace tracking server is used when `output` is empty).
# MAGIC
# MAGIC A thin shell over the `dist_dl` wheel: parameters are read once here, then
# MAGIC one call into the library.

# COMMAND ----------

from dist_dl.config import DemoConfig
from dist_dl.databricks import read_widgets

params = read_widgets(
    {"np": 2, "epochs": 2, "steps_per_epoch": 20, "batch_size": 32, "output": "runs"},
    dbutils=globals().get("dbutils"),
)
config = DemoConfig(**params)
config

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train
# MAGIC `HorovodRunner(np=...)` starts the workers; each runs
# MAGIC `dist_dl.train.smoke.train_small_cnn` (Horovod init, DistributedOptimizer,
# MAGIC broadcast from rank 0). Rank 0's result comes back and is logged to MLflow.

# COMMAND ----------

from dist_dl.demo import run_demo

result = run_demo(config)
print(result["run_id"], result["history"]["loss"])
