"""The main job of `make demo`, end to end on small settings."""
from pathlib import Path

import pytest

CONF = Path(__file__).parent.parent / "conf" / "demo.yaml"


@pytest.mark.timeout(240)
def test_demo_trains_and_logs_to_mlflow(spark, tmp_path, capsys):
    import mlflow

    from dist_dl.cli import main

    assert main(["demo", "--config", str(CONF), "--epochs", "2", "--steps", "15",
                 "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "MLflow run" in out
    client = mlflow.tracking.MlflowClient(f"file://{tmp_path}/mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("dist_dl-demo").experiment_id])
    assert run.data.params["np"] == "2"
    assert run.data.metrics["num_workers"] == 2
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == 2 and losses[1] < losses[0]  # it learns
