"""The main job of `make demo` (`dist-dl pipeline --config demo`), end to end:
sample images to shards, two Spark workers, MLflow, evaluate, register, score."""
import pytest


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_pipeline_prepares_trains_registers_evaluates_and_scores(spark, tmp_path,
                                                                      monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from dist_dl.cli import main

    monkeypatch.chdir(tmp_path)  # the demo writes under ./runs
    assert main(["pipeline", "--config", "demo"]) == 0
    out = capsys.readouterr().out
    assert "dist_dl pipeline: done" in out and "mlflow ui --backend-store-uri" in out

    store = (tmp_path / "runs" / "mlruns").as_uri()
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("dist_dl-demo").experiment_id])
    assert run.data.params["train.num_workers"] == "2" and run.data.params["backend"] == "spark"
    assert run.data.metrics["num_workers"] == 2
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == 5 and losses[-1] < losses[0]  # it learns
    # The evaluate step promoted the registered model; score used it.
    version = client.get_model_version_by_alias("digits_small_cnn", "champion")
    assert version.run_id == run.info.run_id
    assert run.data.metrics["val_accuracy"] >= 0.9
    assert client.get_run(run.info.run_id).data.metrics["eval_accuracy"] >= 0.9
    scored = spark.read.parquet(str(tmp_path / "runs" / "scored")).toPandas()
    assert len(scored) == 363 and {"prediction", "probability", "label"} <= set(scored.columns)
    assert (scored["prediction"] == scored["label"]).mean() >= 0.9

    # The gate: a model below evaluate.min_accuracy is not promoted, and the
    # step fails (a workflow's score task does not run).
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--config", "demo", "--set", "evaluate.min_accuracy=1.0",
              "--set", "evaluate.alias=perfect"])
    assert exit_info.value.code == 1
    assert "below evaluate.min_accuracy=1.0: not promoted" in capsys.readouterr().err
    assert "perfect" not in client.get_registered_model("digits_small_cnn").aliases
