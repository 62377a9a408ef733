"""How much memory one ensemble member's task needs, and how much a task has.

Checked on the driver before any member trains: the partitions are counted
first, and the largest must fit in one Spark task's memory (see
`estimate_partition_memory()` for the model of it, `task_memory()` for
where the limit comes from). The hyperparameter search has its own estimate,
per trial, in ``dist_dl.search.memory``.
"""
from __future__ import annotations

import math
import os

from dist_dl.core.session import task_slots
from dist_dl.core.sessionkind import configured_slots, is_connect, session_conf, session_master

__all__ = ["PartitionMemoryError", "estimate_partition_memory", "task_memory",
           "check_partition_memory"]

# Bytes a Python worker holds before it sees a row (interpreter, pandas,
# pyarrow, scikit-learn: 150-250 MiB on Linux x86-64), rounded up.
_WORKER_BASELINE = 256 * 2**20


class PartitionMemoryError(ValueError):
    """A partition would not fit in one Spark task's memory."""


def estimate_partition_memory(rows: int, num_features: int, *, memory_factor: float = 4.0) -> int:
    """Bytes one task needs to train on a partition of ``rows`` rows.

    The partition's data as float64 (features plus label) times
    ``memory_factor`` (Arrow batches, the pandas frame, the NumPy matrix and the
    model's own working copy each hold the data once), plus a Python worker's
    baseline.
    """
    return int(rows * (num_features + 1) * 8 * memory_factor) + _WORKER_BASELINE


def task_memory(spark) -> tuple[int, str]:
    """Memory one Python task may use, and where that figure comes from."""
    cores = int(session_conf(spark, "spark.executor.cores", "1") or 1)
    pyspark_mem = session_conf(spark, "spark.executor.pyspark.memory")
    if pyspark_mem:
        # Spark sets this, divided by the executor's cores, as each Python
        # worker's address-space limit (PythonRunner).
        return (_parse_size(pyspark_mem) // cores,
                f"spark.executor.pyspark.memory={pyspark_mem} / spark.executor.cores={cores}")
    if session_master(spark).startswith("local"):
        # A Connect session's local server is taken to share this machine.
        slots = max(1, (configured_slots(spark) or os.cpu_count() or 1) if is_connect(spark)
                    else task_slots(spark))
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total // slots, f"this machine's memory / {slots} local task slots"
    executor = session_conf(spark, "spark.executor.memory", "1g")
    # Without a Python limit, workers share the executor's node; its JVM size
    # per core is a conservative stand-in for what each can use.
    return (_parse_size(executor) // cores,
            f"spark.executor.memory={executor} / spark.executor.cores={cores}")


def _parse_size(text: str) -> int:
    text = text.strip().lower()
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    text = text[:-1] if text.endswith("b") else text
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text) * 2**20  # Spark reads a bare number of memory as MiB


def check_partition_memory(largest: int, train_rows: int, num_features: int,
                           memory_factor: float, limit: int, source: str) -> None:
    """Raise ``PartitionMemoryError`` if the largest partition (``largest``
    training rows, counted) would not fit in ``limit`` bytes (whose origin
    ``source`` names)."""
    need = estimate_partition_memory(largest, num_features, memory_factor=memory_factor)
    if need <= limit:
        return
    fixed = _WORKER_BASELINE
    per_row = (num_features + 1) * 8 * memory_factor
    fits = max(0, int((limit - fixed) / per_row)) if limit > fixed else 0
    # 10 % above the even share: random partitions are not all the same size.
    hint = (f"raise num_models to at least {math.ceil(train_rows / fits * 1.1)}"
            if fits > 0 else "no partition size fits, so give tasks more memory")
    raise PartitionMemoryError(
        f"the largest partition, {largest:,} rows x {num_features} features, needs "
        f"about {need / 2**20:,.0f} MiB in one Spark task, more than the "
        f"{limit / 2**20:,.0f} MiB a task has ({source}). Fix: {hint}, or raise the task "
        f"memory (spark.executor.pyspark.memory, or task_memory_bytes if you know better), or "
        f"lower memory_factor (now {memory_factor}) if your model copies the data less.")
