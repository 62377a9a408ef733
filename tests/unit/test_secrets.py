"""The cases of tests/integration/test_secrets.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import uuid
import cloudpickle
import pytest

import train_hooks
from dist_dl.app.databricks import read_secret

cloudpickle.register_pickle_by_value(train_hooks)


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


def test_redact_secrets_knows_read_secrets_credential_variables_and_signed_urls(monkeypatch):
    from dist_dl.core.redact import redact_secrets

    read = f"read-{uuid.uuid4().hex}"
    env = f"env-{uuid.uuid4().hex}"
    monkeypatch.setenv("DIST_DL_SECRET_DIST_DL_CANARY", read)
    assert read_secret("dist_dl", "canary") == read
    monkeypatch.delenv("DIST_DL_SECRET_DIST_DL_CANARY")  # still known: it was read
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env)
    monkeypatch.setenv("SOME_SETTING", "harmless-value-1234")
    text = (f"failed with {read} and {env}; GET https://a.blob.core.windows.net/c/x?sv=1&"
            f"sig=abc%2Fdef&se=2099 Authorization: Bearer eyJhbGciOi.x.y "
            f"dapi{'0a' * 16} harmless-value-1234")
    assert redact_secrets(text) == (
        "failed with [REDACTED] and [REDACTED]; GET https://a.blob.core.windows.net/c/x?sv=1&"
        "sig=[REDACTED]&se=2099 Authorization: Bearer [REDACTED] [REDACTED] harmless-value-1234")
