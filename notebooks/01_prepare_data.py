# Databricks notebook source
# MAGIC %md
# MAGIC # 1. Prepare data: images to Parquet or Delta shards
# MAGIC
# MAGIC Run by: no job (interactive); the same step (`dist-dl prepare-data`) is
# MAGIC `jobs/training_workflow_azure.json` task `prepare` and
# MAGIC `jobs/training_workflow_aws.json` task `prepare`.
# MAGIC
# MAGIC Parameters (widgets; a blank text widget keeps the configuration file's value): `config` (a
# MAGIC shipped name or a YAML path), `source` (`folder`, `table`, `synthetic`,
# MAGIC `sklearn_digits`), `train_dir`, `val_dir`, `val_labels_file` (folder source), `table`
# MAGIC (table source), `output` (shards go to `<output>/train` and `<output>/validation`),
# MAGIC `format` (`parquet` or `delta`), `on_bad_image` (`fail` or `skip`), `overrides`
# MAGIC (more `section.key=value` settings, separated by spaces).

# COMMAND ----------

from dist_dl.app.config import to_dict
from dist_dl.app.databricks import config_from_widgets, read_widgets

# Blank widgets keep the configuration's value; without dbutils (a local or CI
# run) the `local` values apply.
params = read_widgets({"config": "demo", "source": None, "train_dir": None, "val_dir": None,
                       "val_labels_file": None, "table": None, "output": None, "format": None,
                       "on_bad_image": None, "overrides": ""},
                      dbutils=globals().get("dbutils"))
config = config_from_widgets(params, {
    "source": "data.source", "train_dir": "data.train_dir", "val_dir": "data.val_dir",
    "val_labels_file": "data.val_labels_file", "table": "data.table", "output": "data.output",
    "format": "data.format", "on_bad_image": "data.on_bad_image"})
to_dict(config)["data"]

# COMMAND ----------

# MAGIC %md
# MAGIC ## Write the shards
# MAGIC
# MAGIC Locally the `demo` configuration turns scikit-learn's 1,797 handwritten digits
# MAGIC (bundled with it, so nothing is downloaded) into an ImageNet-style folder tree and
# MAGIC writes that as Parquet shards under `runs/shards`. On Databricks set `config` to
# MAGIC `imagenet_resnet50` and `train_dir`, `val_dir`, `val_labels_file` and `output` to your
# MAGIC `/Volumes/...` paths: the same call then writes ImageNet as a Delta table.
# MAGIC
# MAGIC Reading, decoding, converting and re-encoding the images runs in Spark tasks; the
# MAGIC driver lists the inputs and checks labels before any task starts. Nothing is lost
# MAGIC silently: every input row is either written or counted as skipped with its reason
# MAGIC (`on_bad_image=skip`), and with `on_bad_image=fail` one bad image stops the write
# MAGIC before anything is committed, naming the file.

# COMMAND ----------

import pandas as pd

from dist_dl.app import pipeline

result = pipeline.prepare_data(config)

summaries = pd.DataFrame([{"split": split, **result[split]} for split in ("train", "validation")
                          if result[split] is not None]).set_index("split")
print(summaries[["rows_in", "rows_written", "rows_skipped", "skipped_by_reason", "classes",
                 "format", "output"]].to_string())

# COMMAND ----------

# MAGIC %md
# MAGIC ## What a shard holds
# MAGIC
# MAGIC Every shard has the same columns whichever source wrote it (`dist_dl.prepare.schema`):
# MAGIC the encoded JPEG (`image`), the label index and name, where the row came from, and the
# MAGIC stored size. The label index (`_labels.json`) and the summary (`_summary.json`) sit
# MAGIC beside the data. The files are read through `resolve_files`, which for a Delta table
# MAGIC lists exactly the files of its current version, so this works without Delta's Spark jars.

# COMMAND ----------

from dist_dl.read.resolve import resolve_files
from dist_dl.core.session import get_spark

spark = get_spark()
shards = spark.read.parquet(*resolve_files(config.data.train_output))
shards.printSchema()
shards.groupBy("label", "label_name").count().orderBy("label").show(20, truncate=False)

# COMMAND ----------

# MAGIC %md
# MAGIC ## A few stored images
# MAGIC
# MAGIC Decoded from the shard bytes as the training reader will see them (before its crops
# MAGIC and resizing), to check that labels and pictures agree.

# COMMAND ----------

import io

import matplotlib.pyplot as plt
from PIL import Image

samples = shards.select("image", "label_name", "height", "width").limit(8).collect()
figure, axes = plt.subplots(1, len(samples), figsize=(2 * len(samples), 2.4), squeeze=False)
for ax, row in zip(axes[0], samples):
    picture = Image.open(io.BytesIO(row["image"]))
    ax.imshow(picture)
    ax.set_title(f"{row['label_name']} ({picture.width}x{picture.height})")
    ax.axis("off")
print("labels of the images shown:", [row["label_name"] for row in samples])
figure
