"""Mosaic Streaming (MDS) datasets as input: written by streaming's own
``dataframe_to_mds`` from a real Spark DataFrame (zstd-compressed shards, the
converter's default), read by the torch loader (every row once across the
ranks, the same steps on every rank, the same rows in a resumed epoch) and
trained on by ``train_distributed(engine="torch")`` on two real workers."""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys

import pandas as pd
import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra)")
if importlib.util.find_spec("streaming") is None:  # importing it takes seconds
    pytest.skip("mosaicml-streaming is not installed in this profile (the `mds` extra)",
                allow_module_level=True)

import torch  # noqa: E402

import mds_writer  # noqa: E402
from dist_dl import train_distributed  # noqa: E402
from dist_dl.read import ReaderConfig, make_loader  # noqa: E402
from dist_dl.read.mds import mds_shards  # noqa: E402
from dist_dl.read.torchdata import Normalize  # noqa: E402
from imagedata import digit_images, encode  # noqa: E402

# The fixture starts a Spark of its own whose Python worker imports streaming
# (torch, transformers) to run dataframe_to_mds: about 20 s on an idle 2-core
# machine, minutes on a loaded one. The three tests share it (module scope).
# In the CI stages of the profiles that install the `mds` extra (16.4, 17.3, 18).
pytestmark = [pytest.mark.timeout(900), pytest.mark.profile_subset_164,
              pytest.mark.xdist_group("mds_dataset")]

COLUMNS = {"jpeg": "bytes", "y": "int64", "id": "str"}


def _frame(images, first: int) -> pd.DataFrame:
    return pd.DataFrame({"jpeg": [encode(img) for img, _ in images],
                         "y": [int(label) % 3 for _, label in images],
                         "id": [f"row{first + i}" for i in range(len(images))]})


@pytest.fixture(scope="module")
def mds(tmp_path_factory):
    """48 training and 13 validation images (uneven over two ranks) written
    by dataframe_to_mds; the folders and each one's id -> label."""
    base = tmp_path_factory.mktemp("mds")
    images = digit_images(61, size=16)
    frames = [_frame(images[:48], 0), _frame(images[48:], 48)]
    (base / "rows.pkl").write_bytes(pickle.dumps(frames))
    (base / "columns.json").write_text(json.dumps(COLUMNS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [mds_writer.PLACEHOLDER, os.environ.get("PYTHONPATH")])))
    outs = [str(base / "train"), str(base / "val")]
    subprocess.run([sys.executable, mds_writer.__file__, str(base / "rows.pkl"),
                    str(base / "columns.json"), *outs], env=env, check=True, timeout=840)
    return outs[0], dict(zip(frames[0]["id"], frames[0]["y"])), \
        outs[1], dict(zip(frames[1]["id"], frames[1]["y"]))


def _rows(loader):
    """(source id, label, weight) of every row of one iteration."""
    out = []
    for images, labels, weights, ids in loader:
        assert images.shape[1:] == (3, 16, 16) and images.dtype == torch.uint8
        out += list(zip(ids, labels.tolist(), weights.tolist()))
    return out


def test_the_torch_loader_reads_every_row_once_and_resumes_the_same_rows(mds):
    train, labels, _, _ = mds
    shards = mds_shards(train, image_col="jpeg", label_col="y", source_id_col="id")
    assert len(shards) > 2 and sum(s.samples for s in shards) == 48
    config = ReaderConfig(image_size=16)
    common = dict(batch_size=5, config=config, seed=7, with_weights=True, include_source_id=True)
    loaders = [make_loader(shards, rank, 2, **common) for rank in range(2)]
    assert len(loaders[0]) == len(loaders[1]) > 0
    epoch0 = [_rows(loader) for loader in loaders]
    real = [(i, label) for rows in epoch0 for i, label, weight in rows if weight == 1.0]
    assert sorted(i for i, _ in real) == sorted(labels)      # every row once, weight 1
    assert all(labels[i] == label for i, label in real)       # with its own label
    assert all(len(rows) == len(loaders[0]) * 5 for rows in epoch0)
    # A resumed attempt starting at epoch 1 reads what the first one's second epoch read.
    epoch1 = [_rows(loader) for loader in loaders]
    resumed = [_rows(make_loader(shards, rank, 2, epoch=1, **common)) for rank in range(2)]
    assert [[r[0] for r in rows] for rows in resumed] == [[r[0] for r in rows] for rows in epoch1]


def test_train_distributed_trains_from_an_mds_dataset_on_two_torch_workers(mds, tmp_path):
    train, _, val, val_labels = mds
    store = (tmp_path / "mlruns").as_uri()
    trained = train_distributed(
        train, validation=val, engine="torch", backend="local", num_workers=2, epochs=1,
        batch_size=4, image_size=16, classes=3, image_col="jpeg", label_col="y",
        augment=False, model="small_cnn", learning_rate=0.5, tracking_uri=store,
        output_dir=str(tmp_path))
    assert trained.attempts == 1 and len(trained.history["val_loss"]) == 1
    # Exact validation: the loss over every validation row once, with the
    # trained network in one process, is what the two workers summed (a
    # large rate spreads the rows' losses, so that a row missed or counted
    # twice moves the mean far beyond the tolerance; both workers validate
    # with rank 0's BatchNorm statistics, those logged).
    net = torch.nn.Sequential(Normalize(ReaderConfig(image_size=16)), trained.torch_model())
    loader = make_loader(mds_shards(val, image_col="jpeg", label_col="y"), 0, 1, 13,
                         training=False, config=ReaderConfig(image_size=16))
    (images, labels), = list(loader)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(net(images.float()), labels)
    assert trained.history["val_loss"][0] == pytest.approx(float(loss), rel=1e-5)
    assert sorted(labels.tolist()) == sorted(val_labels.values())


def test_an_mds_dataset_without_the_named_column_fails_on_the_driver(mds, tmp_path):
    train = mds[0]
    with pytest.raises(ValueError, match=r"has no column 'image' \(image_col\); its columns: "
                                         r"id, jpeg, y: set image_col"):
        train_distributed(train, engine="torch", backend="local", classes=3,
                          tracking_uri=(tmp_path / "mlruns").as_uri(), output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="column 'id' .* has encoding 'str'; expected one of int"):
        train_distributed(train, engine="torch", backend="local", classes=3, image_col="jpeg",
                          label_col="id", tracking_uri=(tmp_path / "mlruns").as_uri(),
                          output_dir=str(tmp_path))
