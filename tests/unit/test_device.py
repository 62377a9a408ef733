"""Device plans and cycle-time defaults, both sides of the GPU seam (no GPU
here: plans are pure)."""
import pytest

from dist_dl.core.placement import Place, launcher_place
from dist_dl.launch.core.device import (CPU_CYCLE_TIME_MS, CPU_LARGE_MODEL_CYCLE_TIME_MS,
                                   DEFAULT_CYCLE_TIME_VAR, LARGE_GRADIENT_BYTES, cpu_cycle_time_ms,
                                   default_cycle_time, horovod_env_fixes, plan_devices,
                                   visible_gpus)


def test_gpu_host_gives_each_worker_its_local_rank_gpu():
    plans = [plan_devices(r, 4, gpus=["0", "1", "2", "3"], cpu_count=32) for r in range(4)]
    assert [p.gpu for p in plans] == ["0", "1", "2", "3"]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0", "1", "2", "3"]
    assert all(p.threads == 8 for p in plans)


def test_gpu_ids_from_spark_resources_are_respected():
    # A task given GPUs 5 and 7 (CUDA_VISIBLE_DEVICES=5,7): local rank 1 gets 7.
    assert plan_devices(1, 2, gpus=["5", "7"], cpu_count=8).env["CUDA_VISIBLE_DEVICES"] == "7"


def test_a_task_with_gpus_of_its_own_takes_its_first_whatever_its_local_rank():
    # Spark's GPU scheduling gave the task of local rank 1 (of 2) GPU 6.
    plan = plan_devices(1, 2, gpus=["6"], cpu_count=8, own_gpus=True)
    assert plan.gpu == "6" and plan.env["CUDA_VISIBLE_DEVICES"] == "6"
    assert plan.threads == 4  # the host's cores are still shared by local rank


@pytest.mark.timeout(60)
def test_tf_worker_in_a_spark_task_with_its_own_gpu_is_given_that_gpu():
    # In a fresh process: prepare_environment changes os.environ for good.
    import json
    import os
    import subprocess
    import sys

    tf_config = json.dumps({"cluster": {"worker": ["h:1", "h:2"]},
                            "task": {"type": "worker", "index": 1}})
    code = ("import os; from dist_dl.launch.core.worker import WorkerOptions, prepare_environment; "
            "prepare_environment(WorkerOptions(job_id='x', engine='tensorflow')); "
            "print(os.environ['CUDA_VISIBLE_DEVICES'], 'HOROVOD_CYCLE_TIME' in os.environ)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
    env.update(TF_CONFIG=tf_config, DIST_DL_TASK_GPUS="6")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=50, check=True).stdout
    assert out.split() == ["6", "False"]  # and no Horovod setting on this engine


def test_more_workers_than_gpus_is_a_clear_error():
    with pytest.raises(ValueError, match=r"3 workers on this host but only 2 GPU"):
        plan_devices(0, 3, gpus=["0", "1"], cpu_count=8)


def test_cpu_host_shares_cores_and_can_pin():
    plans = [plan_devices(r, 2, gpus=[], cpu_count=8, pin_cpus=True) for r in range(2)]
    assert [p.gpu for p in plans] == [None, None]
    assert "CUDA_VISIBLE_DEVICES" not in plans[0].env
    assert [p.threads for p in plans] == [4, 4]
    assert plans[0].cpus == (0, 1, 2, 3) and plans[1].cpus == (4, 5, 6, 7)
    assert plans[0].env["TF_NUM_INTRAOP_THREADS"] == "4"
    assert plan_devices(0, 4, gpus=[], cpu_count=2).threads == 1  # never zero
    assert plan_devices(0, 2, gpus=[], cpu_count=8, threads=1).env["OMP_NUM_THREADS"] == "1"


def test_launcher_place_from_horovod_or_open_mpi_variables():
    assert launcher_place({"HOROVOD_RANK": "3", "HOROVOD_LOCAL_RANK": "1",
                           "HOROVOD_LOCAL_SIZE": "2"}) == Place(3, 1, 2)
    # Open MPI's mpirun (Databricks' HorovodRunner starts workers with it).
    mpi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert launcher_place(mpi) == Place(5, 1, 4)
    # Horovod's own variables first, as Horovod reads them.
    assert launcher_place({**mpi, "HOROVOD_RANK": "0", "HOROVOD_LOCAL_RANK": "0"}).rank == 0
    # No local size: at least enough workers for this local rank.
    assert launcher_place({"HOROVOD_RANK": "3", "HOROVOD_LOCAL_RANK": "2"}) == Place(3, 2, 3)
    # A rank without a local rank is no place (the worker asks Horovod instead).
    assert launcher_place({"HOROVOD_RANK": "3"}) is None
    assert launcher_place({}) is None


def test_launcher_place_from_tf_config():
    import json

    def config(workers, index, kind="worker"):
        return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                         "task": {"type": kind, "index": index}})}

    # Two hosts, two workers each: the local rank counts the workers on the same host.
    workers = ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.1:2223", "10.0.0.2:2223"]
    assert launcher_place(config(workers, 0)) == Place(0, 0, 2)
    assert launcher_place(config(workers, 3)) == Place(3, 1, 2)
    assert launcher_place(config(["127.0.0.1:20001"], 0)) == Place(0, 0, 1)
    # Horovod's variables win (a Horovod job started from a tf.distribute worker).
    assert launcher_place({**config(workers, 3), "HOROVOD_RANK": "0",
                           "HOROVOD_LOCAL_RANK": "0"}).rank == 0
    # Not a worker of a cluster, or not JSON: no place.
    assert launcher_place(config(workers, 0, kind="chief")) is None
    assert launcher_place(config(workers, 9)) is None
    assert launcher_place({"TF_CONFIG": "{not json"}) is None


@pytest.mark.timeout(120)
def test_the_rank_that_writes_comes_from_horovod_or_the_launcher_or_is_0():
    # A fresh process: Horovod may have been initialised in this one by a test
    # that runs a worker in-process, and then its rank would answer.
    import subprocess
    import sys

    code = ("from dist_dl.core.placement import process_rank; "
            "print(process_rank({'OMPI_COMM_WORLD_RANK': '5', 'OMPI_COMM_WORLD_LOCAL_RANK': '1'}),"
            " process_rank({}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, check=True).stdout
    assert out.split() == ["5", "0"]


def test_workers_started_by_mpirun_get_their_local_rank_gpu_and_share_of_cores(monkeypatch):
    import os

    from dist_dl.launch.core.worker import WorkerOptions, _rank, prepare_environment

    # The worker's environment as mpirun gives it to local rank 1 of 2 on a
    # host with GPUs 0 and 1 (os.environ replaced by a copy: prepare_environment
    # changes it in place).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "DIST_DL_"))}
    env.update({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0,1"})
    monkeypatch.setattr(os, "environ", env)
    plan = prepare_environment(WorkerOptions(job_id="t"))
    assert plan.gpu == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert plan.threads == max(1, len(os.sched_getaffinity(0)) // 2)
    assert _rank() == 3
    assert "HOROVOD_CYCLE_TIME" not in env  # a GPU worker keeps Horovod's default


def test_visible_gpus_reads_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_horovod_tuple_values_are_dropped():
    env = {"HOROVOD_CYCLE_TIME": "(None,)", "HOROVOD_CACHE_CAPACITY": "(None,)",
           "HOROVOD_FUSION_THRESHOLD": "67108864"}
    assert sorted(horovod_env_fixes(env)) == ["HOROVOD_CACHE_CAPACITY", "HOROVOD_CYCLE_TIME"]
    assert horovod_env_fixes({"HOROVOD_CYCLE_TIME": "3.5"}) == []


@pytest.mark.timeout(30)
def test_cpu_workers_get_the_default_cycle_time_and_a_marker_beside_it():
    assert cpu_cycle_time_ms() == CPU_CYCLE_TIME_MS == 5.0
    assert cpu_cycle_time_ms(LARGE_GRADIENT_BYTES - 1) == 5.0
    assert cpu_cycle_time_ms(LARGE_GRADIENT_BYTES) == CPU_LARGE_MODEL_CYCLE_TIME_MS == 20.0
    env = {}
    assert default_cycle_time(env, chosen=False, gpus=[]) == "5.0"
    assert env == {"HOROVOD_CYCLE_TIME": "5.0", DEFAULT_CYCLE_TIME_VAR: "5.0"}
    # The training worker, knowing its model, raises the launcher's default.
    assert default_cycle_time(env, chosen=False, gpus=[], gradient_bytes=94 * 2 ** 20) == "20.0"
    assert env == {"HOROVOD_CYCLE_TIME": "20.0", DEFAULT_CYCLE_TIME_VAR: "20.0"}
    # GPU workers keep Horovod's default, even after an earlier job's CPU
    # default in the same process.
    assert default_cycle_time(env, chosen=False, gpus=["0"]) is None
    assert env == {}


@pytest.mark.timeout(30)
def test_a_cycle_time_someone_chose_is_never_replaced():
    # Inherited from the environment (not ours: no marker), even the default's value.
    env = {"HOROVOD_CYCLE_TIME": "5.0"}
    assert default_cycle_time(env, chosen=False, gpus=[], gradient_bytes=2 ** 30) is None
    assert env == {"HOROVOD_CYCLE_TIME": "5.0"}
    # Set for the job, over an earlier job's default (marker with the same value).
    env = {"HOROVOD_CYCLE_TIME": "5.0", DEFAULT_CYCLE_TIME_VAR: "5.0"}
    assert default_cycle_time(env, chosen=True, gpus=[], gradient_bytes=2 ** 30) is None
    assert env == {"HOROVOD_CYCLE_TIME": "5.0"}
    # Changed after the launcher set its default (the marker no longer matches).
    env = {"HOROVOD_CYCLE_TIME": "8", DEFAULT_CYCLE_TIME_VAR: "5.0"}
    assert default_cycle_time(env, chosen=False, gpus=[], gradient_bytes=2 ** 30) is None
    assert env == {"HOROVOD_CYCLE_TIME": "8"}
    # Chosen but dropped as malformed by horovod_env_fixes: Horovod's own default.
    env = {}
    assert default_cycle_time(env, chosen=True, gpus=[]) is None and env == {}
