"""Reading shards by rank: round trip, interoperability, uneven shards, errors;
each reading test with both readers (Petastorm and arrow)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow.parquet as pq
import pytest

from imagedata import seen_once, write_imagenet_tree, write_tree_shards

from dist_dl.prepare import ShardConfig, load_label_index, make_synthetic_images, \
    prepare_image_dataset
from dist_dl.prepare.schema import arrow_schema
from dist_dl.read import ReaderConfig, make_dataset, plan_shards, resolve_files, steps_per_epoch

SMALL = ReaderConfig(image_size=16, shuffle_buffer=8)


@pytest.fixture(params=["petastorm", "arrow"])
def reader(request):
    """Each reading test runs with both readers."""
    return request.param


def _epoch(url, rank, size, batch, reader, num_epochs=1, config=SMALL, **kwargs):
    """Every batch of ``num_epochs`` epochs on one rank, as numpy."""
    ds = make_dataset(url, rank, size, batch, num_epochs=num_epochs,
                      config=dataclasses.replace(config, reader=reader), with_weights=True,
                      include_source_id=True, **kwargs)
    return [(x["image"].numpy(), x["source_id"].numpy(), y.numpy(), w.numpy())
            for x, y, w in ds]


def _seen_once(batches):
    """source_id -> label of rows with weight 1, checking each is seen once."""
    return seen_once((sid, y, w) for _, ids, ys, ws in batches for sid, y, w in zip(ids, ys, ws))


@pytest.fixture(scope="module")
def tree_shards(tmp_path_factory):
    """An ImageNet-layout tree written as Parquet shards through Spark."""
    return write_tree_shards(str(tmp_path_factory.mktemp("tree")))


@pytest.mark.profile_subset_164
@pytest.mark.timeout(600)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.needs("tensorflow")
def test_round_trip_every_image_once_per_epoch_with_its_label(tree_shards, training, reader):
    url, written = tree_shards
    index = load_label_index(url)
    size, batch = 2, 3
    steps = steps_per_epoch(url, size, batch)
    batches = [_epoch(url, rank, size, batch, reader, training=training) for rank in range(size)]
    assert [len(b) for b in batches] == [steps, steps]
    labels = _seen_once(batches[0] + batches[1])
    assert labels == {sid: index[wnid] for sid, wnid in written.items()}
    image = batches[0][0][0]
    assert image.shape == (batch, 16, 16, 3) and image.dtype == np.float32
    assert -3 < image.mean() < 3  # normalised, not raw 0..255


@pytest.mark.profile_subset_164
@pytest.mark.timeout(600)
@pytest.mark.needs("tensorflow")
def test_evaluation_order_is_repeatable(tree_shards, reader):
    url, _ = tree_shards
    # make_dataset's contract: the arrow reader keeps the plan's order with any
    # number of threads, Petastorm only with one (its pool hands out row groups
    # as threads finish them: with two threads Petastorm 0.12.1, runtime
    # 15.4's, came back in another order every run).
    config = SMALL if reader == "arrow" else dataclasses.replace(SMALL, reader_threads=1)
    first = [ids.tolist() for _, ids, _, _ in _epoch(url, 0, 2, 3, reader, config=config,
                                                     training=False)]
    assert first == [ids.tolist() for _, ids, _, _ in _epoch(url, 0, 2, 3, reader,
                                                             config=config, training=False)]


@pytest.mark.profile_subset_164
@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_uint8_pixels_through_the_models_first_layer_are_the_normalised_images(tree_shards):
    """normalize=False ends the CPU's work at uint8 pixels; the classifier the
    engines build (pixel_normalization, then the network) gives on them what
    the network gives on the normalised images of normalize=True."""
    import tensorflow as tf

    from dist_dl.train.models import build_classifier, pixel_normalization

    url, _ = tree_shards
    config = dataclasses.replace(SMALL, reader_threads=1)
    pixels_config = dataclasses.replace(config, normalize=False)
    normalised = _epoch(url, 0, 1, 4, "arrow", config=config, training=False)
    pixels = _epoch(url, 0, 1, 4, "arrow", config=pixels_config, training=False)
    assert len(pixels) == len(normalised) > 0
    tf.keras.utils.set_random_seed(0)
    model = build_classifier("small_cnn", pixels_config, 3)
    net = model.get_layer("small_cnn")
    for (images, ids, _, _), (floats, same_ids, _, _) in zip(pixels, normalised):
        assert images.dtype == np.uint8 and floats.dtype == np.float32
        assert ids.tolist() == same_ids.tolist()
        np.testing.assert_allclose(pixel_normalization(pixels_config)(images).numpy(), floats,
                                   atol=1e-5)
        np.testing.assert_allclose(model(images, training=False).numpy(),
                                   net(floats, training=False).numpy(), atol=1e-4)


@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_input_waits_are_the_consumers_waits_for_each_batch(tree_shards):
    """The pipeline's timed end records one wait per batch taken, in the
    thread that takes it: about the producer's time per batch when the
    consumer is fast and the producer slow, about nothing when the batches
    are ready in the prefetch buffer before they are asked for."""
    import statistics
    import time

    import tensorflow as tf

    from dist_dl.read.dataset import InputWaits, _timed

    def slow(x):
        time.sleep(0.1)
        return x

    waits = InputWaits()
    producer = tf.data.Dataset.range(4).map(lambda x: tf.py_function(slow, [x], tf.int64))
    assert [int(x) for x in _timed(tf, producer, waits)] == [0, 1, 2, 3]
    assert len(waits.waited) == 4 and min(waits.waited) >= 0.09, waits.waited

    url, _ = tree_shards
    waits = InputWaits()
    taken = 0
    for _ in make_dataset(url, 0, 1, 4, training=False, num_epochs=1, waits=waits,
                          config=dataclasses.replace(SMALL, reader="arrow")):
        taken += 1
        time.sleep(0.2)  # the 16-pixel batches are ready long before
    assert taken > 2 and len(waits.waited) == taken
    # The first batch waits for the reader to start; the others were ready
    # (the median: one batch's wait may take a scheduling delay on 2 cores).
    assert statistics.median(waits.waited[1:]) < 0.02, waits.waited


@pytest.mark.profile_subset_164
@pytest.mark.needs("petastorm")
@pytest.mark.timeout(600)
def test_shards_open_with_plain_spark_and_petastorm(spark, tree_shards):
    from petastorm import make_batch_reader

    url, written = tree_shards
    df = spark.read.parquet(url)
    assert df.count() == len(written)
    assert [f.name for f in df.schema.fields] == arrow_schema().names
    # num_epochs=None and one ordered worker: with num_epochs=1, petastorm
    # 0.13.1's thread pool can end the epoch early (see
    # dist_dl.read.rows._batch_reader); this reads the first epoch exactly.
    ids = []
    with make_batch_reader("file://" + url, num_epochs=None, workers_count=1,
                           shuffle_row_groups=False) as reader:
        while len(ids) < len(written):
            ids += [sid for sid in next(reader).source_id]
    assert sorted(ids) == sorted(written)


@pytest.mark.profile_subset_164
@pytest.mark.needs("tensorflow")
def test_delta_table_opens_with_deltalake_and_reads_at_an_older_version(tmp_path, reader):
    from deltalake import DeltaTable

    table = str(tmp_path / "table")
    make_synthetic_images(table, rows=6, image_size=16, classes=2, format="delta",
                          rows_per_row_group=2, seed=1)
    make_synthetic_images(table, rows=4, image_size=16, classes=2, format="delta",
                          mode="append", rows_per_row_group=2, seed=2)
    dt = DeltaTable(table)
    assert dt.version() == 1
    assert sum(dt.get_add_actions(flatten=True)["num_records"].to_pylist()) == 10
    assert len(resolve_files(table)) == 5 and len(resolve_files(table, version=0)) == 3
    old = _seen_once(_epoch(table, 0, 1, 2, reader, version=0, training=False))
    assert sorted(old) == [f"synthetic-1-{i}" for i in range(6)]
    new = _seen_once(_epoch(table, 0, 1, 2, reader, training=False))
    assert len(new) == 10
    # An overwrite makes a new version; the old one stays readable.
    make_synthetic_images(table, rows=2, image_size=16, classes=2, format="delta",
                          mode="overwrite", seed=3)
    assert len(_seen_once(_epoch(table, 0, 1, 2, reader, training=False))) == 2
    assert len(_seen_once(_epoch(table, 0, 1, 2, reader, version=1, training=False))) == 10


@pytest.mark.profile_subset_164
@pytest.mark.timeout(600)
@pytest.mark.needs("tensorflow")
def test_delta_through_spark_reads_back(spark, tmp_path, reader):
    from deltalake import DeltaTable

    write_imagenet_tree(str(tmp_path / "train"), per_class=2, variety=False)
    summary = prepare_image_dataset(str(tmp_path / "table"), image_dir=str(tmp_path / "train"),
                                    format="delta", config=ShardConfig(rows_per_row_group=2),
                                    spark=spark)
    assert summary.delta_version == 0 and DeltaTable(str(tmp_path / "table")).version() == 0
    assert len(_seen_once(_epoch(str(tmp_path / "table"), 0, 2, 1, reader)
                          + _epoch(str(tmp_path / "table"), 1, 2, 1, reader))) == 6


def _handmade(path, sizes):
    """One single-row-group file per size (0 writes a file with no row group)."""
    os.makedirs(path, exist_ok=True)
    make_synthetic_images(str(path) + "-src", rows=sum(sizes), image_size=16, classes=3,
                          rows_per_row_group=max(sum(sizes), 1))
    rows = pq.ParquetDataset(str(path) + "-src").read()
    start = 0
    for i, n in enumerate(sizes):
        pq.write_table(rows.slice(start, n), os.path.join(path, f"part-{i}.parquet"))
        start += n
    return str(path)


@pytest.mark.profile_subset_164
@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_uneven_shards_and_an_empty_file_give_equal_batch_counts(tmp_path, reader):
    url = _handmade(tmp_path / "uneven", [10, 3, 0])
    plan = plan_shards(url, 2, 4)
    assert plan.rows_per_rank == (10, 3) and plan.steps_per_epoch == 3
    batches = [_epoch(url, rank, 2, 4, reader) for rank in range(2)]
    assert [len(b) for b in batches] == [3, 3]
    assert len(_seen_once(batches[0] + batches[1])) == 13
    assert sum(w.sum() for *_, w in batches[1]) == 3  # 3 real rows, 9 repeated with weight 0
    # policy "drop": floor(3 / 2) = 1 batch each, no repeats.
    drop = steps_per_epoch(url, 2, 2, policy="drop")
    assert drop == 1
    assert [len(_epoch(url, r, 2, 2, reader, steps_per_epoch=drop)) for r in range(2)] == [1, 1]
    with pytest.raises(ValueError, match="policy='drop' with batch_size=4 gives 0 steps"):
        steps_per_epoch(url, 2, 4, policy="drop")


@pytest.mark.profile_subset_164
@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_cache_serves_later_epochs_from_local_disk(tmp_path, reader):
    url = str(tmp_path / "syn")
    make_synthetic_images(url, rows=6, image_size=16, classes=2, rows_per_row_group=3)
    ds = make_dataset(url, 0, 2, 3, num_epochs=2, config=dataclasses.replace(SMALL, reader=reader),
                      training=False,
                      cache_dir=str(tmp_path / "cache"), include_source_id=True)
    it = iter(ds)
    first = next(it)[0]["source_id"].numpy().tolist()
    shutil.rmtree(url)  # the second epoch can only come from the cache
    second = next(it)[0]["source_id"].numpy().tolist()
    assert first == second
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.profile_subset_164
@pytest.mark.needs("tensorflow")
def test_driver_side_errors_name_the_problem_and_the_fix(tmp_path):
    url = str(tmp_path / "syn")
    make_synthetic_images(url, rows=6, image_size=16, classes=3, rows_per_row_group=3)
    with pytest.raises(ValueError, match=r"2 row groups but there are 3 workers.*"
                                         r"rows_per_row_group<=2"):
        plan_shards(url, 3, 1)
    with pytest.raises(ValueError, match=r"'label' has 2 values outside \[0, 2\)"):
        plan_shards(url, 2, 1, classes=2)
    with pytest.raises(ValueError, match="not a Delta table"):
        plan_shards(url, 2, 1, version=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plan_shards(str(tmp_path / "nowhere"), 2, 1)
    table = pq.read_table(resolve_files(url)[0][len("file://"):])
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(table.drop(["label"]), bad / "a.parquet")
    with pytest.raises(ValueError, match="no 'label' column"):
        plan_shards(str(bad), 1, 1)
    pq.write_table(table.set_column(1, "label", table["label_name"]), bad / "a.parquet")
    with pytest.raises(ValueError, match="column 'label' of the shards has type string"):
        plan_shards(str(bad), 1, 1)
    pq.write_table(table.slice(0, 0), bad / "a.parquet")
    with pytest.raises(ValueError, match="has no rows"):
        plan_shards(str(bad), 1, 1)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        make_dataset(url, 2, 2, 1)
    with pytest.raises(ValueError, match="image_size"):
        ReaderConfig(image_size=0)


@pytest.mark.profile_subset_164
@pytest.mark.needs("petastorm")
@pytest.mark.timeout(600)
def test_both_readers_give_each_rank_the_same_rows_and_steps_every_epoch(tree_shards):
    url, written = tree_shards
    size, batch, epochs = 2, 3, 2
    steps = steps_per_epoch(url, size, batch)
    # A one-row shuffle buffer: rows stay in their epoch (a larger buffer
    # mixes the next epoch's first rows into this one's last batches).
    unmixed = dataclasses.replace(SMALL, shuffle_buffer=1)
    rows = {}
    for reader in ("petastorm", "arrow"):
        for rank in range(size):
            batches = _epoch(url, rank, size, batch, reader, num_epochs=epochs, config=unmixed,
                             seed=rank)
            assert len(batches) == steps * epochs, (reader, rank)
            rows[reader, rank] = [_seen_once(batches[e * steps:(e + 1) * steps])
                                  for e in range(epochs)]
    for rank in range(size):
        petastorm, arrow = rows["petastorm", rank], rows["arrow", rank]
        assert petastorm == arrow and petastorm[0] == petastorm[1], rank
    assert sorted(rows["arrow", 0][0] | rows["arrow", 1][0]) == sorted(written)


@pytest.mark.profile_subset_164
def test_arrow_row_group_order_is_seeded_per_epoch(tree_shards):
    import numpy as np

    from dist_dl.read.arrow import ArrowShard

    url, _ = tree_shards
    shard = ArrowShard(resolve_files(url), 0, 2, threads=2)

    def order(seed, epoch):
        one_pass = shard.passes(np.random.default_rng([seed, epoch]))
        return [ids.tolist() for _, _, ids in one_pass()]

    plan_order = [ids.tolist() for _, _, ids in shard.passes(None)()]
    assert order(7, 0) == order(7, 0)  # threads read ahead, the order stays the seed's
    assert order(7, 0) != order(7, 1)
    assert sorted(map(tuple, order(7, 0))) == sorted(map(tuple, plan_order))


@pytest.mark.profile_subset_164
@pytest.mark.timeout(120)
@pytest.mark.needs("tensorflow")
def test_a_resumed_arrow_reader_continues_the_row_group_orders(tree_shards):
    # A run resumed after epoch 1 reads epoch 2 in the order an uninterrupted
    # run would (the shuffle buffer of 1 row keeps the row-group order visible).
    url, _ = tree_shards
    config = ReaderConfig(image_size=16, reader="arrow", shuffle_buffer=1)

    def epochs(initial_epoch, num_epochs):
        ds = make_dataset(url, 0, 2, 2, training=True, config=config, seed=7,
                          num_epochs=num_epochs, include_source_id=True,
                          initial_epoch=initial_epoch, steps_per_epoch=2)
        ids = [features["source_id"].numpy().tolist() for features, _ in ds]
        return [sum(ids[i:i + 2], []) for i in range(0, len(ids), 2)]

    uninterrupted = epochs(0, 2)
    assert uninterrupted[0] != uninterrupted[1]  # a new order each epoch
    assert epochs(1, 1) == [uninterrupted[1]]
    with pytest.raises(ValueError, match="initial_epoch must be an int >= 0"):
        make_dataset(url, 0, 2, 2, config=config, initial_epoch=-1)


# Put first on a child's PYTHONPATH, this makes Petastorm unimportable in it
# and in every process it starts (the training workers too), as on Databricks
# 16.4 and 17.3 LTS ML.
_NO_PETASTORM = '''
import sys


class _NoPetastorm:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "petastorm":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by a test)",
                                      name=name)
        return None


sys.meta_path.insert(0, _NoPetastorm())
'''

_AUTO_CHILD = '''
import sys

from dist_dl import train_distributed
from dist_dl.read import choose_reader

url, store, out = sys.argv[1:]
try:
    import petastorm  # noqa: F401
    raise SystemExit("petastorm imported although blocked")
except ModuleNotFoundError:
    pass
assert choose_reader("auto") == "arrow"
try:
    train_distributed(url, reader="petastorm", num_workers=2, backend="local",
                      tracking_uri=store, output_dir=out)
    raise SystemExit("reader='petastorm' ran without Petastorm")
except ImportError as exc:
    print("PETASTORM ERROR:", exc, flush=True)
trained = train_distributed(url, model="small_cnn", epochs=2, num_workers=2, batch_size=4,
                            image_size=16, validation_fraction=0.0, warmup_epochs=0,
                            backend="local", tracking_uri=store, output_dir=out)
print("TRAINED", len(trained.history["loss"]), flush=True)
'''


@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_petastorm_auto_reads_with_arrow_and_training_completes(tmp_path):
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(_NO_PETASTORM)
    url = str(tmp_path / "shards")
    make_synthetic_images(url, rows=24, image_size=16, classes=3, rows_per_row_group=4)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(block)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_AUTO_CHILD), url, (tmp_path / "mlruns").as_uri(),
         str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pip install 'dist_dl[petastorm]'" in done.stdout and "reader='arrow'" in done.stdout
    assert "TRAINED 2" in done.stdout


_GRAPH_CODE_CHILD = '''
import pathlib, sys, tempfile
import tensorflow as tf
from dist_dl.core import compat
from dist_dl.read import ReaderConfig, make_dataset
from dist_dl.read.dataset import InputWaits
from dist_dl.tracking import ImagePreprocessing, decode_images
from dist_dl.train.engines.keras_common import validation_callback

url = sys.argv[1]
config = ReaderConfig(image_size=16, shuffle_buffer=8, reader="arrow")
train = make_dataset(url, 0, 1, 4, training=True, num_epochs=1, with_weights=True,
                     waits=InputWaits(), config=config)
images, labels, weights = next(iter(train))
assert images.shape == (4, 16, 16, 3), images.shape
valid = make_dataset(url, 0, 1, 4, training=False, num_epochs=1, with_weights=True,
                     config=config)
keras = compat.keras()
model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
check = validation_callback(tf, valid, 2)
check.set_model(model)
logs = {}
check.on_epoch_end(0, logs)
assert 0 <= logs["val_accuracy"] <= 1, logs
blob = tf.io.encode_png(tf.zeros([8, 8, 1], tf.uint8)).numpy()
pixels = decode_images([blob] * 3, ImagePreprocessing(image_size=8, channels=1))
assert pixels.shape == (3, 8, 8, 1), pixels.shape
print("GENERATED", sorted(p.name for p in pathlib.Path(tempfile.gettempdir())
                          .glob("__autograph_generated_file*")))
'''


@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_the_library_s_graph_code_is_traced_without_an_autograph_rewrite(tmp_path):
    """The reader's map functions, the exact validation's step and the
    served model's decoder are graph code already: AutoGraph does not rewrite
    them in each worker process (each rewrite writes its generated source to
    a file in the temporary folder; a fresh process, its own folder)."""
    url = str(tmp_path / "shards")
    make_synthetic_images(url, rows=24, image_size=16, classes=3, rows_per_row_group=4)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-c", _GRAPH_CODE_CHILD, url],
                          env=dict(os.environ, TMPDIR=str(scratch)), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "GENERATED []" in done.stdout, done.stdout[-3000:]
