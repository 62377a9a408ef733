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
from dist_dl.databricks import read_secret, redact, sas_expiry, use_sas_token

cloudpickle.register_pickle_by_value(train_hooks)

FUTURE_SAS = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&spr=https&sig={sig}"


class _Secrets:
    def __init__(self, values):
        self.values = values

    def get(self, scope, key):
        return self.values[(scope, key)]


class _DbUtils:
    def __init__(self, values):
        self.secrets = _Secrets(values)


def test_read_secret_from_a_scope_or_the_environment(monkeypatch):
    assert read_secret("dist_dl", "token", dbutils=_DbUtils({("dist_dl", "token"): "s1"})) == "s1"
    monkeypatch.setenv("DIST_DL_SECRET_DIST_DL_ADLS_SAS_TOKEN", "s2")
    assert read_secret("dist_dl", "adls-sas-token") == "s2"
    monkeypatch.setenv("MY_TOKEN", "s3")
    assert read_secret("dist_dl", "x", env="MY_TOKEN") == "s3"
    with pytest.raises(KeyError, match="set the environment variable DIST_DL_SECRET_DIST_DL_NOPE"):
        read_secret("dist_dl", "nope")


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
def test_a_canary_secret_reaches_the_workers_and_no_output(spark, tmp_path, monkeypatch, capfd):
    from mlflow.tracking import MlflowClient

    from dist_dl import pipeline, train_distributed
    from dist_dl.config import PipelineConfig, load_config

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
