"""Parallel hyperparameter trials: each trial one Spark task, one MLflow child run.

Driver code is in ``driver.py`` (sampling, stopping, MLflow); what runs in the
Spark tasks is in ``task.py`` (the trial and its ``Reporter``).
"""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "search": "dist_dl.search.driver",
    "SearchResult": "dist_dl.search.driver",
    "TrialRecord": "dist_dl.search.driver",
    "SearchError": "dist_dl.search.driver",
    "Reporter": "dist_dl.search.task",
    "TrialPruned": "dist_dl.search.task",
    "Uniform": "dist_dl.search.space",
    "LogUniform": "dist_dl.search.space",
    "IntRange": "dist_dl.search.space",
    "Choice": "dist_dl.search.space",
    "estimate_trial_memory": "dist_dl.search.memory",
    "TrialMemory": "dist_dl.search.memory",
    "trials_per_worker": "dist_dl.search.memory",
    "keras_model_size": "dist_dl.search.memory",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.search.driver import SearchError, SearchResult, TrialRecord, search  # noqa: F401
    from dist_dl.search.memory import (TrialMemory, estimate_trial_memory, keras_model_size, trials_per_worker)  # noqa: F401
    from dist_dl.search.space import Choice, IntRange, LogUniform, Uniform  # noqa: F401
    from dist_dl.search.task import Reporter, TrialPruned  # noqa: F401

__all__ = ["search", "SearchResult", "TrialRecord", "SearchError", "Reporter", "TrialPruned",
           "Uniform", "LogUniform", "IntRange", "Choice", "estimate_trial_memory",
           "TrialMemory", "trials_per_worker", "keras_model_size"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
