# Databricks notebook source
# MAGIC %md
# MAGIC # 3. HorovodRunner with your own training code
# MAGIC
# MAGIC Run by: no job (interactive); the same launcher starts the workers of
# MAGIC `jobs/training_workflow_azure.json` task `train` and
# MAGIC `jobs/training_workflow_aws.json` task `train`.
# MAGIC
# MAGIC Parameters (widgets): `np` (workers: > 0 Spark tasks, < 0 processes on the driver),
# MAGIC `epochs`, `steps_per_epoch`, `batch_size` (per worker), `driver_log_verbosity`
# MAGIC (`log_callback_only`: only `log_to_driver` messages reach this output; `all`: every
# MAGIC line of every worker), `timeout` (seconds; 0: none).

# COMMAND ----------

from dist_dl.app.databricks import read_widgets

params = read_widgets({"np": 2, "epochs": 2, "steps_per_epoch": 20, "batch_size": 32,
                       "driver_log_verbosity": "log_callback_only", "timeout": 600},
                      dbutils=globals().get("dbutils"))
params

# COMMAND ----------

# MAGIC %md
# MAGIC ## The training function
# MAGIC
# MAGIC This is the pattern for your own code: a function that calls `hvd.init()`, builds its
# MAGIC data and model, wraps the optimizer in `hvd.DistributedOptimizer` (gradients averaged
# MAGIC by allreduce on every step), scales the learning rate by `hvd.size()` (the global
# MAGIC batch grows with the workers) and broadcasts rank 0's initial weights so every worker
# MAGIC starts identical. It is shipped to every worker; what rank 0 returns comes back here.
# MAGIC It lives in the wheel (`dist_dl.train.smoke`), not in this notebook, so that tests
# MAGIC import and check it; its source is printed below as the template to copy.

# COMMAND ----------

import inspect

from dist_dl.train.smoke import train_small_cnn

print(inspect.getsource(train_small_cnn))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Run it on the workers
# MAGIC
# MAGIC Locally `np=2` starts two tasks of the embedded `local[2]` Spark, as a cluster would;
# MAGIC `np=-2` two processes on this machine instead (no Spark job: seconds sooner, and on a
# MAGIC multi-GPU node the way to use its GPUs, see notebook 2). On a Databricks ML runtime
# MAGIC that ships `sparkdl.HorovodRunner` (15.4 LTS ML and earlier), `np > 0` is delegated to
# MAGIC it: set `np` to the cluster's GPU count (workers x GPUs each).
# MAGIC
# MAGIC A worker that raises makes `run` raise `WorkerError` here, naming the rank and carrying
# MAGIC its traceback; `timeout` ends a stuck job with `JobTimeout`. Either way no worker
# MAGIC process is left running.

# COMMAND ----------

from dist_dl import HorovodRunner

runner = HorovodRunner(np=params["np"], driver_log_verbosity=params["driver_log_verbosity"],
                       timeout=params["timeout"] or None)
result = runner.run(train_small_cnn, epochs=params["epochs"],
                    steps_per_epoch=params["steps_per_epoch"], batch_size=params["batch_size"])

for epoch, (loss, accuracy) in enumerate(zip(result["history"]["loss"],
                                             result["history"]["accuracy"]), start=1):
    print(f"epoch {epoch}: loss {loss:.4f}, accuracy {accuracy:.4f} (averaged over workers)")
print(f"{result['images_per_second']:.1f} images/s on {result['num_workers']} workers, "
      f"{result['seconds']:.1f} s of training")
