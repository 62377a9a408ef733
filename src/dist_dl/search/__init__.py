"""Parallel hyperparameter trials: each trial one Spark task, one MLflow child run.

Driver code is in ``driver.py`` (sampling, stopping, MLflow); what runs in the
Spark tasks is in ``task.py`` (the trial and its ``Reporter``).
"""
from dist_dl.search.driver import SearchError, SearchResult, TrialRecord, search
from dist_dl.search.memory import (TrialMemory, estimate_trial_memory, keras_model_size,
                                   trials_per_worker)
from dist_dl.search.space import Choice, IntRange, LogUniform, Uniform
from dist_dl.search.task import Reporter, TrialPruned

__all__ = ["search", "SearchResult", "TrialRecord", "SearchError", "Reporter", "TrialPruned",
           "Uniform", "LogUniform", "IntRange", "Choice", "estimate_trial_memory",
           "TrialMemory", "trials_per_worker", "keras_model_size"]
