"""The benchmark's clock, its side-by-side runner, the peer and the shared
results file (tiny settings: the figures themselves come from
benchmarks/train.py on a quiet machine; nothing here asserts a speed)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dist_dl.app.bench import (result_entry, run_benchmark)
from dist_dl.app.config import BenchConfig


@pytest.mark.slow
@pytest.mark.timeout(1500)  # 12 minutes measured at load average 12
@pytest.mark.needs("horovod.tensorflow")
def test_every_setup_runs_and_ratios_are_per_round(tmp_path, spark):
    """One tiny round of every setup, the peer (Horovod's recipe through
    horovod.spark.run), the reader alone and the tf.distribute engine with
    its own peer (TensorFlow's recipe) included, into a results file."""
    lines = []
    results = tmp_path / "bench" / "results.json"
    results.parent.mkdir()
    results.write_text(json.dumps({"reader_ratio": result_entry([0.9], command="earlier run",
                                                                goal=0.8)}))
    report = run_benchmark(BenchConfig(model="small_cnn", image_size=16, steps=3, warmup_steps=1,
                                       rounds=1, output=str(tmp_path / "bench.json"),
                                       results=str(results)),
                           spark=spark, variants={"fp16": {"fp16_allreduce": True},
                                                  "tfdist": {"engine": "tensorflow"}},
                           out=lines.append, log_to_mlflow=True,
                           tracking_uri=(tmp_path / "mlruns").as_uri(), command="the test")
    setups = report["setups"]
    assert set(setups) == {"plain_1", "dist_1", "ceiling", "dist", "peer", "reader_alone",
                           "fp16", "tfdist", "tf_peer"}
    assert all(v["images_per_second"][0] > 0 for v in setups.values())

    def rate(name):
        return setups[name]["images_per_second"][0]

    assert report["ratios"]["scaling"] == [rate("dist") / rate("ceiling")]
    assert report["ratios"]["overhead"] == [rate("dist_1") / rate("plain_1")]
    assert report["ratios"]["scaling_vs_peer"] == [rate("dist") / rate("peer")]
    assert report["ratios"]["input_headroom"] == [rate("reader_alone") / (rate("dist") / 2)]
    assert report["ratios"]["tfdist_vs_tf_peer"] == [rate("tfdist") / rate("tf_peer")]
    assert report["ratios"]["tfdist_vs_dist"] == [rate("tfdist") / rate("dist")]
    assert setups["peer"]["devices"] == 2 and setups["reader_alone"]["devices"] == 1
    # The peer ran Horovod on both Spark tasks.
    assert report["horovod"]["size"] == 2
    assert all(len(v["threads"]) == 1 for v in setups.values())
    assert any("dist / ceiling: median" in line for line in lines)
    assert any("dist / peer: median" in line for line in lines)
    assert any("tfdist / tf_peer: median" in line for line in lines)
    assert any(line.startswith("dist: Img/sec per device:") for line in lines)
    assert any(line.startswith("input: ") for line in lines)
    # Cores per device from the reader's own CPU use and the measured rate per worker.
    reader = setups["reader_alone"]
    cores = report["input"]["cores"]
    assert cores["cores_needed"] == pytest.approx(
        (rate("dist") / 2) / (rate("reader_alone") / reader["cpu_per_second"][0]))
    assert cores["cores_per_device"] == (os.cpu_count() or 1) / 2
    assert any(line == "input: " + cores["message"] for line in lines)
    assert (tmp_path / "bench.json").exists()

    written = json.loads(results.read_text())
    for key in ("overhead", "scaling", "scaling_vs_peer", "input_headroom",
                "images_per_second.peer", "scaling_vs_tf_peer", "tf_engine_vs_horovod",
                "images_per_second.tf_peer"):
        assert written[key]["command"] == "the test" and written[key]["rounds"]
    assert written["scaling_vs_peer"]["value"] == report["ratios"]["scaling_vs_peer"][0]
    assert written["reader_ratio"]["command"] == "earlier run"  # another benchmark's key: kept
    assert (tmp_path / "bench" / "results.png").stat().st_size > 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"results.json",
                                                                        "results.png"}
    assert run.data.metrics["scaling_vs_peer"] == written["scaling_vs_peer"]["value"]


@pytest.mark.timeout(300)
@pytest.mark.needs("tensorflow")
def test_reader_benchmark_runs_tiny_and_writes_its_keys(tmp_path):
    # Nothing about speed: the script runs to the end and writes reader_ratio
    # (the reader "auto" picks) and one key per reader it timed.
    results = tmp_path / "results.json"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "reader.py"
    done = subprocess.run(
        [sys.executable, str(script), "--rows", "48", "--image-size", "32", "--crop", "24",
         "--batch-size", "8", "--batches", "2", "--rounds", "2", "--warmup", "1",
         "--workdir", str(tmp_path / "work"), "--results", str(results)],
        capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    written = json.loads(results.read_text())
    from dist_dl.read.rows import choose_reader

    auto = choose_reader("auto")
    assert written["reader_ratio"]["reader"] == auto
    assert written["reader_ratio"]["rounds"] == written[f"reader_ratio.{auto}"]["rounds"]
    assert len(written["reader_ratio.arrow"]["rounds"]) == 2
    assert ("reader_arrow_vs_petastorm" in written) == (auto == "petastorm")
    # The Parquet layouts' read costs, the library's own ("none_plain") among them.
    assert {k for k in written if k.startswith("parquet_read_us_per_image.")} == {
        f"parquet_read_us_per_image.{layout}" for layout in
        ("snappy_dictionary", "snappy_plain", "none_dictionary", "none_plain")}
