"""The benchmark's clock and its side-by-side runner (tiny settings: the
figures themselves come from benchmarks/train.py on a quiet machine)."""
import subprocess
import sys
import time

import pytest

from dist_dl.bench import CpuSampler, run_benchmark, thread_split
from dist_dl.config import BenchConfig
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_setup_runs_and_ratios_are_per_round(tmp_path):
    lines = []
    report = run_benchmark(BenchConfig(model="small_cnn", image_size=16, steps=3, warmup_steps=1,
                                       rounds=1, output=str(tmp_path / "bench.json")),
                           variants={"fp16": {"fp16_allreduce": True}}, out=lines.append)
    setups = report["setups"]
    assert set(setups) == {"plain_1", "dist_1", "ceiling", "dist", "fp16"}
    assert all(v["images_per_second"][0] > 0 for v in setups.values())
    assert report["ratios"]["scaling"] == [setups["dist"]["images_per_second"][0]
                                           / setups["ceiling"]["images_per_second"][0]]
    assert report["ratios"]["overhead"] == [setups["dist_1"]["images_per_second"][0]
                                            / setups["plain_1"]["images_per_second"][0]]
    assert all(len(v["threads"]) == 1 for v in setups.values())
    assert any("dist / ceiling: median" in line for line in lines)
    assert (tmp_path / "bench.json").exists()


BUSY_CHILD = """
import threading, time
idle = threading.Thread(target=time.sleep, args=(30,), daemon=True)
idle.start()
end = time.perf_counter() + {seconds}
while time.perf_counter() < end:
    pass
"""


@pytest.mark.timeout(60)
def test_cpu_sampler_finds_the_busy_thread_of_a_child():
    with CpuSampler(interval=0.2) as sampler:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD.format(seconds=3)])
        child.wait(timeout=30)
    window = sampler.window(start + 0.5, start + 2.5)
    assert window is not None and child.pid in window
    threads = sorted(window[child.pid]["threads"].values(), key=lambda us: -sum(us))
    assert len(threads) == 2  # the spinning main thread and the sleeping one
    assert sum(threads[0]) > 0.3  # spinning (below 1.0 on a busy machine)
    assert sum(threads[1]) < 0.05  # sleeping
    split = thread_split(window, processes=1)
    assert split["main"] == pytest.approx(sum(threads[0]))
    assert split["other_user"] + split["other_sys"] < 0.05
    # A window with fewer than two samples gives nothing, not a made-up rate.
    assert sampler.window(start + 0.5, start + 0.55) is None
    assert thread_split(None, 1) is None
