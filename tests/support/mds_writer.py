"""Write MDS datasets with mosaicml-streaming's ``dataframe_to_mds`` from a
local Spark DataFrame, in a process of its own (the tests' Spark session is
left as it was):

    python mds_writer.py ROWS.pkl COLUMNS.json OUT [OUT ...]

``ROWS.pkl`` holds a list of pandas DataFrames, one per ``OUT``, each
written as one dataset with the MDS ``COLUMNS`` (name -> encoding), from two
Spark partitions in shards of at most 4 KiB (zstd, the converter's default),
on ``local[1]`` (one Python worker imports streaming, not two).

streaming imports torchvision as it is imported, though its writers never
use it, and the torchvision wheels on PyPI (CUDA builds) do
not load with the profiles' CPU torch: the caller puts the placeholder
beside this file (PLACEHOLDER) first on PYTHONPATH, for this process and
Spark's Python workers, in every profile alike."""
from __future__ import annotations

import json
import os
import pickle
import sys

PLACEHOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_placeholder")


def main(rows_file: str, columns_file: str, *outs: str) -> None:
    with open(rows_file, "rb") as f:
        frames = pickle.load(f)
    with open(columns_file) as f:
        columns = json.load(f)
    from pyspark.sql import SparkSession

    # Spark's Python workers run this Python (with streaming), not python3 on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from streaming.base.converters import dataframe_to_mds

    spark = (SparkSession.builder.master("local[1]").appName("mds_writer")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.task.maxFailures", "1")
             .getOrCreate())
    try:
        for frame, out in zip(frames, outs):
            df = spark.createDataFrame(frame).repartition(2)
            dataframe_to_mds(df, merge_index=True,
                             mds_kwargs={"out": out, "columns": columns, "size_limit": 4096})
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
