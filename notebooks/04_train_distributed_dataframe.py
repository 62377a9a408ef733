# Databricks notebook source
# MAGIC %md
# MAGIC # 4. `train_distributed(df)` inside a Spark pipeline
# MAGIC
# MAGIC Run by: no job (interactive); the same training step, on shards instead of a DataFrame,
# MAGIC is `jobs/training_workflow_azure.json` task `train` and
# MAGIC `jobs/training_workflow_aws.json` task `train`.
# MAGIC
# MAGIC Parameters (widgets): `config` (a shipped name or a YAML path; its `train` and
# MAGIC `tracking` sections are used), `train_images` and `new_images` (folders of
# MAGIC `<label>/<image>` files; blank: scikit-learn's digits written under
# MAGIC `<train.output_dir>/digits`),
# MAGIC `num_workers`, `backend` (`spark`: Spark tasks; `local`: processes on the driver),
# MAGIC `epochs`, `overrides` (more `section.key=value` settings, separated by spaces).

# COMMAND ----------

from dist_dl.app.config import to_dict
from dist_dl.app.databricks import config_from_widgets, read_widgets

# Blank widgets keep the configuration's value; without dbutils (a local or CI
# run) the `local` values apply.
params = read_widgets({"config": "demo", "train_images": "", "new_images": "",
                       "num_workers": None, "backend": None, "epochs": None, "overrides": ""},
                      dbutils=globals().get("dbutils"), local={"epochs": 2})
config = config_from_widgets(params, {"num_workers": "train.num_workers",
                                      "backend": "train.backend", "epochs": "train.epochs"})
to_dict(config)["train"]

# COMMAND ----------

# MAGIC %md
# MAGIC ## Images as a DataFrame
# MAGIC
# MAGIC Spark's `binaryFile` source reads a folder of image files as rows: `path`,
# MAGIC `modificationTime`, `length` and the raw bytes in `content`. Locally the folders are
# MAGIC scikit-learn's handwritten digits, written here as JPEG files in class folders
# MAGIC (`train` to learn from, `val` standing in for new images). On Databricks point
# MAGIC `train_images` and `new_images` at your own `/Volumes/...` folders (or replace the
# MAGIC `binaryFile` read with `spark.table(...)` of a table holding bytes or paths).

# COMMAND ----------

import os

from dist_dl.core.locations import local_path
from dist_dl.prepare import write_digits_tree
from dist_dl.core.session import get_spark

spark = get_spark()
train_images, new_images = params["train_images"], params["new_images"]
if not train_images or not new_images:
    # Under train.output_dir, which the executors must see too (on a cluster a
    # /dbfs/... or /Volumes/... folder); absolute, as Spark resolves relative
    # paths against its own working directory.
    sample_train, sample_new = write_digits_tree(
        os.path.join(local_path(config.train.output_dir), "digits"),
        image_size=config.train.image_size)
    train_images, new_images = train_images or sample_train, new_images or sample_new
print(f"training images: {train_images}\nnew images: {new_images}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Transform it with Spark, as any other pipeline step
# MAGIC
# MAGIC The label is the name of the image's folder. Files that are not images or are empty
# MAGIC are filtered out here, as one more pipeline step: `train_distributed` checks its input
# MAGIC on the driver and refuses undecodable images (naming them) rather than train on them.

# COMMAND ----------

from pyspark.sql import functions as F


def images(folder):
    return (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder)
            .withColumn("label", F.regexp_extract("path", r"/([^/]+)/[^/]+$", 1))
            .filter(F.lower("path").rlike(r"\.(jpe?g|png)$") & (F.col("length") > 0)))


train_df = images(train_images)
new_df = images(new_images)
train_df.groupBy("label").count().orderBy("label").show()

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train on all workers
# MAGIC
# MAGIC `train_distributed` writes the DataFrame as image shards once (reused by later calls
# MAGIC on the same files), holds out `train.validation_fraction` of the rows for validation,
# MAGIC starts `num_workers` workers (here Spark tasks, as on a cluster), logs the run
# MAGIC to MLflow and returns a `TrainedModel`. Bad settings or data fail here, on the driver,
# MAGIC before any worker starts. `train.engine` (`engine=`) chooses the workers: `auto` takes
# MAGIC Horovod where it imports and tf.distribute elsewhere (Runtime 16.0 ML and later ship no
# MAGIC Horovod); `train.engine=tensorflow` in `overrides` asks for tf.distribute anywhere.

# COMMAND ----------

from dist_dl import train_distributed

trained = train_distributed(train_df, config=config.train, image_col="content",
                            label_col="label", tracking_uri=config.tracking.tracking_uri,
                            experiment_name=config.tracking.experiment_name)
print(f"MLflow run {trained.run_id} in {trained.tracking_uri}, {trained.num_workers} workers; "
      "last epoch: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(trained.metrics.items())))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Score new images with `transform`
# MAGIC
# MAGIC `trained.transform(df)` adds the predicted class index and its probability, computed
# MAGIC on the executors (a pandas UDF per partition); the result is an ordinary DataFrame to
# MAGIC join, filter or write like any other. The class index becomes the label name through a
# MAGIC small lookup DataFrame of `trained.class_names`.

# COMMAND ----------

class_names = spark.createDataFrame(list(enumerate(trained.class_names)),
                                    "prediction long, predicted_label string")
scored = trained.transform(new_df).join(F.broadcast(class_names), "prediction")
scored.select("path", "label", "predicted_label", "probability").show(5, truncate=60)
summary = scored.agg(F.count("*").alias("images"),
                     F.avg((F.col("predicted_label") == F.col("label")).cast("double"))
                     .alias("accuracy")).first()
print(f"accuracy on {summary['images']} new images: {summary['accuracy']:.4f}")
result = {"trained": trained, "new_images": summary["images"], "accuracy": summary["accuracy"]}
