# Databricks notebook source
# MAGIC %md
# MAGIC # 8. PyTorch DistributedDataParallel on TorchDistributor
# MAGIC
# MAGIC Run by: no job (interactive).
# MAGIC
# MAGIC Parameters (widgets): `shards` (a folder of image shards with `train` and
# MAGIC `validation` inside, as notebook 1 writes them; blank: scikit-learn's digits are
# MAGIC prepared here), `num_processes` (processes in all), `local_mode` (`true`: processes on
# MAGIC this driver; `false`: Spark tasks), `use_gpu`, `epochs`, `batch_size` (per process),
# MAGIC `timeout` (seconds; 0: none).
# MAGIC
# MAGIC Code written for pyspark's `TorchDistributor` runs on `dist_dl.TorchDistributor` with
# MAGIC only the import changed. What it adds: task slots (and GPUs) checked before the job
# MAGIC starts, the failing rank named with its host and traceback, `timeout`, no process left
# MAGIC on any host, every process's output here with its rank. Runtimes 16.4 and 17.3 LTS ML
# MAGIC and later ship PyTorch; on a GPU cluster set `spark.task.resource.gpu.amount` and
# MAGIC `use_gpu=true`.

# COMMAND ----------

from dist_dl.app.databricks import read_widgets

params = read_widgets({"shards": "", "num_processes": 2, "local_mode": False, "use_gpu": False,
                       "epochs": 6, "batch_size": 32, "timeout": 900},
                      dbutils=globals().get("dbutils"))
params

# COMMAND ----------

# MAGIC %md
# MAGIC ## The shards
# MAGIC
# MAGIC Without a `shards` folder, scikit-learn's 1,797 digits (real images, no download) are
# MAGIC written as JPEGs and prepared into Parquet shards here, under `./runs` (on a cluster, a
# MAGIC `/dbfs/...` or `/Volumes/...` folder that every executor sees).

# COMMAND ----------

import os

from dist_dl.core.session import get_spark
from dist_dl.prepare import ShardConfig, prepare_image_dataset, write_digits_tree

spark = get_spark()
shards = params["shards"]
IMAGE_SIZE = 16  # scikit-learn's digits are 8 x 8 pixels
if not shards:
    shards = os.path.abspath(os.path.join("runs", "torch_digits"))
    train_images, val_images = write_digits_tree(os.path.join(shards, "_images"), image_size=IMAGE_SIZE)
    for split, images in (("train", train_images), ("validation", val_images)):
        # Row groups of 128 images: the readers give whole row groups to the
        # processes, so each needs at least one of the 363 validation images'.
        summary = prepare_image_dataset(os.path.join(shards, split), image_dir=images,
                                        mode="overwrite", spark=spark,
                                        config=ShardConfig(rows_per_row_group=128),
                                        label_index=(None if split == "train"
                                                     else os.path.join(shards, "train")))
        print(f"{split}: {summary.rows_written} images -> {summary.output}")
train_url, validation_url = os.path.join(shards, "train"), os.path.join(shards, "validation")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The training function
# MAGIC
# MAGIC Plain PyTorch: `init_process_group` (torchrun's variables are set for every process),
# MAGIC `DistributedDataParallel`, and the library's reader, `dist_dl.read.make_loader`, which
# MAGIC gives each rank its part of the shards (the same number of steps on every rank; every
# MAGIC validation row exactly once across the ranks) as uint8 batches that the model
# MAGIC normalises on its device. It lives in the wheel (`dist_dl.train.smoke_torch`) so that
# MAGIC tests run it; its source is printed below as the template to copy.

# COMMAND ----------

import inspect

from dist_dl.train.smoke_torch import train_small_cnn_torch

print(inspect.getsource(train_small_cnn_torch))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Run it
# MAGIC
# MAGIC `run(function, *args, **kwargs)` returns what rank 0's function returned; a script
# MAGIC path with its command-line arguments works too, as with pyspark's.

# COMMAND ----------

from dist_dl import TorchDistributor

distributor = TorchDistributor(num_processes=params["num_processes"],
                               local_mode=params["local_mode"], use_gpu=params["use_gpu"],
                               timeout=params["timeout"] or None)
result = distributor.run(train_small_cnn_torch, train_url, validation_url, image_size=IMAGE_SIZE,
                         epochs=params["epochs"], batch_size=params["batch_size"])

for epoch, (loss, accuracy) in enumerate(zip(result["history"]["loss"],
                                             result["history"]["val_accuracy"]), start=1):
    print(f"epoch {epoch}: loss {loss:.4f}, validation accuracy {accuracy:.4f}")
print(f"{result['validation_rows']} validation rows, {result['num_workers']} processes, "
      f"{result['images_per_second']:.0f} images/s, {result['seconds']:.1f} s of training")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The same with `train_distributed(engine="torch")`
# MAGIC
# MAGIC One call instead of a training function of your own: the library's torch engine
# MAGIC trains its `small_cnn` (or `resnet50`, or a builder returning an `nn.Module`) with
# MAGIC DistributedDataParallel on the same shards, with the learning-rate warm-up and
# MAGIC schedule, exact validation, signed checkpoints with resume and retries, and the MLflow
# MAGIC run and model (for `transform` and `score_dataframe`, and as MLflow's pytorch flavour).
# MAGIC On a GPU cluster it runs one process per GPU with NCCL and bf16; `decode="gpu"`
# MAGIC decodes the JPEGs on the GPUs.

# COMMAND ----------

from dist_dl import train_distributed

trained = train_distributed(train_url, validation=validation_url, engine="torch",
                            backend="local" if params["local_mode"] else "spark",
                            num_workers=params["num_processes"], model="small_cnn",
                            image_size=IMAGE_SIZE, augment=False, epochs=10, learning_rate=0.1,
                            warmup_epochs=1, batch_size=params["batch_size"],
                            timeout=params["timeout"] or None)
print(f"MLflow run {trained.run_id}: " + ", ".join(
    f"{k} {v:.4g}" for k, v in sorted(trained.metrics.items())))
result["train_distributed_val_accuracy"] = trained.metrics["val_accuracy"]
