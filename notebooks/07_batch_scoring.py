# Databricks notebook source
# MAGIC %md
# MAGIC # 7. Batch scoring with the registered model, behind a promotion gate
# MAGIC
# MAGIC Run by: no job (interactive); the same steps (`dist-dl evaluate`, `dist-dl score`) are
# MAGIC `jobs/training_workflow_azure.json` tasks `evaluate` and `score`, and
# MAGIC `jobs/training_workflow_aws.json` tasks `evaluate` and `score`.
# MAGIC
# MAGIC Parameters (widgets; a blank text widget keeps the configuration file's value): `config`,
# MAGIC `registered_model_name`, `min_accuracy` (the gate), `alias` (given to a model that passes),
# MAGIC `model_uri` (score this model instead of the registered one; it is then not promoted),
# MAGIC `input` (shards or a table; blank: the validation shards), `output`, `train_if_missing`
# MAGIC (no registered version yet: train one here first; set `false` on Databricks, where the
# MAGIC training workflow registers it), `epochs` and `backend` (of that training only),
# MAGIC `overrides` (more `section.key=value` settings, separated by spaces).

# COMMAND ----------

from dist_dl.app.config import to_dict
from dist_dl.app.databricks import config_from_widgets, read_widgets

# Blank widgets keep the configuration's value; without dbutils (a local or CI
# run) the `local` values apply.
params = read_widgets({"config": "demo", "registered_model_name": None, "min_accuracy": None,
                       "alias": None, "model_uri": None, "input": None, "output": None,
                       "train_if_missing": False, "epochs": None, "backend": None,
                       "overrides": ""},
                      dbutils=globals().get("dbutils"),
                      local={"train_if_missing": True, "backend": "local"})
config = config_from_widgets(params, {
    "registered_model_name": "tracking.registered_model_name", "min_accuracy": "evaluate.min_accuracy",
    "alias": "evaluate.alias", "model_uri": "score.model_uri", "input": "score.input",
    "output": "score.output", "epochs": "train.epochs", "backend": "train.backend"})
{section: to_dict(config)[section] for section in ("tracking", "evaluate", "score")}

# COMMAND ----------

# MAGIC %md
# MAGIC ## A model to score with
# MAGIC
# MAGIC Locally nothing exists yet in a fresh folder, so this notebook prepares the `demo`
# MAGIC digits and trains and registers a small CNN first (a few epochs, two processes) to run
# MAGIC on its own. On Databricks set `config=imagenet_resnet50`, `registered_model_name` to the
# MAGIC Unity Catalog name the training workflow registers, `min_accuracy` to its gate (0.70
# MAGIC top-1), the paths to your `/Volumes/...` folders and `train_if_missing=false`: a
# MAGIC missing model is then an error rather than a ResNet50 training started from a
# MAGIC scoring notebook.

# COMMAND ----------

from dist_dl.app import pipeline
from dist_dl.read.resolve import resolve_files

try:
    resolve_files(config.data.validation_output)
except FileNotFoundError:
    print(f"no shards at {config.data.validation_output}: preparing them first")
    pipeline.prepare_data(config)

# score.model_uri, or the newest registered version (trained here first if there is none
# and train_if_missing is set; an error otherwise).
pipeline.registered_or_trained(config, train_if_missing=params["train_if_missing"])

# COMMAND ----------

# MAGIC %md
# MAGIC ## The gate: evaluate, promote
# MAGIC
# MAGIC The newest registered version is scored on the validation shards (on the executors)
# MAGIC and its accuracy logged to its run as `eval_accuracy`. Only if it reaches
# MAGIC `min_accuracy` does it get the `alias` (`champion`), which is what scoring uses; below
# MAGIC it, `GateFailed` stops this notebook as it stops the job, and the previous champion
# MAGIC keeps scoring. With `model_uri` given, that model is evaluated but nothing is promoted.

# COMMAND ----------

evaluated = pipeline.evaluate(config, model_uri=config.score.model_uri)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Score
# MAGIC
# MAGIC Each executor loads the model once and scores its partitions in batches; the result
# MAGIC (every input column but the image bytes, plus `prediction` and `probability`) is
# MAGIC written to `score.output`, a Parquet folder, or a table when the input is a table.

# COMMAND ----------

from pyspark.sql import functions as F

from dist_dl.core.session import get_spark

scored_run = pipeline.score(config)
spark = get_spark()
scored = (spark.read.parquet(scored_run["output"]) if "/" in scored_run["output"]
          else spark.table(scored_run["output"]))
scored.show(5, truncate=60)
if "label" in scored.columns:  # labelled input (the validation shards): accuracy per class
    (scored.groupBy("label")
     .agg(F.count("*").alias("images"),
          F.round(F.avg((F.col("prediction") == F.col("label")).cast("double")), 4)
          .alias("accuracy"))
     .orderBy("label").show(50))
result = {"evaluate": evaluated, "score": scored_run}
