"""Whether the workers of a job trained one model or several.

A worker function that builds its Keras model outside a multi-worker
strategy's scope still runs to the end on every worker, each training its own
copy on its own share of the steps, and nothing fails: the job returns rank
0's model as if it were the job's. That is the worst failure a data-parallel
runner can have, so every tf.distribute worker reports, when its function has
returned, the Keras models it trained (`report()`: per trainable variable
the sum and the sum of magnitudes of its values, and whether the model was
built under a ``MultiWorkerMirroredStrategy``), and the driver compares them
with rank 0's (`check()`):

- a model whose weights differ from rank 0's fails the job
  (`WorkersDiverged`), naming the model, the ranks and the fix;
- a model every rank trained outside a multi-worker strategy, with the same
  weights everywhere (seeded initialisation, identical data), warns
  (`UnsynchronizedTraining`): every worker did the whole job alone.

Models are matched across ranks by name; a name that is not on every rank
exactly once (a model only rank 0 builds or loads, two models of one name) is
not compared. A model counts as trained when its optimizer took a step.
The runners' ``check_weights=False`` turns the report and the check off.

Horovod's workers (``HorovodRunner``) report too: there the models are built
outside any strategy by design, and only weights that differ from rank 0's
fail the job (a function without ``hvd.DistributedOptimizer`` or without the
broadcast of rank 0's initial weights).
"""
from __future__ import annotations

import gc
import sys
import warnings

__all__ = ["WorkersDiverged", "UnsynchronizedTraining", "report", "check", "RECORD"]

# The control record a worker sends with its report.
RECORD = "weights"
# A variable's sum may differ by rounding alone (none is expected: the
# strategy applies the same reduced gradients everywhere); relative to the
# sum of its magnitudes.
_TOLERANCE = 1e-5


class WorkersDiverged(RuntimeError):
    """The workers of a job ended with different weights for one model:
    they trained separate models, not one."""


class UnsynchronizedTraining(RuntimeWarning):
    """Every worker trained a model outside a multi-worker strategy."""


def _model_classes() -> tuple[type, ...]:
    # Only Keras packages already imported: the report imports nothing.
    classes = []
    for name in ("tf_keras", "keras"):
        cls = getattr(sys.modules.get(name), "Model", None)
        if isinstance(cls, type) and cls not in classes:
            classes.append(cls)
    return tuple(classes)


def _steps(model) -> int:
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    if iterations is None:
        return 0
    try:
        import numpy as np

        return int(np.asarray(iterations.numpy() if hasattr(iterations, "numpy") else iterations))
    except Exception:  # an optimizer not built yet, a wrapper without a value
        return 0


def _multi_worker(model) -> bool:
    # tf.keras (Keras 2) keeps the strategy its model was built under in
    # _distribution_strategy; Keras 3's TensorFlow trainer in _distribute_strategy.
    strategy = (getattr(model, "_distribution_strategy", None)
                or getattr(model, "_distribute_strategy", None))
    if strategy is None:
        return False
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _sums(model) -> list[list]:
    import numpy as np

    rows = []
    for variable in model.trainable_weights:
        values = np.asarray(variable.numpy(), dtype=np.float64)
        rows.append([str(getattr(variable, "path", None) or variable.name),
                     float(values.sum()), float(np.abs(values).sum())])
    return rows


def report() -> list[dict]:
    """The Keras models this process trained: name, steps, whether built
    under a multi-worker strategy, and per trainable variable its name, sum
    and sum of magnitudes. Empty where no Keras package is imported."""
    classes = _model_classes()
    if not classes:
        return []
    models = [o for o in gc.get_objects() if isinstance(o, classes)]
    found = []
    for model in models:
        steps = _steps(model)
        if steps <= 0:
            continue
        try:
            found.append({"name": str(model.name), "steps": steps,
                          "multi_worker": _multi_worker(model), "variables": _sums(model)})
        except Exception:  # a model half torn down: not this check's business
            continue
    return found


def _differs(mine: list[list], rank0: list[list]) -> str | None:
    """Where ``mine`` differs from ``rank0`` (a variable's name and sums), or None."""
    if [row[0] for row in mine] != [row[0] for row in rank0]:
        return "its variables differ"
    for (name, total, magnitude), (_, total0, magnitude0) in zip(mine, rank0):
        scale = max(magnitude, magnitude0, 1e-12)
        if abs(total - total0) > _TOLERANCE * scale or abs(magnitude - magnitude0) > _TOLERANCE * scale:
            return f"variable {name}: sum {total:.6g} vs {total0:.6g} on rank 0"
    return None


def check(records: list[dict], num_workers: int, runner: str, fix: str, *,
          strategy: bool = True) -> None:
    """Compare the workers' reports (``records``: the job's control records)
    with rank 0's.

    Args:
        records: Every control record of the job (the ``weights`` ones are read).
        num_workers: Workers in the job; nothing is compared unless all reported.
        runner: The runner as the user wrote it, for the messages.
        fix: What to change in the worker function, for the messages.
        strategy: The runner's models belong under a multi-worker strategy
            (tf.distribute): one trained outside it is named, and one every
            worker trained alone to the same weights warns. False (Horovod,
            whose models are built outside any strategy): only weights that
            differ from rank 0's count.

    Raises:
        WorkersDiverged: a model's weights differ from rank 0's.
    """
    reports = {r["rank"]: r.get("models") or [] for r in records if r.get("kind") == RECORD}
    if num_workers < 2 or set(reports) != set(range(num_workers)):
        return
    by_rank = {}
    for rank, models in reports.items():
        names = [m["name"] for m in models]
        by_rank[rank] = {m["name"]: m for m in models if names.count(m["name"]) == 1}
    common = sorted(set.intersection(*(set(models) for models in by_rank.values())))
    alone = []
    for name in common:
        differing = []
        for rank in range(1, num_workers):
            where = _differs(by_rank[rank][name]["variables"], by_rank[0][name]["variables"])
            if where is not None:
                differing.append(f"rank {rank} ({where})")
        outside = ([r for r in range(num_workers) if not by_rank[r][name]["multi_worker"]]
                   if strategy else [])
        if differing:
            built = (f" It was built outside a MultiWorkerMirroredStrategy's scope on rank(s) "
                     f"{', '.join(map(str, outside))}." if outside else "")
            raise WorkersDiverged(
                f"{runner}: the {num_workers} workers ended with different weights for Keras "
                f"model {name!r}: {'; '.join(differing[:3])}"
                f"{' and more' if len(differing) > 3 else ''}. Each worker trained its own "
                f"copy instead of one model, and rank 0's result is only its own.{built} {fix} "
                f"(check_weights=False turns this check off.)")
        if len(outside) == num_workers:
            alone.append(name)
    if alone:
        warnings.warn(
            f"{runner}: every one of the {num_workers} workers trained Keras model(s) "
            f"{', '.join(map(repr, alone))} on its own, outside a MultiWorkerMirroredStrategy: "
            f"they ended alike, but no gradient was shared, so the job did the same work "
            f"{num_workers} times. {fix}", UnsynchronizedTraining, stacklevel=3)
