# Databricks notebook source
# MAGIC %md
# MAGIC # 5. Many independent models: ensembles and hyperparameter search
# MAGIC
# MAGIC Run by: no job (interactive); the ensemble step (`dist-dl ensemble`) is
# MAGIC `jobs/ensemble_cpu_azure.json` task `ensemble` and `jobs/ensemble_cpu_aws.json`
# MAGIC task `ensemble`;
# MAGIC no job runs the search (`dist-dl search`).
# MAGIC
# MAGIC Parameters (widgets): `config` (a shipped name or a YAML path); ensemble: `source`
# MAGIC (`sklearn_digits`, `sklearn_wine`, `sklearn_breast_cancer`, or `table`; blank keeps
# MAGIC the file's), `table`, `label_col` (blank keeps the file's), `num_models`, `n_estimators`,
# MAGIC `combine` (`vote` or `mean`); search: `max_trials`, `max_concurrent`, `trial_epochs`,
# MAGIC `max_steps_per_epoch`; `overrides` (more `section.key=value` settings, separated by
# MAGIC spaces, e.g. `search.algorithm=random`).

# COMMAND ----------

from dist_dl.app.config import to_dict
from dist_dl.app.databricks import config_from_widgets, read_widgets

# Blank widgets keep the configuration's value; without dbutils (a local or CI
# run) the `local` values apply.
params = read_widgets({"config": "demo", "source": None, "table": None, "label_col": None,
                       "num_models": None, "n_estimators": None, "combine": None,
                       "max_trials": None, "max_concurrent": None, "trial_epochs": None,
                       "max_steps_per_epoch": None, "overrides": ""},
                      dbutils=globals().get("dbutils"),
                      local={"n_estimators": 20, "max_trials": 4, "trial_epochs": 3,
                             "max_steps_per_epoch": 15})
config = config_from_widgets(params, {
    "source": "ensemble.source", "table": "ensemble.table", "label_col": "ensemble.label_col",
    "num_models": "ensemble.num_models", "n_estimators": "ensemble.n_estimators",
    "combine": "ensemble.combine", "max_trials": "search.max_trials",
    "max_concurrent": "search.max_concurrent", "trial_epochs": "search.epochs",
    "max_steps_per_epoch": "search.max_steps_per_epoch"})
{"ensemble": to_dict(config)["ensemble"], "search": to_dict(config)["search"]}

# COMMAND ----------

# MAGIC %md
# MAGIC ## Which pattern, and why
# MAGIC
# MAGIC Notebooks 3 and 4 train one model on many workers, which must talk on every step
# MAGIC (the gradient allreduce). The two patterns here need no communication at all, so they
# MAGIC scale with the cluster's task slots and tolerate a lost node (a Spark task is simply
# MAGIC retried; spot instances are fine, see `jobs/ensemble_cpu_*.json`):
# MAGIC
# MAGIC - **An ensemble on data partitions**: the table is repartitioned, one model trains per
# MAGIC   partition inside a Spark task (the data never goes to the driver), and the members
# MAGIC   vote (`combine=vote`) or average their probabilities (`mean`). Often more accurate
# MAGIC   than any single member, and each member only has to fit its partition in memory.
# MAGIC - **Hyperparameter search**: each trial trains one configuration in one Spark task,
# MAGIC   `max_concurrent` at a time; an adaptive sampler (TPE) picks the next values from the
# MAGIC   finished trials and the median rule stops hopeless trials early.
# MAGIC
# MAGIC Locally the ensemble is random forests on scikit-learn's digits as a table of 64 pixel
# MAGIC columns, and the search tunes the small CNN's learning rate and momentum on the image
# MAGIC shards of notebook 1. On Databricks set `source=table` and `table` to your
# MAGIC `catalog.schema.table` (the CPU cluster of the ensemble job is enough), and for the
# MAGIC search `config=imagenet_resnet50` on a GPU cluster with one trial per GPU.

# COMMAND ----------

from dist_dl.app import pipeline

ensemble = pipeline.ensemble(config)
print(f"ensemble of {len(ensemble.member_scores)} ({ensemble.combine}): accuracy "
      f"{ensemble.score:.4f} on held-out rows; members "
      f"{', '.join(f'{s:.4f}' for s in ensemble.member_scores)}, trained on "
      f"{', '.join(str(r) for r in ensemble.member_rows)} rows each; MLflow run {ensemble.run_id}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The search
# MAGIC
# MAGIC Its trials read the image shards of the `data` section, prepared here first if they
# MAGIC are missing. Every trial is an MLflow child run of one parent run, with its
# MAGIC per-epoch validation accuracy (the objective, maximised).

# COMMAND ----------

from dist_dl.read.resolve import resolve_files

try:
    resolve_files(config.data.train_output)
except FileNotFoundError:
    print(f"no shards at {config.data.train_output}: preparing them first")
    pipeline.prepare_data(config)

# COMMAND ----------

import pandas as pd

search = pipeline.search(config)
trials = pd.DataFrame([{"status": t.status, **t.params, "val_accuracy": t.value,
                        "epochs": t.steps, "error": t.error} for t in search.trials])
print(trials.sort_values("val_accuracy", ascending=False).to_string(index=False))
print(f"\nbest: {search.best_params} (val_accuracy {search.best_value:.4f}, MLflow run "
      f"{search.best_run_id}, parent run {search.parent_run_id})")
result = {"ensemble": ensemble, "search": search}
