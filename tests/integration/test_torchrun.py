"""The torch engine's per-rank training (``train_torch_rank``) under
launchers other than the library's: torch's own CLI (``python -m
torch.distributed.run``) and pyspark's own TorchDistributor, each giving the
model ``train_distributed(engine="torch")`` gives with the same settings."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra: "
                                    "profiles dbr-16.4-ml and dbr-17.3-ml)")

import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402

from dist_dl import train_distributed, train_torch_rank  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.profile_subset_164

# Settings under which a run is a pure function of its inputs (test_train_torch.py's).
SETTINGS = dict(model="small_cnn", epochs=1, batch_size=4, learning_rate=0.05, augment=False,
                shuffle=False, deterministic=True, warmup_epochs=0, lr_schedule="constant",
                momentum=0.9, image_size=16, reader="arrow")


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """The library's own runner: two local torch workers."""
    out = tmp_path_factory.mktemp("reference")
    return train_distributed(shards, engine="torch", backend="local", num_workers=2,
                             tracking_uri=(out / "mlruns").as_uri(), output_dir=str(out),
                             **SETTINGS)


def _weights(trained) -> dict:
    return {k: v.detach().numpy() for k, v in trained.torch_model().state_dict().items()}


def _assert_same_model(a, b) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    difference = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
    assert difference < 1e-5, f"largest weight difference {difference:.2e}"


SCRIPT = """
import pickle, sys
from dist_dl import train_torch_rank

trained = train_torch_rank(sys.argv[1], tracking_uri=sys.argv[2], output_dir=sys.argv[3],
                           **{settings!r})
if trained is not None:
    with open(sys.argv[4], "wb") as f:
        pickle.dump(trained, f)
"""


@pytest.mark.timeout(420)
def test_torchrun_trains_the_same_model_as_train_distributed(shards, reference, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(settings=SETTINGS)))
    result = tmp_path / "trained.pkl"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), shards, (tmp_path / "mlruns").as_uri(), str(tmp_path / "out"),
         str(result)], env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(result, "rb") as f:
        trained = pickle.load(f)
    assert trained.num_workers == 2 and trained.attempts == 1
    _assert_same_model(trained, reference)


def pyspark_rank(shards, store, out):
    return train_torch_rank(shards, tracking_uri=store, output_dir=out, **SETTINGS)


@pytest.mark.timeout(420)
def test_pysparks_own_torch_distributor_trains_the_same_model(shards, reference, spark,
                                                              tmp_path):
    from pyspark import cloudpickle as pyspark_cloudpickle
    from pyspark.ml.torch.distributor import TorchDistributor

    # pyspark ships the function with its own copy of cloudpickle.
    pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
    trained = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        pyspark_rank, shards, (tmp_path / "mlruns").as_uri(), str(tmp_path / "out"))
    _assert_same_model(trained, reference)


def test_outside_a_launcher_it_says_what_to_use(shards, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match=r"RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
                       r"MASTER_PORT unset here.*torch.distributed.run"):
        train_torch_rank(shards)
