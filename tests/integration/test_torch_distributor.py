"""TorchDistributor end to end: real torch.distributed processes over Gloo,
on the driver and on the tasks of a real Spark barrier stage (local[2]).

pyspark's own cases for its TorchDistributor (its test functions and
examples that need no GPU) are written here in their shape, with only the
import and the data changed: a small synthetic image set instead of the
MNIST download.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from contextlib import nullcontext

import pytest

pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` extra: "
                                    "profiles dbr-16.4-ml and dbr-17.3-ml)")

import cloudpickle  # noqa: E402
from no_tensorflow import env_without_tensorflow  # noqa: E402
from waits import workers_left  # noqa: E402

from dist_dl import JobTimeout, NotEnoughSlots, TorchDistributor, WorkerError  # noqa: E402

# Functions defined here reach the workers by value: a Spark task cannot import tests.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.profile_subset_164, pytest.mark.profile_dbr19]

TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                      "LOCAL_WORLD_SIZE")


def _workers_left(within: float = 10.0) -> list[str]:
    """This test process's jobs' worker processes still running ``within`` s from now."""
    return workers_left(within=within)


def allreduce_and_place(scale, offset=0):
    """Sum of (rank + 1) over the job, scaled; and this process's torchrun variables."""
    import json
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    place = {name: os.environ[name] for name in (*TORCHRUN_VARIABLES, "OMP_NUM_THREADS")}
    # Gathered through tensors this function holds until the process group is
    # gone, not with all_gather_object: before torch 2.8 (pytorch/pytorch#154976)
    # the group's destructor keeps the GIL while it joins Gloo's threads, and a
    # thread that drops the last reference to a tensor made in Python needs the
    # GIL, so destroy_process_group right after all_gather_object (whose
    # tensors are dropped when it returns) deadlocks now and then (torch 2.6
    # and 2.7: profiles dbr-16.4-ml and dbr-17.3-ml).
    mine = torch.zeros(1024, dtype=torch.uint8)
    encoded = json.dumps(place).encode()
    mine[:len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}")
    dist.destroy_process_group()
    places = [json.loads(bytes(t.tolist()).rstrip(b"\0")) for t in gathered]
    return total.item() * scale + offset, places


def _check_places(places, master_addr, local_world_size):
    assert [p["RANK"] for p in places] == ["0", "1"]
    assert {p["WORLD_SIZE"] for p in places} == {"2"}
    assert {p["MASTER_ADDR"] for p in places} == {master_addr}
    assert len({p["MASTER_PORT"] for p in places}) == 1
    assert [p["LOCAL_WORLD_SIZE"] for p in places] == [str(local_world_size)] * 2


@pytest.mark.timeout(120)
def test_local_mode_runs_a_gloo_job_and_returns_rank_0s_value(capsys):
    value, places = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        allreduce_and_place, 10, offset=1)
    assert value == (1 + 2) * 10 + 1
    _check_places(places, "127.0.0.1", local_world_size=2)
    assert [p["LOCAL_RANK"] for p in places] == ["0", "1"]
    out = capsys.readouterr().out
    assert "[0]<stdout>:rank 0 of 2" in out and "[1]<stdout>:rank 1 of 2" in out


@pytest.mark.timeout(180)
def test_spark_tasks_run_a_gloo_job_and_return_rank_0s_value(spark, capsys):
    value, places = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        allreduce_and_place, 10)
    assert value == 30
    # MASTER_ADDR is rank 0's task's address, as Spark gives it.
    master = spark.sparkContext.parallelize([0], 1).barrier().mapPartitions(
        lambda _: [__import__("pyspark").BarrierTaskContext.get().getTaskInfos()[0].address]
    ).collect()[0].rsplit(":", 1)[0]
    _check_places(places, master, local_world_size=1)
    assert [p["LOCAL_RANK"] for p in places] == ["0", "0"]
    # The two tasks share this host's cores, as two processes on the driver do.
    cores = len(os.sched_getaffinity(0))
    assert {p["OMP_NUM_THREADS"] for p in places} == {str(max(1, cores // 2))}
    assert "[1]<stdout>:rank 1 of 2" in capsys.readouterr().out
    assert _workers_left() == []


@pytest.mark.timeout(180)
def test_a_spark_task_may_run_several_processes(spark):
    """What a task with several GPUs runs (spark.task.resource.gpu.amount > 1):
    one process per GPU, here on CPU: task 0 runs ranks 0 and 1, task 1 rank 2."""
    from dist_dl import HorovodRunner
    from dist_dl.launch.engines.torch import spark_backend

    runner = HorovodRunner(np=2, backend=spark_backend(spark, layout=[2, 1], gpus=[0, 0]))
    value, places = runner.run(allreduce_and_place, scale=1)
    assert value == 1 + 2 + 3
    assert [(p["RANK"], p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"], p["WORLD_SIZE"]) for p in places] \
        == [("0", "0", "2", "3"), ("1", "1", "2", "3"), ("2", "0", "1", "3")]
    # The second process of task 0 fails: the error names its rank, not its task's.
    with pytest.raises(WorkerError,
                       match=r"^HorovodRunner\(np=2\): worker rank 1 on host \S+ failed: ValueError"):
        runner.run(fail_on_rank_1)
    assert _workers_left() == []


def ddp_weights(processes: int, steps: int = 3, batch: int = 8):
    """A small model trained with DistributedDataParallel on ``batch //
    processes`` rows per process and step; its weights at the end."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size == processes
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, 6, generator=generator)
    y = (x.sum(dim=1) > 0).long()
    torch.manual_seed(1)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        rows = slice(step * batch, (step + 1) * batch)
        mine = slice(rank, None, size)  # this process's half of the step's batch
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[rows][mine]), y[rows][mine])
        loss.backward()
        optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    dist.destroy_process_group()
    return weights


@pytest.mark.timeout(180)
def test_ddp_on_two_processes_at_half_the_batch_matches_one_at_the_full_batch():
    one = TorchDistributor(1, use_gpu=False).run(ddp_weights, 1)
    two = TorchDistributor(2, use_gpu=False).run(ddp_weights, 2)
    assert float((one - two).abs().max()) < 1e-5
    assert float(one.abs().sum()) > 0


TRAINING_SCRIPT = """
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--learning-rate", type=float, required=True)
parser.add_argument("--out", required=True)
options = parser.parse_args()
dist.init_process_group("gloo")
total = torch.tensor([1.0])
dist.all_reduce(total)
print(f"rank {dist.get_rank()}: lr={options.learning_rate} sum={total.item()}")
if dist.get_rank() == 0:
    with open(options.out, "w") as f:
        f.write(f"{options.learning_rate} {total.item()} {__name__}")
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_a_script_runs_with_its_arguments_and_refuses_keyword_arguments(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINING_SCRIPT))
    out = tmp_path / "out.txt"
    distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    assert distributor.run(str(script), "--learning-rate", 0.01, f"--out={out}") is None
    assert out.read_text() == "0.01 2.0 __main__"
    printed = capsys.readouterr().out
    assert "[1]<stdout>:rank 1: lr=0.01 sum=2.0" in printed
    with pytest.raises(ValueError, match="a script takes its arguments as command-line strings"):
        distributor.run(str(script), "--learning-rate", "0.1", out=str(out))
    # A script that exits non-zero (argparse's usage error) fails the job, naming the rank.
    with pytest.raises(WorkerError, match=r"worker rank \d on host \S+ failed: SystemExit: 2"):
        distributor.run(str(script))


def fail_on_rank_1():
    import os
    import time

    if os.environ["RANK"] == "1":
        raise ValueError("rank one says no")
    time.sleep(60)  # rank 0 waits: the failure ends it


@pytest.mark.timeout(180)
def test_a_failing_rank_is_named_with_its_host_and_exception(spark):
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fail_on_rank_1)
    error = caught.value
    assert (error.rank, error.worker_type, error.worker_message) == (1, "ValueError",
                                                                      "rank one says no")
    assert error.host and "rank one says no" in error.worker_traceback
    # The runner first, as its user wrote it, then the rank and its host.
    assert str(error).startswith(f"TorchDistributor(num_processes=2, local_mode=False): "
                                 f"worker rank 1 on host {error.host} failed: ValueError"), error
    assert error.runner == "TorchDistributor(num_processes=2, local_mode=False)"
    assert time.monotonic() - started < 50
    assert _workers_left() == []


def sleep_long():
    import time

    time.sleep(120)


@pytest.mark.timeout(120)
def test_timeout_stops_every_process():
    started = time.monotonic()
    with pytest.raises(JobTimeout, match="timeout of 3 s"):
        TorchDistributor(num_processes=2, use_gpu=False, timeout=3).run(sleep_long)
    assert time.monotonic() - started < 30
    assert _workers_left() == []


@pytest.mark.timeout(120)
def test_slots_and_gpu_settings_are_checked_before_the_stage(spark):
    sc = spark.sparkContext
    jobs = len(sc.statusTracker().getJobIdsForGroup(None))
    with pytest.raises(NotEnoughSlots, match=r"^TorchDistributor\(num_processes=3, local_mode="
                       r"False\) needs 3 Spark tasks .* use num_processes <= 2 "):
        TorchDistributor(num_processes=3, local_mode=False, use_gpu=False).run(sleep_long)
    with pytest.raises(ValueError, match=r"spark.task.resource.gpu.amount is unset.*use_gpu=False"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    assert len(sc.statusTracker().getJobIdsForGroup(None)) == jobs  # no stage started


JOB_WITHOUT_TENSORFLOW = """
import sys

from dist_dl import TorchDistributor


def train(scale):
    import sys

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    assert not [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras")]
    return total.item() * scale


print("result", TorchDistributor(2, use_gpu=False).run(train, 3))
print("loaded", sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "torch", "pyspark"}))
"""


@pytest.mark.timeout(120)
def test_the_local_mode_needs_no_tensorflow_and_no_spark(tmp_path):
    env = env_without_tensorflow(tmp_path)
    (tmp_path / "job.py").write_text(JOB_WITHOUT_TENSORFLOW)
    check = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert "No module named 'tensorflow'" in check.stderr
    done = subprocess.run([sys.executable, str(tmp_path / "job.py")], env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # The driver imported neither TensorFlow nor torch nor Spark.
    assert "result 6.0" in done.stdout and "loaded []" in done.stdout


JOB_AFTER_TENSORFLOW = """
import tensorflow  # first, as a notebook that also uses Keras does

from dist_dl import TorchDistributor


def train(scale):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # torch's TCPStore: where the import order bites
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    return total.item() * scale


print("result", TorchDistributor(2, use_gpu=False).run(train, 3))
"""


@pytest.mark.timeout(180)
def test_a_driver_that_imported_tensorflow_first_runs_torch_workers(tmp_path):
    """The fork server imports what the driver imported, torch before
    TensorFlow: the other order breaks torch's TCPStore where TensorFlow
    exports its copy of std::random_device (fork/client.py's _FRAMEWORKS)."""
    pytest.importorskip("tensorflow")
    (tmp_path / "job.py").write_text(JOB_AFTER_TENSORFLOW)
    done = subprocess.run([sys.executable, str(tmp_path / "job.py")], capture_output=True,
                          text=True, timeout=150, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "result 6.0" in done.stdout


# ------------------------------------------------ pyspark's own cases, import changed


def create_training_function():
    """pyspark's test training function (a CNN under DDP with a
    DistributedSampler, one epoch, returning "success"), over 200 synthetic
    28x28 images in place of the MNIST download."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    batch_size = 100
    num_epochs = 1
    momentum = 0.5

    generator = torch.Generator().manual_seed(0)
    train_dataset = torch.utils.data.TensorDataset(
        torch.rand(200, 1, 28, 28, generator=generator),
        torch.randint(0, 10, (200,), generator=generator))

    class Net(nn.Module):
        def __init__(self) -> None:
            super(Net, self).__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
            self.conv2_drop = nn.Dropout2d()
            self.fc1 = nn.Linear(320, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
            x = x.view(-1, 320)
            x = F.relu(self.fc1(x))
            x = F.dropout(x, training=self.training)
            x = self.fc2(x)
            return F.log_softmax(x, dim=1)

    def train_fn(learning_rate):
        import torch
        import torch.distributed as dist
        import torch.optim as optim
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data.distributed import DistributedSampler

        dist.init_process_group("gloo")

        train_sampler = DistributedSampler(dataset=train_dataset)
        data_loader = torch.utils.data.DataLoader(
            train_dataset, batch_size=batch_size, sampler=train_sampler)

        model = Net()
        ddp_model = DDP(model)
        optimizer = optim.SGD(ddp_model.parameters(), lr=learning_rate, momentum=momentum)
        for epoch in range(1, num_epochs + 1):
            model.train()
            for _, (data, target) in enumerate(data_loader):
                optimizer.zero_grad()
                output = model(data)
                loss = F.nll_loss(output, target)
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch} finished.")

        return "success"

    return train_fn


@pytest.mark.timeout(180)
def test_pysparks_end_to_end_runs_locally_and_distributedly(spark, capsys):
    train_fn = create_training_function()
    output = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train_fn, 0.001)
    assert output == "success"
    output = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        train_fn, 0.001)
    assert output == "success"
    assert "[1]<stdout>:epoch 1 finished." in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_pysparks_inputs_tasks_and_encryption_checks(spark):
    with pytest.raises(ValueError, match="positive"):
        TorchDistributor(0, False, False)
    for num_processes, local_mode in ((1, True), (100, True), (1, False), (100, False)):
        distributor = TorchDistributor(num_processes, local_mode, False)
        assert (distributor.num_processes, distributor.local_mode, distributor.use_gpu,
                distributor.num_tasks) == (num_processes, local_mode, False, num_processes)
    conf = spark.sparkContext._jsc.sc().conf()  # the live configuration the runners read
    try:
        # test_get_num_tasks_distributed: ceil(num_processes / GPUs per task) tasks.
        for amount, num_processes, tasks in ((1, 8, 8), (2, 8, 4), (3, 8, 3)):
            conf.set("spark.task.resource.gpu.amount", str(amount))
            assert TorchDistributor(num_processes, False, True).num_tasks == tasks
        # test_encryption_passes / test_encryption_fails.
        for ssl, ignore in (("false", "true"), ("false", "false"), ("true", "true")):
            conf.set("spark.ssl.enabled", ssl)
            conf.set("pytorch.spark.distributor.ignoreSsl", ignore)
            warns = pytest.warns(UserWarning, match="not encrypted")
            with warns if ssl == "true" else nullcontext():
                TorchDistributor(1, False, False)._check_encryption()
        conf.set("spark.ssl.enabled", "true")
        conf.set("pytorch.spark.distributor.ignoreSsl", "false")
        with pytest.raises(RuntimeError, match="encryption.*pytorch.spark.distributor.ignoreSsl"):
            TorchDistributor(2, False, False).run(lambda: None)
    finally:
        for key in ("spark.task.resource.gpu.amount", "spark.ssl.enabled",
                    "pytorch.spark.distributor.ignoreSsl"):
            conf.remove(key)

