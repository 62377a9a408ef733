"""Secrets come from a secret scope or the environment and never leak: a
canary planted through the supported channels is in no output of a run."""
from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

import cloudpickle
import pytest

import train_hooks
from dist_dl.app.databricks import read_secret, redact, sas_expiry, use_sas_token

cloudpickle.register_pickle_by_value(train_hooks)

FUTURE_SAS = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&spr=https&sig={sig}"


def test_sas_tokens_only_with_an_expiry_and_never_account_keys(spark):
    token = FUTURE_SAS.format(sig="c2lnbmF0dXJl")
    assert sas_expiry("?" + token).year == 2099
    account_key = base64.b64encode(os.urandom(64)).decode()
    for bad, message in ((account_key, "storage account key, not a SAS token"),
                         ("sv=2022-11-02&sp=r&sig=abc", r"expiry \(se=\)"),
                         (FUTURE_SAS.replace("2099", "2001").format(sig="x1y2"), "expired")):
        with pytest.raises(ValueError, match=message) as info:
            use_sas_token(spark, "myaccount", bad)
        assert bad not in str(info.value)  # an error never shows the credential
    with pytest.raises(ValueError, match="storage account name"):
        use_sas_token(spark, "https://myaccount.blob.core.windows.net", token)
    use_sas_token(spark, "myaccount", token)
    assert spark.conf.get("fs.azure.sas.fixed.token.myaccount.dfs.core.windows.net") == token
    assert spark.conf.get("fs.azure.account.auth.type.myaccount.dfs.core.windows.net") == "SAS"
    assert redact(f"a {token} b", token) == "a [REDACTED] b"


def _files_containing(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle in path.read_bytes():
            found.append(str(path))
    return found


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.needs("tensorflow")
def test_a_canary_secret_reaches_the_workers_and_no_output(spark, tmp_path, monkeypatch, capfd):
    from mlflow.tracking import MlflowClient

    from dist_dl import train_distributed
    from dist_dl.app import pipeline
    from dist_dl.app.config import PipelineConfig, load_config

    canary = f"dist-dl-canary-{uuid.uuid4().hex}"
    # The supported channels: the environment variables a job cluster gets
    # from {{secrets/...}} references (MLflow and Databricks credentials of
    # the workers), and a secret read into the Spark session's storage settings.
    monkeypatch.setenv("DATABRICKS_TOKEN", canary)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", canary)
    monkeypatch.setenv("DIST_DL_SECRET_DIST_DL_ADLS_SAS_TOKEN", FUTURE_SAS.format(sig=canary))
    use_sas_token(spark, "canaryaccount", read_secret("dist_dl", "adls-sas-token"))
    monkeypatch.chdir(tmp_path)

    # Local worker processes inherit this process's environment, as Spark
    # executors inherit a job cluster's (set before the Spark session starts:
    # the shared local session of the tests started earlier, so it would not).
    config = load_config(PipelineConfig, "demo", {"train.epochs": 1, "train.backend": "local"})
    pipeline.prepare_data(config, spark=spark)
    probe = str(tmp_path / "probe")
    trained = train_distributed(
        config.data.train_output, validation=config.data.validation_output, config=config.train,
        spark=spark, tracking_uri=(tmp_path / "runs" / "mlruns").as_uri(),
        registered_model_name="canary_model",
        callbacks=train_hooks.EnvProbe(probe, "DATABRICKS_TOKEN", canary))
    # The workers had the credential (the channel works)...
    assert sorted(p.read_text() for p in tmp_path.glob("probe-rank*")) == ["present", "present"]
    # ...and it is in no log, parameter, tag, metric, artifact, checkpoint or shard.
    out, err = capfd.readouterr()
    assert canary not in out and canary not in err
    run = MlflowClient(trained.tracking_uri).get_run(trained.run_id)
    assert not [k for k, v in {**run.data.params, **run.data.tags}.items() if canary in v]
    assert os.path.isdir(trained.checkpoint_dir)
    assert _files_containing(tmp_path, canary.encode()) == []
    spark.conf.unset("fs.azure.sas.fixed.token.canaryaccount.dfs.core.windows.net")


def _run_files_with(root: Path, needles) -> list[str]:
    return [f"{path} has {needle!r}" for path in root.rglob("*") if path.is_file()
            for needle in needles if needle.encode() in path.read_bytes()]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.needs("tensorflow")
def test_a_secret_in_a_worker_error_reaches_no_tag_artifact_or_file(spark, tmp_path, monkeypatch,
                                                                   scenario):
    """A worker fails with a message that quotes its credential (as a storage
    or HTTP client's error would): the driver's error and the MLflow run say
    why, with the credential redacted, and no tag, parameter, artifact,
    checkpoint or other file of the run holds it."""
    from mlflow.tracking import MlflowClient

    from dist_dl import train_distributed
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.train.driver import TrainingFailed

    s = scenario("S13a local", "secret in a worker's error",
                 "train_distributed with a canary credential in the workers' environment; "
                 "a worker raises an error quoting it and a signed URL (as a storage "
                 "client's error would)",
                 "the driver's error and the MLflow run say what failed with both redacted; "
                 "no tag, parameter, artifact, checkpoint or other file of the run holds "
                 "either")
    canary = f"dist-dl-canary-{uuid.uuid4().hex}"
    signature = f"sigcanary{uuid.uuid4().hex}"  # in a signed URL only: known by its form
    monkeypatch.setenv("DATABRICKS_TOKEN", canary)  # the local workers inherit it
    monkeypatch.setenv("DIST_DL_CHECKPOINT_KEY", uuid.uuid4().hex)
    shards = str(tmp_path / "shards")
    make_synthetic_images(shards, rows=16, image_size=16, classes=2, rows_per_row_group=4)
    message = (f"upload refused for token {canary}: https://acct.blob.core.windows.net/c/m?"
               f"sv=2022-11-02&sig={signature}&se=2099-01-01")
    with pytest.raises(TrainingFailed) as info:
        train_distributed(shards, model=train_hooks.plain_cnn, epochs=2, num_workers=2,
                          batch_size=4, image_size=16, validation_fraction=0.0, max_retries=0,
                          backend="local", tracking_uri=(tmp_path / "mlruns").as_uri(),
                          output_dir=str(tmp_path / "out"),
                          callbacks=train_hooks.RaiseAt(1, message))
    # The error still says what went wrong, and which URL.
    error = str(info.value)
    assert "upload refused for token [REDACTED]" in error and "sig=[REDACTED]" in error
    assert canary not in error and signature not in error
    run = MlflowClient((tmp_path / "mlruns").as_uri()).get_run(info.value.run_id)
    tag = run.data.tags["dist_dl.attempt_1_error"]
    assert "upload refused for token [REDACTED]" in tag
    assert not [k for k, v in {**run.data.params, **run.data.tags}.items()
                if canary in v or signature in v]
    # The checkpoint of the first epoch was written, and holds neither.
    assert info.value.checkpoint_epoch == 1
    assert _run_files_with(tmp_path, [canary, signature]) == []
    s.figure("error, tag and every file of the run checked: the canary and the signature "
             "appear nowhere, [REDACTED] where they were")


def _failing_trial(message):
    # Made inside a function so that Spark ships it by value.
    def train(params, reporter):
        reporter.report(1.0)
        if params["x"] == 1:
            raise RuntimeError(message)
        return 0.0

    return train


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_secret_in_a_failing_trial_reaches_no_tag_or_artifact(spark, tmp_path, monkeypatch,
                                                               scenario):
    """Search trials: the error tag, error.txt and the results are redacted
    (here on the driver: the executors of the shared local session started
    before the canary was set)."""
    from mlflow.tracking import MlflowClient

    from dist_dl.search import search

    s = scenario("S13b local", "secret in a search trial's error",
                 "search() of 2 trials with a canary credential set; one trial raises an "
                 "error quoting it",
                 "the trial's result, its error tag and error.txt hold the error redacted; "
                 "no file of the MLflow store holds the canary")
    canary = f"dist-dl-canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", canary)
    result = search(_failing_trial(f"GET failed with token {canary}"), {"x": [1, 2]},
                    max_trials=2, max_concurrent=1, algorithm="grid", early_stopping=None,
                    spark=spark, tracking_uri=(tmp_path / "mlruns").as_uri())
    (trial,) = [t for t in result.trials if t.status == "failed"]
    assert trial.status == "failed" and trial.error == "RuntimeError: GET failed with token " \
        "[REDACTED]"
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run = client.get_run(trial.run_id)
    assert run.data.tags["dist_dl.error"] == trial.error
    artifacts = [a.path for a in client.list_artifacts(trial.run_id)]
    assert "error.txt" in artifacts
    assert _run_files_with(tmp_path, [canary]) == []
    s.figure("result, tag and error.txt redacted; the canary in no file")
