# Databricks notebook source
# MAGIC %md
# MAGIC # 6. Throughput and scaling benchmark
# MAGIC
# MAGIC Run by: no job (interactive); the same step (`dist-dl bench`) is
# MAGIC `jobs/benchmark_gpu_azure.json` task `bench` and `jobs/benchmark_gpu_aws.json` task `bench`.
# MAGIC
# MAGIC Parameters (widgets): `config` (a shipped name or a YAML path; `synthetic_benchmark`
# MAGIC on Databricks), `model`, `num_workers` (of the scaled setup), `image_size`, `batch_size`
# MAGIC (per worker), `steps` (timed, per measurement), `warmup_steps` (untimed, first),
# MAGIC `rounds` (the setups repeat interleaved; medians are reported), `threads_per_worker`,
# MAGIC `output` (a JSON file for the full record; blank: none), `overrides` (more
# MAGIC `section.key=value` settings, separated by spaces, e.g. `bench.fp16_allreduce=true`).

# COMMAND ----------

from dist_dl.app.config import to_dict
from dist_dl.app.databricks import config_from_widgets, read_widgets

# Blank widgets keep the configuration's value (on Databricks: config
# synthetic_benchmark); without dbutils (a local or CI run) the tiny `local`
# values apply.
params = read_widgets({"config": "synthetic_benchmark", "model": None, "num_workers": None,
                       "image_size": None, "batch_size": None, "steps": None,
                       "warmup_steps": None, "rounds": None, "threads_per_worker": None,
                       "output": None, "overrides": ""},
                      dbutils=globals().get("dbutils"),
                      local={"model": "small_cnn", "image_size": 16, "batch_size": 16,
                             "steps": 3, "warmup_steps": 1, "rounds": 1,
                             "overrides": "bench.peer=false bench.reader_check=false"})
config = config_from_widgets(params, {
    "model": "bench.model", "num_workers": "bench.num_workers", "image_size": "bench.image_size",
    "batch_size": "bench.batch_size", "steps": "bench.steps",
    "warmup_steps": "bench.warmup_steps", "rounds": "bench.rounds",
    "threads_per_worker": "bench.threads_per_worker", "output": "bench.output"})
to_dict(config)["bench"]

# COMMAND ----------

# MAGIC %md
# MAGIC ## What is measured
# MAGIC
# MAGIC The same model trains on the same synthetic shards through the same reader in four
# MAGIC setups, run in turn and in a rotated order each round, so that a noisy neighbour
# MAGIC slows all of them alike:
# MAGIC
# MAGIC - `plain_1`: plain Keras in one process, no Horovod;
# MAGIC - `dist_1`: `train_distributed` with one worker; `dist_1 / plain_1` is what the
# MAGIC   library costs (should be close to 1);
# MAGIC - `ceiling`: `num_workers` independent plain processes, with no communication: what the
# MAGIC   hardware can do at all;
# MAGIC - `dist`: `train_distributed` with `num_workers` workers; `dist / ceiling` is the scaling
# MAGIC   efficiency, what the gradient allreduce and the synchronisation cost.
# MAGIC
# MAGIC Locally the defaults are tiny (a small CNN on 16-pixel images, 3 timed steps, one
# MAGIC round, and only the four setups above: no peer, no timing of the reader alone) so that
# MAGIC the notebook runs in the test suite; such figures say nothing about performance.
# MAGIC On Databricks use `config=synthetic_benchmark` and the benchmark job's
# MAGIC values: `model=resnet50`, `image_size=64`, `batch_size=32`, `steps=20`,
# MAGIC `warmup_steps=5`, `rounds=3`, `threads_per_worker=4`, `num_workers` = the cluster's GPU
# MAGIC count, on the benchmark job's GPU cluster.

# COMMAND ----------

from dist_dl.app import pipeline

result = pipeline.bench(config)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Reading the figures
# MAGIC
# MAGIC A scaling efficiency well below 1 means the workers wait: on the allreduce (try
# MAGIC `bench.fp16_allreduce=true`, or a larger `batch_size`, which sends the same gradient
# MAGIC for more images), or on each other and the input pipeline (compare the CPU seconds
# MAGIC per second of the setups). Across nodes, compare with a single node holding as many
# MAGIC GPUs before paying for the network (notebook 2). Record figures worth keeping in
# MAGIC `benchmarks/RESULTS.md` with the command and the machine, as its other sections do;
# MAGIC `benchmarks/train.py` runs the same measurement with more levers from a terminal.

# COMMAND ----------

# The table above is the benchmark's own report; the two ratios it is for:
overhead, scaling = result["summary"]["overhead"], result["summary"]["scaling"]
print(f"library overhead, dist_1 / plain_1: {overhead['median']:.2f}; scaling efficiency with "
      f"{config.bench.num_workers} workers, dist / ceiling: {scaling['median']:.2f} "
      f"(range {scaling['min']:.2f}-{scaling['max']:.2f} over {config.bench.rounds} rounds)")
