"""The image shard schema and the files written beside the shards.

Shared by the writer (driver) and the reader (workers), so it imports nothing
heavy. Every shard, whichever way it was written, has exactly these columns:

============  ========  ========================================================
column        type      meaning
============  ========  ========================================================
image         binary    encoded RGB JPEG bytes (never null)
label         int32     label index, in ``[0, classes)``
label_name    string    the label's name (an ImageNet wnid, a folder name, ...)
source_id     string    where the row came from: the source path, the value of
                        the caller's id column, or ``sha1:<hex>`` of the bytes
height        int32     stored image height in pixels
width         int32     stored image width in pixels
============  ========  ========================================================

The files are written uncompressed and without dictionary encoding
(`PARQUET_OPTIONS`, `SPARK_PARQUET_OPTIONS`): JPEG bytes do not
compress, and each image is unique, so both only cost time. Reading a row
group of ImageNet-like JPEGs (about 53 KB each) with pyarrow into one
``bytes`` per image then takes about a third less CPU than with Snappy and
a dictionary page (``benchmarks/reader.py``'s ``parquet_read_us_per_image``
figures), a few percent of what decoding the images costs.

Beside the data (in the Parquet folder or the Delta table's root, with names
starting with ``_`` so that Spark, pyarrow, Petastorm and Delta all ignore
them): ``_labels.json`` (the label index, name to integer) and
``_summary.json`` (the last write's summary).
"""
from __future__ import annotations

__all__ = ["COLUMNS", "LABELS_FILE", "SUMMARY_FILE", "PARQUET_OPTIONS", "SPARK_PARQUET_OPTIONS",
           "arrow_schema"]

# Column name -> Arrow type name; the order is the stored order.
COLUMNS = {
    "image": "binary",
    "label": "int32",
    "label_name": "string",
    "source_id": "string",
    "height": "int32",
    "width": "int32",
}
LABELS_FILE = "_labels.json"
SUMMARY_FILE = "_summary.json"

# How the shards' Parquet files are written: pyarrow.parquet.write_table's
# arguments, and Spark's DataFrameWriter options (parquet-mr's settings).
PARQUET_OPTIONS = {"compression": "none",
                   "use_dictionary": [c for c in COLUMNS if c != "image"]}
SPARK_PARQUET_OPTIONS = {"compression": "none", "parquet.enable.dictionary": "false"}


def arrow_schema():
    """The shard schema as a ``pyarrow.Schema``."""
    import pyarrow as pa

    types = {"binary": pa.binary(), "int32": pa.int32(), "string": pa.string()}
    return pa.schema([pa.field(name, types[kind], nullable=(name != "image"))
                      for name, kind in COLUMNS.items()])
