"""How rows split across ranks, from Parquet metadata alone (any process).

Row group ``i`` (see `row_groups()` for the numbering) goes to rank
``i % size``, with either reader (Petastorm's rule, kept by the arrow
reader). Every rank can compute every rank's row count from the Parquet
footers without talking to the others, so all ranks agree on the number of
steps per epoch; the driver computes the same figure before launching.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dist_dl.core.deprecation import renamed_attribute, renamed_parameters
from dist_dl.read.resolve import parquet_file, resolve_files

__all__ = ["ShardPlan", "plan_shards", "steps_per_epoch", "row_groups", "rank_row_groups"]

POLICIES = ("pad", "drop")


@renamed_parameters({"size": "num_workers"})
@dataclass(frozen=True)
class ShardPlan:
    """The split of a dataset over ``num_workers`` ranks.

    Attributes:
        files: The Parquet file URLs read (a Delta table's files at its version).
        num_workers: Number of ranks (``size``, the old name, reads it with a
            warning for one release).
        batch_size: Rows per batch per rank.
        row_groups: Row groups in the dataset.
        rows: Rows in the dataset.
        rows_per_rank: Rows each rank reads in one pass over its shard.
        steps_per_epoch: Batches every rank yields per epoch.
        policy: ``"pad"`` or ``"drop"`` (see `plan_shards()`).
    """

    files: tuple
    num_workers: int
    batch_size: int
    row_groups: int
    rows: int
    rows_per_rank: tuple
    steps_per_epoch: int
    policy: str

    size = renamed_attribute("num_workers")


def row_groups(files):
    """Every row group of ``files``, in the order both readers number them.

    Files in the given order (`resolve_files()` sorts
    them), each file's row groups in file order (or, for the shards of an
    MDS dataset, `mds_shards()`, one row group per
    shard, without footers): the order Petastorm
    enumerates the row groups of a list of files, read here from the footers
    with pyarrow alone, so it holds where Petastorm is not installed.

    Returns:
        ``(groups, footers)``: ``groups`` a list of ``(file, row_group,
        rows)``; ``footers`` each file's ``FileMetaData``, by file.
    """
    from concurrent.futures import ThreadPoolExecutor

    from dist_dl.read.mds import MdsShard

    files = list(files)
    if files and all(isinstance(f, MdsShard) for f in files):
        # An MDS dataset (dist_dl.read.mds): each shard is one row group.
        return [(shard, 0, shard.samples) for shard in files], {}
    # Footers are small reads; on remote storage their latency adds up.
    with ThreadPoolExecutor(min(8, max(1, len(files)))) as pool:
        metas = list(pool.map(lambda url: parquet_file(url).metadata, files))
    footers = dict(zip(files, metas))
    groups = [(url, i, meta.row_group(i).num_rows)
              for url, meta in zip(files, metas) for i in range(meta.num_row_groups)]
    return groups, footers


def rank_row_groups(groups: list, rank: int, size: int) -> list:
    """The row groups rank ``rank`` of ``size`` reads: row group ``i`` goes to
    rank ``i % size`` (Petastorm's ``cur_shard``/``shard_count`` rule), the
    one place the assignment is written down."""
    return groups[rank::size]


def _check_columns(footers, files) -> None:
    import pyarrow as pa

    if not footers:
        return
    path, meta = next(iter(footers.items()))
    schema = meta.schema.to_arrow_schema()
    for name, ok, expected in (("image", lambda t: pa.types.is_binary(t)
                                or pa.types.is_large_binary(t), "binary (encoded JPEG bytes)"),
                               ("label", pa.types.is_integer, "an integer type")):
        if name not in schema.names:
            raise ValueError(f"the shards have no {name!r} column (columns of {path}: "
                             f"{schema.names}): write them with dist_dl.prepare."
                             "prepare_image_dataset, or rename the column")
        kind = schema.field(name).type
        if not ok(kind):
            raise ValueError(f"column {name!r} of the shards has type {kind}, expected "
                             f"{expected}: rewrite the shards with prepare_image_dataset")


def _check_labels(files, classes: int) -> None:
    import pyarrow.compute as pc

    outside, low, high = 0, None, None
    for url in files:
        labels = parquet_file(url).read(columns=["label"])["label"]
        if len(labels) == 0:
            continue
        bad = pc.or_(pc.less(labels, 0), pc.greater_equal(labels, classes))
        outside += pc.sum(pc.cast(pc.fill_null(bad, True), "int64")).as_py() or 0
        mm = pc.min_max(labels).as_py()
        low = mm["min"] if low is None else min(low, mm["min"])
        high = mm["max"] if high is None else max(high, mm["max"])
    if outside:
        raise ValueError(f"column 'label' has {outside} values outside [0, {classes}) or null "
                         f"(min {low}, max {high}): the model has {classes} classes; check "
                         "classes= or the label index the shards were written with")


@renamed_parameters({"size": "num_workers"})
def plan_shards(url, num_workers: int, batch_size: int, *, version: int | None = None,
                classes: int | None = None, policy: str = "pad") -> ShardPlan:
    """Check a dataset for ``num_workers`` ranks and compute the steps per epoch.

    Run it on the driver before starting workers (errors then come before any
    worker starts); `make_dataset()` runs it again on every
    rank and gets the same answer.

    The rule that keeps ranks in step: every rank yields exactly
    ``steps_per_epoch`` batches of ``batch_size`` rows per epoch.

    - ``policy="pad"`` (default): ``steps_per_epoch = ceil(max rank rows /
      batch_size)``. Every rank reads all of its rows once; a rank that runs
      out first starts over on its own shard to fill its last batches, and
      those fill rows carry weight 0 (``make_dataset(with_weights=True)``).
      All ranks together thus see every row exactly once per epoch with
      weight 1.
    - ``policy="drop"``: ``steps_per_epoch = floor(min rank rows /
      batch_size)``. No row repeats; a rank stops after that many batches,
      so the rows beyond are not seen in that epoch (a different subset each
      epoch when row groups are shuffled).

    Args:
        url: Dataset folder, Delta table or URL (see
            `resolve_files()`), or a list of file URLs.
        num_workers: Number of ranks (``hvd.size()``; the old name ``size``
            is accepted with a warning for one release).
        batch_size: Rows per batch on each rank.
        version: Delta table version (default: latest).
        classes: If given, labels must lie in ``[0, classes)`` (reads the
            label column, a few bytes per row).
        policy: ``"pad"`` or ``"drop"``.

    Raises:
        ValueError: a missing or mistyped ``image``/``label`` column, an empty
            dataset, fewer row groups than ranks, a rank with no rows, labels
            outside ``[0, classes)``, or bad arguments.
    """
    for name, value in (("num_workers", num_workers), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    files = list(url) if isinstance(url, (list, tuple)) else resolve_files(url, version)
    groups, footers = row_groups(files)
    _check_columns(footers, files)
    rows = sum(n for _, _, n in groups)
    if rows == 0:
        raise ValueError(f"the dataset {url} has no rows: write some data first")
    if len(groups) < num_workers:
        fix = (f"ShardConfig(rows_per_row_group<={max(1, rows // num_workers)})" if footers
               else "a smaller size_limit in dataframe_to_mds's mds_kwargs (MDS: a shard is a "
                    "row group)")
        raise ValueError(
            f"the dataset has {len(groups)} row groups but there are {num_workers} workers: the "
            f"readers give whole row groups to workers, so each needs at least one. Rewrite it "
            f"with {fix}, or use at most {len(groups)} workers")
    per_rank = [sum(n for _, _, n in rank_row_groups(groups, r, num_workers))
                for r in range(num_workers)]
    empty = [r for r, n in enumerate(per_rank) if n == 0]
    if empty:
        raise ValueError(f"ranks {empty} would get only empty row groups ({len(groups)} row "
                         f"groups, {rows} rows): rewrite the dataset without empty row groups")
    if classes is not None and footers:
        # Parquet's label column alone is a few bytes a row; an MDS shard
        # holds each row's label beside its image, so its labels are not
        # read here (a label out of range fails in the loss).
        _check_labels(files, classes)
    if policy == "pad":
        steps = math.ceil(max(per_rank) / batch_size)
    else:
        steps = min(per_rank) // batch_size
        if steps == 0:
            raise ValueError(f"policy='drop' with batch_size={batch_size} gives 0 steps: the "
                             f"smallest shard has {min(per_rank)} rows; use a smaller batch "
                             "size or policy='pad'")
    return ShardPlan(files=tuple(files), num_workers=num_workers, batch_size=batch_size,
                     row_groups=len(groups), rows=rows, rows_per_rank=tuple(per_rank),
                     steps_per_epoch=steps, policy=policy)


@renamed_parameters({"size": "num_workers"})
def steps_per_epoch(url, num_workers: int, batch_size: int, *, version: int | None = None,
                    policy: str = "pad") -> int:
    """Batches every rank yields per epoch (see `plan_shards()`)."""
    return plan_shards(url, num_workers, batch_size, version=version,
                       policy=policy).steps_per_epoch
