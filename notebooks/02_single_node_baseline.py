# Databricks notebook source
# MAGIC %md
# MAGIC # 2. A single-node baseline: one process, one GPU (or the CPU)
# MAGIC
# MAGIC Run by: no job (interactive); no job runs a baseline: it is the measurement to take
# MAGIC before deciding to scale (notebooks 3, 4 and 6).
# MAGIC
# MAGIC Parameters (widgets): `config` (a shipped name or a YAML path), `epochs`, `batch_size`,
# MAGIC `learning_rate` (for one worker), `overrides` (more `section.key=value` settings,
# MAGIC separated by spaces). The shards are the `data` section's; if they are missing they
# MAGIC are prepared first (notebook 1).

# COMMAND ----------

from dist_dl.app.config import to_dict
from dist_dl.app.databricks import config_from_widgets, read_widgets

# Blank widgets keep the configuration's value; without dbutils (a local or CI
# run) the `local` values apply.
params = read_widgets({"config": "demo", "epochs": None, "batch_size": None,
                       "learning_rate": None, "overrides": ""},
                      dbutils=globals().get("dbutils"), local={"epochs": 2})
config = config_from_widgets(params, {"epochs": "train.epochs", "batch_size": "train.batch_size",
                                      "learning_rate": "train.learning_rate"})
to_dict(config)["train"]

# COMMAND ----------

# MAGIC %md
# MAGIC ## The data
# MAGIC
# MAGIC Locally: the `demo` configuration's 16-pixel digits under `runs/shards`. On
# MAGIC Databricks set `config` to `imagenet_resnet50` (and `epochs`, `batch_size`,
# MAGIC `learning_rate` to what you want measured; a few epochs are enough for throughput) on a
# MAGIC single-node GPU cluster; prepare ImageNet with the `prepare` task of the training
# MAGIC workflow first rather than from here, since that runs on a CPU cluster.

# COMMAND ----------

from dist_dl.app import pipeline
from dist_dl.read.resolve import resolve_files

try:
    resolve_files(config.data.train_output)
except FileNotFoundError:
    print(f"no shards at {config.data.train_output}: preparing them first")
    pipeline.prepare_data(config)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train in this process
# MAGIC
# MAGIC `train_single` uses the same shard reader, model registry and learning-rate schedule
# MAGIC as the data-parallel loop, without Horovod, so this run and a distributed run of the
# MAGIC same configuration differ only in the number of workers: their throughputs compare.

# COMMAND ----------

import pandas as pd

from dist_dl.train.single import train_single

result = train_single(config.train, config.data.train_output, config.data.validation_output)

history = pd.DataFrame(result["history"])
history.index = history.index + 1  # epochs counted from 1, as in the training log
print(history.rename_axis("epoch").to_string())
print(f"\nvalidation accuracy {result['val_accuracy']:.4f}; "
      f"{result['images_per_second']:.0f} training images/s on one worker")
# What the rate means for a full ResNet50 run: ImageNet has 1,281,167 training
# images, and 90 epochs reach the usual accuracy (Goyal et al. 2017). Only an
# estimate when this run used the imagenet_resnet50 configuration.
hours_per_epoch = 1_281_167 / result["images_per_second"] / 3600
print(f"at this rate one ImageNet epoch would take {hours_per_epoch:.1f} h and 90 epochs "
      f"{90 * hours_per_epoch / 24:.1f} days")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Before scaling out, scale up
# MAGIC
# MAGIC When the figure above is too slow, take the steps in this order; each costs less
# MAGIC communication than the next.
# MAGIC
# MAGIC 1. **A bigger GPU on the same single node** (an A100 instead of a T4, with
# MAGIC    `train.mixed_precision: auto`): no code change and no communication at all.
# MAGIC 2. **More GPUs in one node**: `HorovodRunner(np=-4)` for your own training function
# MAGIC    (notebook 3), or `train.backend=local` with `train.num_workers=4` for
# MAGIC    `train_distributed`. The workers are processes on the driver machine; the gradient
# MAGIC    allreduce of every step stays inside the node (NVLink or PCIe, with NCCL), and
# MAGIC    no Spark job has to start them: `benchmarks/RESULTS.md` (launcher) measured 0.24 s
# MAGIC    to start two local workers against 7.9 s for two Spark tasks.
# MAGIC 3. **Only then more nodes** (`HorovodRunner(np=8)`, `train.backend=spark`): every step
# MAGIC    now averages the whole gradient over the network (about 100 MB for ResNet50 in
# MAGIC    float32), and the slowest worker sets the pace for all of them. Scaling efficiency
# MAGIC    (throughput of n workers divided by n times one worker's) falls below 1 as a result:
# MAGIC    measure it for your model and cluster with notebook 6 (`dist-dl bench`, whose
# MAGIC    figures go to `benchmarks/RESULTS.md`) before paying for the nodes.
# MAGIC
# MAGIC More workers also mean a larger global batch (`batch_size` per worker times workers);
# MAGIC the learning rate is scaled with it and warmed up (`train.warmup_epochs`), which keeps
# MAGIC accuracy for ResNet50 up to a global batch of 8,192 (Goyal et al. 2017), not beyond
# MAGIC without other changes.
