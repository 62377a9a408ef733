"""The cases of tests/integration/test_bench.py that need no Spark, no training
and no worker process."""
import json
import os
import subprocess
import sys
import threading
import time
import pytest

from dist_dl.app.bench import (CpuSampler, cores_per_device, input_verdict, merge_results, plot_results,
                           publish_results, result_entry, thread_split)
from dist_dl.train.timing import StepTimes


def test_step_times_leave_out_the_warmup_steps():
    times = StepTimes()
    times.wall = [10.0, 11.0, 11.5, 12.0, 12.5]  # step 0 slow (tracing), then 0.5 s per step
    times.cpu = [5.0, 6.0, 6.25, 6.5, 6.75]
    assert times.rate(32, skip=1) == pytest.approx(4 * 32 / 2.5)
    assert times.rate(32, skip=2) == pytest.approx(3 * 32 / 1.5)
    assert times.cpu_per_second(skip=2) == pytest.approx(0.75 / 1.5)
    assert times.rate(32, skip=5) is None
    with pytest.raises(ValueError, match="skip must be an int >= 1"):
        times.rate(32, skip=0)


def test_results_file_merges_only_its_own_keys(tmp_path):
    path = tmp_path / "results.json"
    first = {"scaling": result_entry([0.7, 0.8, 0.75], command="train", goal=0.85),
             "images_per_second.cycle5": result_entry([40.0], command="train")}
    merge_results(str(path), first, own_prefixes=("images_per_second.",))
    ensemble = {"ensemble_vs_ceiling": result_entry([0.8, 0.9], command="ensemble", goal=0.9)}
    merge_results(str(path), ensemble, own_prefixes=("ensemble_",))
    again = {"scaling": result_entry([0.6], command="train 2", goal=0.85),
             "images_per_second.dist": result_entry([50.0], command="train 2")}
    merged = merge_results(str(path), again, own_prefixes=("images_per_second.",))
    assert merged == json.loads(path.read_text())
    # Its own keys replaced (the lever not in this run dropped), the others' kept.
    assert set(merged) == {"scaling", "images_per_second.dist", "ensemble_vs_ceiling"}
    assert merged["scaling"]["value"] == 0.6 and merged["scaling"]["command"] == "train 2"
    assert merged["ensemble_vs_ceiling"]["value"] == pytest.approx(0.85)
    entry = merged["ensemble_vs_ceiling"]
    assert {"value", "command", "date", "machine", "rounds"} <= set(entry)
    assert "cores" in entry["machine"] and entry["date"].endswith("Z")
    assert os.listdir(tmp_path) == ["results.json"]  # no temporary file left

    path.write_text("{not json")
    with pytest.raises(ValueError, match="results.json is not valid JSON.*fix or remove it"):
        merge_results(str(path), again)


@pytest.mark.timeout(120)
def test_concurrent_merges_keep_every_key(tmp_path):
    path = str(tmp_path / "results.json")
    errors = []

    def write(i):
        try:
            for j in range(5):
                merge_results(path, {f"k{i}.{j}": result_entry([float(j)], command=str(i))})
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(json.loads(open(path).read())) == {f"k{i}.{j}" for i in range(4) for j in range(5)}


@pytest.mark.timeout(120)
def test_png_and_mlflow_artifacts_of_the_results(tmp_path):
    import matplotlib.image

    entries = {"scaling_vs_peer": result_entry([0.9, 1.1, 1.05], command="x", goal=1.0),
               "input_headroom": result_entry([12.0, 15.0], command="x", goal=1.0),
               "images_per_second.dist": result_entry([50.0, 55.0], command="x", devices=2),
               "images_per_second.reader_alone": result_entry([900.0], command="x")}
    png = plot_results(entries, str(tmp_path / "only.png"))
    height, width, _ = matplotlib.image.imread(png).shape
    assert width > height > 200  # two panels side by side
    published = publish_results(str(tmp_path / "results.json"), entries, log=True,
                                tracking_uri=(tmp_path / "mlruns").as_uri(),
                                experiment_name="benchmarks", run_name="bench")
    assert published["png"] == str(tmp_path / "results.png")
    from mlflow.tracking import MlflowClient

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run = client.get_run(published["run_id"])
    assert run.data.metrics["input_headroom"] == 13.5
    assert run.data.tags["commands"] == "x"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"results.json",
                                                                        "results.png"}
    # A file with no images/s (the ensemble's keys alone) still draws.
    plot_results({"ensemble_vs_ceiling": entries["scaling_vs_peer"]}, str(tmp_path / "e.png"))
    assert (tmp_path / "e.png").stat().st_size > 0


def test_input_verdict_says_by_how_much_and_what_to_change():
    short = input_verdict(30.0, 40.0, reader_threads=2, rows_per_row_group=32)
    assert short["input_bound"] and short["headroom"] == 0.75
    assert "INPUT-BOUND" in short["message"] and "25% short" in short["message"]
    for change in ("train.cache_dir", "train.reader_threads, now 2", "now 32 rows"):
        assert change in short["message"]
    cached = input_verdict(30.0, 40.0, reader_threads=4, rows_per_row_group=None, cached=True)
    assert "train.cache_dir" not in cached["message"]
    narrow = input_verdict(50.0, 40.0, reader_threads=2, rows_per_row_group=32)
    assert not narrow["input_bound"] and "keeps up, narrowly" in narrow["message"]
    plenty = input_verdict(400.0, 40.0, reader_threads=2, rows_per_row_group=32)
    assert "not input-bound" in plenty["message"] and "10.0x" in plenty["message"]


def test_cores_per_device_compares_the_input_work_with_the_nodes_cores():
    # An H200-class rate (4,600 images/s) against 600 images per CPU-second:
    # 7.7 cores per GPU; a node of 8 GPUs and 64 cores has 8 each.
    enough = cores_per_device(600.0, 4600.0, cores=64, devices=8, measured_device=False)
    assert enough["enough"] and round(enough["cores_needed"], 2) == 7.67
    assert enough["cores_per_device"] == 8.0
    assert "enough" in enough["message"] and "(as given)" in enough["message"]
    assert "Levers" not in enough["message"]
    short = cores_per_device(600.0, 4600.0, cores=48, devices=8)
    assert not short["enough"] and "SHORT by 1.7" in short["message"]
    assert "measured here" in short["message"] and "6.0 per device" in short["message"]
    for lever in ("decode='gpu'", "max_side=320", "more cores per device"):
        assert lever in short["message"]
    for bad in (dict(per_cpu_second=0.0, device_rate=1.0), dict(per_cpu_second=1.0, device_rate=-1.0)):
        with pytest.raises(ValueError, match="rates must be positive"):
            cores_per_device(**bad, cores=2, devices=1)
    with pytest.raises(ValueError, match="cores and devices must be >= 1"):
        cores_per_device(1.0, 1.0, cores=2, devices=0)


def test_device_rate_setting_must_be_positive():
    from dist_dl.app.config import BenchConfig

    assert BenchConfig(device_images_per_second=4600.0).device_images_per_second == 4600.0
    with pytest.raises(ValueError, match="device_images_per_second"):
        BenchConfig(device_images_per_second=0.0)


BUSY_CHILD = """
import threading, time
idle = threading.Thread(target=time.sleep, args=(30,), daemon=True)
idle.start()
print(time.perf_counter(), flush=True)   # the moment it starts spinning (CLOCK_MONOTONIC)
end = time.perf_counter() + {seconds}
while time.perf_counter() < end:
    pass
"""


@pytest.mark.timeout(60)
def test_cpu_sampler_finds_the_busy_thread_of_a_child():
    with CpuSampler(interval=0.2) as sampler:
        child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD.format(seconds=3)],
                                 stdout=subprocess.PIPE, text=True)
        # The window starts when the child does spin (a loaded machine starts
        # a Python process slowly).
        start = float(child.stdout.readline())
        child.wait(timeout=30)
    window = sampler.window(start + 0.3, start + 2.3)
    assert window is not None and child.pid in window
    threads = sorted(window[child.pid]["threads"].values(), key=lambda us: -sum(us))
    assert len(threads) == 2  # the spinning main thread and the sleeping one
    # What the spinning thread gets depends on the machine's load (1.0 of a
    # core when idle, 0.04 seen with three test processes and a build beside
    # it); what is checked is that the sampler gives the child's CPU to that
    # thread and none to the sleeping one.
    busy, asleep = sum(threads[0]), sum(threads[1])
    assert busy > 0 and busy >= 0.9 * (busy + asleep), threads
    assert asleep < 0.05  # sleeping
    split = thread_split(window, processes=1)
    assert split["main"] == pytest.approx(sum(threads[0]))
    assert split["other_user"] + split["other_sys"] < 0.05
    # A window with fewer than two samples gives nothing, not a made-up rate.
    assert sampler.window(start + 0.5, start + 0.55) is None
    assert thread_split(None, 1) is None
