"""Throughput and scaling of data-parallel training, measured side by side
(``dist-dl bench``, ``benchmarks/``): the setups and their report
(``driver``), the training functions they run (``fits``), what is recorded
beside throughput (``measure``) and the shared results file (``results``)."""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "run_benchmark": "dist_dl.app.bench.driver",
    "StepRecorder": "dist_dl.app.bench.measure",
    "CpuSampler": "dist_dl.app.bench.measure",
    "MemoryPeaks": "dist_dl.app.bench.measure",
    "thread_split": "dist_dl.app.bench.measure",
    "input_verdict": "dist_dl.app.bench.driver",
    "cores_per_device": "dist_dl.app.bench.driver",
    "result_entry": "dist_dl.app.bench.results",
    "merge_results": "dist_dl.app.bench.results",
    "plot_results": "dist_dl.app.bench.results",
    "publish_results": "dist_dl.app.bench.results",
    "GOALS": "dist_dl.app.bench.results",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.app.bench.driver import cores_per_device, input_verdict, run_benchmark  # noqa: F401
    from dist_dl.app.bench.measure import CpuSampler, MemoryPeaks, StepRecorder, thread_split  # noqa: F401
    from dist_dl.app.bench.results import (GOALS, merge_results, plot_results, publish_results, result_entry)  # noqa: F401

__all__ = ["run_benchmark", "StepRecorder", "CpuSampler", "MemoryPeaks", "thread_split", "input_verdict",
           "cores_per_device", "result_entry", "merge_results", "plot_results", "publish_results", "GOALS"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
