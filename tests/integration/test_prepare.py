"""Shard writing on the driver: sources, schema, labels, bad images, formats."""
from __future__ import annotations

import io
import json
import os
import re

import pyarrow.parquet as pq
import pytest

from imagedata import WNIDS, digit_images, encode, write_imagenet_tree

from dist_dl.prepare import ShardConfig, load_label_index, prepare_image_dataset

pytestmark = [pytest.mark.profile_subset_164]


def _rows(path):
    return pq.ParquetDataset(path).read().to_pylist()


def _stored_plainly(files) -> None:
    """Every column chunk uncompressed, the image column without a
    dictionary (prepare.schema: JPEG bytes neither compress nor repeat)."""
    for f in files:
        meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(g).column(c)
                assert column.compression == "UNCOMPRESSED", (f, column)
                if column.path_in_schema == "image":
                    assert not column.has_dictionary_page, (f, column)


@pytest.mark.timeout(600)
def test_imagenet_tree_with_mixed_formats_writes_every_image(spark, tmp_path, capsys):
    written = write_imagenet_tree(str(tmp_path / "train"))
    out = tmp_path / "shards"
    summary = prepare_image_dataset(str(out), image_dir=str(tmp_path / "train"),
                                    config=ShardConfig(rows_per_row_group=5,
                                                       resize_short_side=16), spark=spark,
                                    progress_every=0.1)
    assert (summary.rows_in, summary.rows_written, summary.rows_skipped) == (12, 12, 0)
    # The last progress line counts every image decoded.
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(rf"prepare-data {out}: 12/12 images \([\d.]+ images/s\), "
                        r"\d+m\d\ds in all", last), last
    assert json.loads((out / "_summary.json").read_text())["rows_written"] == 12
    index = load_label_index(str(out))
    assert index == {w: i for i, w in enumerate(WNIDS)}
    rows = _rows(str(out))
    assert sorted(r["source_id"] for r in rows) == sorted(written)
    assert all(r["label"] == index[written[r["source_id"]]] for r in rows)
    assert all(r["label_name"] == written[r["source_id"]] for r in rows)
    assert all((r["height"], r["width"]) == (16, 16) for r in rows)
    groups = [pq.ParquetFile(out / f).metadata.row_group(i).num_rows
              for f in os.listdir(out) if f.endswith(".parquet")
              for i in range(pq.ParquetFile(out / f).metadata.num_row_groups)]
    assert sum(groups) == 12 and max(groups) <= 5
    _stored_plainly([out / f for f in os.listdir(out) if f.endswith(".parquet")])


@pytest.mark.timeout(600)
def test_bad_images_fail_by_default_and_are_counted_with_skip(spark, tmp_path):
    write_imagenet_tree(str(tmp_path / "train"), per_class=2, variety=False)
    good = encode(digit_images(1)[0][0])
    bad = {"truncated.JPEG": good[: len(good) // 2], "zero.JPEG": b"", "notes.JPEG": b"hello"}
    for name, data in bad.items():
        (tmp_path / "train" / WNIDS[0] / name).write_bytes(data)
    with pytest.raises(ValueError, match=r"3 of 9 images.*notes\.JPEG.*on_bad_image='skip'"):
        prepare_image_dataset(str(tmp_path / "out"), image_dir=str(tmp_path / "train"),
                              spark=spark)
    assert not (tmp_path / "out" / "_labels.json").exists()
    summary = prepare_image_dataset(str(tmp_path / "out"), image_dir=str(tmp_path / "train"),
                                    on_bad_image="skip", spark=spark)
    assert (summary.rows_in, summary.rows_written, summary.rows_skipped) == (9, 6, 3)
    assert summary.skipped_by_reason == {"empty": 1, "undecodable": 2}
    assert {sid for sid, _ in summary.skipped_examples} == {f"{WNIDS[0]}/{n}" for n in bad}
    assert len(_rows(str(tmp_path / "out"))) == 6


@pytest.mark.timeout(600)
def test_dataframe_sources_are_checked_before_any_task(spark, tmp_path):
    from pyspark.sql import Row

    images = digit_images(6)
    df = spark.createDataFrame([Row(img=bytearray(encode(im)), digit=d, key=f"k{i}")
                                for i, (im, d) in enumerate(images)])
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"column 'image' \(image_col\) is not in"):
        prepare_image_dataset(out, dataframe=df, label_col="digit", classes=10, spark=spark)
    with pytest.raises(ValueError, match=r"column 'digit' has type .*binary"):
        prepare_image_dataset(out, dataframe=df, image_col="digit", label_col="digit",
                              classes=10, spark=spark)
    with pytest.raises(ValueError, match=r"column 'img' has type binary; expected string"):
        prepare_image_dataset(out, dataframe=df, image_col="key", label_col="img", spark=spark)
    with pytest.raises(ValueError, match=r"pass classes="):
        prepare_image_dataset(out, dataframe=df, image_col="img", label_col="digit", spark=spark)
    with pytest.raises(ValueError, match=r"'digit' has \d+ labels outside \[0, 3\)"):
        prepare_image_dataset(out, dataframe=df, image_col="img", label_col="digit", classes=3,
                              spark=spark)
    with pytest.raises(ValueError, match="has no rows"):
        prepare_image_dataset(out, dataframe=df.limit(0), image_col="img", label_col="digit",
                              classes=10, spark=spark)
    summary = prepare_image_dataset(out, dataframe=df, image_col="img", label_col="digit",
                                    source_id_col="key", classes=10, spark=spark)
    assert summary.rows_written == 6 and summary.classes == 10
    rows = {r["source_id"]: r for r in _rows(out)}
    assert {k: r["label"] for k, r in rows.items()} == {f"k{i}": d
                                                        for i, (_, d) in enumerate(images)}


@pytest.mark.timeout(600)
def test_binary_file_paths_and_a_flat_validation_set_with_a_label_list(spark, tmp_path):
    from pyspark.sql import functions as F

    write_imagenet_tree(str(tmp_path / "train"), per_class=2, variety=False)
    prepare_image_dataset(str(tmp_path / "train_shards"), image_dir=str(tmp_path / "train"),
                          spark=spark)
    # Validation images in one folder plus ImageNet's LOC_val_solution.csv layout.
    val = tmp_path / "val"
    val.mkdir()
    lines = ["ImageId,PredictionString"]
    for i, (img, _) in enumerate(digit_images(3)):
        (val / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(encode(img))
        lines.append(f"ILSVRC2012_val_{i:08d},{WNIDS[i]} 1 2 3 4")
    (tmp_path / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    summary = prepare_image_dataset(str(tmp_path / "val_shards"), image_dir=str(val),
                                    labels_file=str(tmp_path / "LOC_val_solution.csv"),
                                    label_index=str(tmp_path / "train_shards"), spark=spark)
    assert summary.rows_written == 3
    assert sorted((r["source_id"], r["label"]) for r in _rows(str(tmp_path / "val_shards"))) == \
        [(f"ILSVRC2012_val_{i:08d}.JPEG", i) for i in range(3)]
    # Spark's binaryFile source: its `path` column (file:/... URIs) as the image column.
    files = spark.read.format("binaryFile").option("recursiveFileLookup", "true") \
        .load(str(tmp_path / "train"))
    df = files.select("path", F.element_at(F.split("path", "/"), -2).alias("wnid"))
    summary = prepare_image_dataset(str(tmp_path / "from_paths"), dataframe=df,
                                    image_col="path", label_col="wnid",
                                    label_index=str(tmp_path / "train_shards"), spark=spark)
    assert summary.rows_written == 6
    assert all(r["source_id"].startswith("file:") for r in _rows(str(tmp_path / "from_paths")))


@pytest.mark.timeout(600)
def test_prepare_data_command_writes_a_tree_and_its_validation_folder_as_delta(spark, tmp_path):
    from dist_dl.cli import main
    from dist_dl.read import resolve_files

    write_imagenet_tree(str(tmp_path / "train"), per_class=2, variety=True)
    write_imagenet_tree(str(tmp_path / "val"), per_class=1, variety=False)
    settings = {"data.source": "folder", "data.train_dir": tmp_path / "train",
                "data.val_dir": tmp_path / "val", "data.output": tmp_path / "shards",
                "data.format": "delta", "data.resize_short_side": 16}
    argv = ["prepare-data", "--config", "defaults"]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0

    def rows(split):
        files = resolve_files(str(tmp_path / "shards" / split))  # the Delta version's files
        return pq.read_table([f[len("file://"):] for f in files]).to_pylist()

    train = rows("train")
    assert len(train) == 6 and min(min(r["height"], r["width"]) for r in train) == 16
    _stored_plainly([f[len("file://"):] for f in resolve_files(str(tmp_path / "shards" / "train"))])
    assert len(rows("validation")) == 3
    assert load_label_index(str(tmp_path / "shards" / "validation")) == \
        load_label_index(str(tmp_path / "shards" / "train"))


@pytest.mark.timeout(600)
def test_the_same_dataframe_materialised_twice_at_once_is_written_once(spark, tmp_path):
    """Two calls (threads of one driver, as notebooks of a cluster) that
    materialise the same file-backed DataFrame into one output folder at the
    same moment: one set of shards with each row once, both calls pointed at
    it, no folder of the losing write left behind."""
    import threading

    from pyspark.sql import functions as F

    from dist_dl.prepare import write_digits_tree
    from dist_dl.prepare.materialise import materialise_dataframe

    train_dir, _ = write_digits_tree(str(tmp_path / "digits"), image_size=8,
                                     validation_fraction=0.95)   # about 90 images
    frame = (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
             .load(train_dir).withColumn("digit", F.regexp_extract("path", r"/(\d)/[^/]+$", 1)))
    rows = frame.count()
    out, results, go = str(tmp_path / "out"), [], threading.Barrier(2)

    def materialise():
        go.wait()
        results.append(materialise_dataframe(
            frame, None, out, image_col="content", label_col="digit", classes=None, seed=0,
            num_workers=2, validation_fraction=0.25))

    threads = [threading.Thread(target=materialise) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(500)
    assert len(results) == 2
    assert results[0][:2] == results[1][:2]          # the same shard folders
    assert os.listdir(os.path.join(out, "shards")) == [os.path.basename(
        os.path.dirname(results[0][0]))]               # no staging folder left
    written = sum(pq.read_table(os.path.join(results[0][i], name)).num_rows
                  for i in (0, 1) for name in os.listdir(results[0][i])
                  if name.endswith(".parquet"))
    assert written == rows, (written, rows)           # each row once, in one of the splits


@pytest.mark.timeout(600)
def test_max_side_stores_pre_resized_images_and_the_summary_says_so(spark, tmp_path):
    from PIL import Image

    from imagedata import sample_photo

    photo = sample_photo()  # 640 x 427
    files = {"wide/photo.jpg": encode(photo),
             "tall/photo.jpg": encode(photo.crop((0, 0, 300, 400))),
             "tall/small.jpg": encode(digit_images(1)[0][0])}
    for name, data in files.items():
        (tmp_path / "tree" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / name).write_bytes(data)
    out = tmp_path / "shards"
    summary = prepare_image_dataset(str(out), image_dir=str(tmp_path / "tree"),
                                    config=ShardConfig(max_side=200, jpeg_quality=85),
                                    spark=spark, progress_every=None)
    encoding = {"resize_short_side": None, "max_side": 200, "jpeg_quality": 85}
    assert summary.encoding == encoding
    assert json.loads((out / "_summary.json").read_text())["encoding"] == encoding
    rows = {r["source_id"]: r for r in _rows(str(out))}
    sizes = {sid: (r["width"], r["height"]) for sid, r in rows.items()}
    assert sizes == {"wide/photo.jpg": (200, 133), "tall/photo.jpg": (150, 200),
                     "tall/small.jpg": (32, 32)}
    for sid, r in rows.items():
        assert Image.open(io.BytesIO(r["image"])).size == sizes[sid]
    assert rows["tall/small.jpg"]["image"] == files["tall/small.jpg"]  # within the cap: as is


@pytest.mark.timeout(600)
def test_a_dataframe_materialised_with_max_side_is_logged_as_data_max_side(spark, tmp_path):
    """train_distributed(df, max_side=...) materialises through this; the
    run's data.* parameters come from the summary it writes."""
    from PIL import Image
    from pyspark.sql import Row

    from imagedata import sample_photo
    from dist_dl.prepare.materialise import materialise_dataframe
    from dist_dl.train.driver import _encoding_params

    photo = encode(sample_photo())
    df = spark.createDataFrame([Row(image=bytearray(photo), label=i % 2) for i in range(4)])
    train, _, rows, disposable = materialise_dataframe(
        df, None, str(tmp_path), image_col="image", label_col="label", classes=2, seed=0,
        num_workers=1, validation_fraction=0.0, max_side=64)
    assert rows["train"]["written"] == 4 and disposable is not None  # in-memory data
    assert {(r["width"], r["height"]) for r in _rows(train)} == {(64, 43)}
    assert Image.open(io.BytesIO(_rows(train)[0]["image"])).size == (64, 43)
    assert _encoding_params(train) == {"data.resize_short_side": None, "data.max_side": 64,
                                       "data.jpeg_quality": 90}
