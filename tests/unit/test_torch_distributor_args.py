"""TorchDistributor's arguments and the torch engine's placement of workers:
no Spark job, no torch, no worker process."""
from __future__ import annotations

import pytest

import dist_dl
from dist_dl import TorchDistributor
from dist_dl.core.placement import Place, host_share, launcher_place
from dist_dl.launch.engines.torch import torch_env

pytestmark = pytest.mark.timeout(60)


def test_exported_lazily_from_the_package_and_launch():
    import dist_dl.launch

    assert "TorchDistributor" in dist_dl.__all__ and "TorchDistributor" in dist_dl.launch.__all__
    assert dist_dl.launch.TorchDistributor is TorchDistributor


@pytest.mark.parametrize("num_processes", [0, -2, False, 1.5, "2"])
def test_num_processes_must_be_a_positive_integer(num_processes):
    with pytest.raises(ValueError, match=r"^TorchDistributor: num_processes is .* positive"):
        TorchDistributor(num_processes=num_processes, use_gpu=False)


def test_pyspark_defaults_and_the_launchers_extras():
    runner = TorchDistributor(use_gpu=False)
    assert (runner.num_processes, runner.local_mode, runner.use_gpu) == (1, True, False)
    assert runner.driver_log_verbosity == "all" and runner.num_tasks == 1
    assert runner._backend.worker_gpus == [[]]  # CPU: the processes see no GPU
    with pytest.raises(TypeError, match=r"^TorchDistributor\.__init__\(\) got an unexpected"):
        TorchDistributor(np=2)
    with pytest.raises(ValueError, match=r"^TorchDistributor: timeout must be"):
        TorchDistributor(2, use_gpu=False, timeout=-1)
    with pytest.raises(ValueError, match=r"^TorchDistributor: driver_log_verbosity must be"):
        TorchDistributor(2, use_gpu=False, driver_log_verbosity="some")


def test_local_gpu_training_takes_the_drivers_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    runner = TorchDistributor(num_processes=2)
    # All processes see the chosen GPUs; each uses the one of its LOCAL_RANK.
    assert runner._backend.worker_gpus == [["3", "5"]]
    with pytest.raises(ValueError, match=r"4 processes, one per GPU, .* 3 GPU\(s\) \(3,5,7\): "
                       r"use num_processes <= 3, or use_gpu=False"):
        TorchDistributor(num_processes=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"the driver has no GPU .*pass use_gpu=False"):
        TorchDistributor(num_processes=1)


def test_bad_train_objects_fail_before_any_worker_starts(tmp_path):
    runner = TorchDistributor(num_processes=2, use_gpu=False)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    with pytest.raises(ValueError, match=r"^TorchDistributor\(num_processes=2\)\.run: a script "
                       r"takes its arguments as command-line strings .*\['lr'\]"):
        runner.run(str(script), "--epochs", "1", lr=0.1)
    with pytest.raises(ValueError, match=r"the training script .*missing\.py' is not a file"):
        runner.run(str(tmp_path / "missing.py"))
    with pytest.raises(TypeError, match=r"train_object must be a function or the path"):
        runner.run(42)


def test_torchrun_variables_of_each_place():
    layout = [2, 1]
    places = ["10.0.0.1:29400", "10.0.0.2:29401"]
    base = {"HOROVOD_RANK": "5", "HOROVOD_LOCAL_RANK": "1", "PATH": "/bin"}
    second = torch_env(base, places, 0, 1, layout)
    third = torch_env(base, places, 1, 0, layout)
    assert {k: second[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
                                   "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "RANK": "1", "LOCAL_RANK": "1",
        "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}
    assert (third["RANK"], third["LOCAL_RANK"], third["LOCAL_WORLD_SIZE"]) == ("2", "0", "1")
    # Another launcher's place would override torchrun's; the rest is kept.
    assert "HOROVOD_RANK" not in second and second["PATH"] == "/bin"
    assert launcher_place(third) == Place(2, 0, 1)
    # Cores are shared by every worker of the host, whatever its task.
    assert (second["DIST_DL_HOST_SHARE"], third["DIST_DL_HOST_SHARE"]) == ("1/2", "0/1")
    same_host = ["10.0.0.1:29400", "10.0.0.1:29401"]
    assert [torch_env({}, same_host, p, 0, [1, 1])["DIST_DL_HOST_SHARE"] for p in (0, 1)] == [
        "0/2", "1/2"]
    assert host_share(third, launcher_place(third)) == (0, 1)
    assert host_share({}, Place(3, 1, 4)) == (1, 4)


def test_gloo_and_nccl_use_the_interface_of_the_places_address_unless_set():
    from dist_dl.launch.core.network import loopback_interface

    env = torch_env({}, ["127.0.0.1:29400"], 0, 0, [2])
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == loopback_interface()
    env = torch_env({"GLOO_SOCKET_IFNAME": "eth1"}, ["127.0.0.1:29400"], 0, 0, [2])
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"
    with pytest.raises(RuntimeError, match=r"2 hosts .*'127.0.0.1', a loopback address"):
        torch_env({}, ["127.0.0.1:29400", "10.0.0.2:29400"], 1, 0, [1, 1])
