"""A module shipped to the cluster with ``sc.addPyFile``, as notebooks ship
their own modules on Databricks: for the tests that its import works in the
runners' workers wherever it works in a plain Spark task."""
from __future__ import annotations

from pathlib import Path


def ship_module(spark, folder: Path, name: str, answer: int) -> None:
    """Write module ``name`` (``answer()`` returns ``answer``) into
    ``folder``, ship it with ``sc.addPyFile`` and check that a plain Spark
    task imports it: the reference the workers must match."""
    module = folder / f"{name}.py"
    module.write_text(f"def answer():\n    return {answer!r}\n")
    sc = spark.sparkContext
    sc.addPyFile(str(module))
    got = sc.parallelize([0], 1).map(lambda _: __import__(name).answer()).collect()
    assert got == [answer], got
