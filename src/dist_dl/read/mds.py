"""Mosaic Streaming (MDS) datasets as input: their shards as the plan's row groups.

An MDS dataset (as ``streaming.base.converters.dataframe_to_mds`` writes a
DataFrame of encoded images and labels, on Databricks to a Unity Catalog
volume) is a folder with an ``index.json`` listing its shards: each a file
of samples, compressed (``zstd`` by default) or not. `mds_shards()`
reads that index on the driver, checks the columns, and returns one
`MdsShard` per shard; the plan (`plan_shards()`)
and the readers take that list where they take Parquet file URLs, with
shard ``i`` as row group ``i``. So a rank reads whole shards (shard ``i``
to rank ``i % size``), every rank yields the same number of batches, the
rows a short rank repeats carry weight 0 (exact validation), and a resumed
attempt reads what the first one would have (`dist_dl.read.rows`).

Why not ``streaming.StreamingDataset``: its partition evens out the ranks
by repeating samples (``streaming/base/partition/orig.py``), and a repeated
sample cannot be told from a real one, so a validation pass over it is not
exact; it also needs its own local cache, shared memory and launcher
variables. The shards are read here from the format alone (index, shard
layout, the column encodings an image and a label take, the compression),
not with streaming's ``MDSReader``: importing any part of streaming imports
all of it, with torchvision and transformers, in every worker (seconds),
and fails where torchvision is not the build made for the installed torch.

The dataset must be readable as files where the workers run (a local
folder, ``/Volumes/...`` or ``/dbfs/...``, ``dbfs:/`` or ``file:`` URLs).
Imports no framework; a compressed shard needs its decompressor (``zstd``,
the converter's default, comes with mosaicml-streaming: the ``mds`` extra).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from dist_dl.core.locations import file_path, file_url

__all__ = ["MdsShard", "is_mds", "mds_shards", "read_mds_shard", "INDEX"]

INDEX = "index.json"

# MDS encodings read as the image (the encoded file's own bytes) and as the
# label (an integer class index).
_IMAGE_ENCODINGS = ("bytes",)
_LABEL_ENCODINGS = ("int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                    "uint64", "str_int")


@dataclass(frozen=True)
class MdsShard:
    """One shard of an MDS dataset, as the plan and the readers take it.

    Attributes:
        folder: The dataset's folder (local path) that ``index.json`` is in.
        entry: The shard's entry in ``index.json`` (basenames relative to
            ``folder``, column names and encodings, compression, samples).
        image, label: The columns read as the encoded image and the label.
        source_id: A column read as each row's id, or None (then
            ``<shard file>#<sample>``).
    """

    folder: str
    entry: dict = field(hash=False, compare=False, repr=False)
    image: str = "image"
    label: str = "label"
    source_id: str | None = None

    @property
    def samples(self) -> int:
        return int(self.entry["samples"])

    @property
    def path(self) -> str:
        """The shard's data file as written: compressed where it is."""
        info = self.entry.get("zip_data") or self.entry["raw_data"]
        return os.path.join(self.folder, info["basename"])

    def __str__(self) -> str:
        return file_url(self.path)


def _index_path(location) -> str | None:
    """``index.json`` of an MDS dataset at ``location``, or None if it is not one."""
    path = file_path(location)
    if path is None:
        return None
    index = os.path.join(path, INDEX)
    return index if os.path.isfile(index) else None


def is_mds(location) -> bool:
    """Whether ``location`` (a path or ``file:``/``dbfs:`` URL) is the folder
    of an MDS dataset (it holds ``index.json``)."""
    return isinstance(location, (str, os.PathLike)) and _index_path(location) is not None


def mds_shards(location, *, image_col: str = "image", label_col: str = "label",
               source_id_col: str | None = None) -> list[MdsShard]:
    """The shards of the MDS dataset at ``location``, in its index's order,
    checked for the columns the readers read (run it on the driver).

    Raises:
        ValueError: ``location`` holds no ``index.json``, the index is not a
            version 2 MDS index, a column is missing (the message names the
            columns the dataset has) or has an encoding that is not an
            encoded image (``bytes``) or an integer label, or the dataset has
            no samples.
    """
    index = _index_path(location)
    if index is None:
        raise ValueError(f"{location} is not an MDS dataset: it has no {INDEX} (write one with "
                         "streaming.base.converters.dataframe_to_mds, or pass the folder its "
                         f"{INDEX} is in; remote URLs are read through a mount such as "
                         "/Volumes/...)")
    with open(index) as f:
        try:
            obj = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{index} is not JSON ({exc}): rewrite the MDS dataset") from None
    entries = obj.get("shards") if isinstance(obj, dict) else None
    if obj.get("version") != 2 or not isinstance(entries, list):
        raise ValueError(f"{index} is not an MDS index of version 2 (as streaming 0.6 and later "
                         "write): rewrite the dataset with streaming's MDSWriter")
    folder = os.path.dirname(index)
    wanted = {"image_col": (image_col, _IMAGE_ENCODINGS), "label_col": (label_col,
                                                                       _LABEL_ENCODINGS)}
    if source_id_col is not None:
        wanted["source_id_col"] = (source_id_col, None)
    for number, entry in enumerate(entries):
        if entry.get("format") != "mds":
            raise ValueError(f"shard {number} of {index} has format {entry.get('format')!r}; "
                             "only MDS shards ('mds') are read")
        encodings = dict(zip(entry["column_names"], entry["column_encodings"]))
        for setting, (name, accepted) in wanted.items():
            if name not in encodings:
                raise ValueError(
                    f"the MDS dataset {location} has no column {name!r} ({setting}); its "
                    f"columns: {', '.join(sorted(encodings))}: set {setting} to one of them")
            if accepted is not None and encodings[name] not in accepted:
                raise ValueError(
                    f"column {name!r} ({setting}) of the MDS dataset {location} has encoding "
                    f"{encodings[name]!r}; expected one of {', '.join(accepted)} (write the "
                    "encoded image as 'bytes' and the label as an integer class index)")
    shards = [MdsShard(folder, entry, image_col, label_col, source_id_col) for entry in entries]
    if not sum(shard.samples for shard in shards):
        raise ValueError(f"the MDS dataset {location} has no samples: write some data first")
    return shards


def read_mds_shard(shard: MdsShard):
    """``(images, labels, source_ids)`` of every sample of ``shard``, as numpy
    arrays (object, int64, object): the shard file read once, decompressed,
    and its samples decoded."""
    import numpy as np

    with open(shard.path, "rb") as f:
        data = f.read()
    if shard.entry.get("zip_data"):
        data = _decompress(shard.entry["compression"], data, shard.path)
    names = shard.entry["column_names"]
    encodings = dict(zip(names, shard.entry["column_encodings"]))
    sizes = shard.entry["column_sizes"]
    wanted = {name: names.index(name) for name in (shard.image, shard.label, shard.source_id)
              if name is not None}
    # The MDS shard layout: a uint32 sample count, then count + 1 uint32
    # offsets of the samples from the start of the shard. A sample: a uint32
    # length for each column of variable size (size null in the index), in
    # column order, then every column's bytes, in column order.
    count = int(np.frombuffer(data, "<u4", 1)[0])
    offsets = np.frombuffer(data, "<u4", count + 1, offset=4).tolist()
    variable = [i for i, size in enumerate(sizes) if not size]
    images = np.empty(count, dtype=object)
    labels = np.empty(count, dtype=np.int64)
    ids = np.empty(count, dtype=object)
    name = shard.entry["raw_data"]["basename"]
    for row in range(count):
        start = offsets[row]
        lengths = list(sizes)
        if variable:
            found = np.frombuffer(data, "<u4", len(variable), offset=start).tolist()
            for i, length in zip(variable, found):
                lengths[i] = length
            start += 4 * len(variable)
        bounds = np.cumsum([start] + lengths).tolist()
        value = {column: data[bounds[i]:bounds[i + 1]] for column, i in wanted.items()}
        images[row] = value[shard.image]
        labels[row] = _integer(encodings[shard.label], value[shard.label])
        ids[row] = (f"{name}#{row}" if shard.source_id is None
                    else _text(encodings[shard.source_id], value[shard.source_id]))
    return images, labels, ids


# The MDS integer encodings: numpy scalars, little-endian ("int" is int64).
_INTEGERS = {"int": "<i8", "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
             "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8"}


def _integer(encoding: str, value: bytes) -> int:
    import numpy as np

    if encoding == "str_int":
        return int(value.decode("utf-8"))
    return int(np.frombuffer(value, _INTEGERS[encoding], 1)[0])


def _text(encoding: str, value: bytes) -> str:
    if encoding in ("str", "str_int", "str_float", "str_decimal", "json"):
        return value.decode("utf-8")
    return str(_integer(encoding, value)) if encoding in _INTEGERS else value.hex()


# MDS compression names (a level may follow: "zstd:7") -> the module that
# decompresses them; zstd, brotli and snappy come with mosaicml-streaming.
_DECOMPRESSORS = {"zstd": "zstd", "gz": "gzip", "bz2": "bz2", "br": "brotli", "snappy": "snappy"}


def _decompress(compression: str, data: bytes, path: str) -> bytes:
    import importlib

    algorithm = compression.split(":", 1)[0]
    if algorithm not in _DECOMPRESSORS:
        raise ValueError(f"{path} is compressed with {compression!r}, which is not one of "
                         f"{', '.join(_DECOMPRESSORS)}: rewrite the dataset")
    try:
        module = importlib.import_module(_DECOMPRESSORS[algorithm])
    except ImportError as exc:
        raise ImportError(f"{path} is compressed with {compression!r}, and its module "
                          f"{_DECOMPRESSORS[algorithm]} does not import here ({exc}): pip "
                          "install 'dist_dl[mds]' (mosaicml-streaming brings it)") from exc
    return module.decompress(data)
