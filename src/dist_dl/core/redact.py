"""Secrets out of what is stored: MLflow tags and artifacts, logs, error texts.

Runs anywhere (driver, Spark tasks, workers); imports only the standard
library. Every stage that stores text it did not write (a worker's error, a
trial's failure) passes it through `redact_secrets()` first.
"""
from __future__ import annotations

import os
import re

__all__ = ["redact", "redact_secrets", "remember_secret", "without_credentials"]

# Values this process read as secrets (dist_dl.app.databricks.read_secret,
# use_sas_token): always redacted by redact_secrets (the process's memory
# only, never written).
_known: set[str] = set()


def remember_secret(*values: str) -> None:
    """Redact ``values`` from everything `redact_secrets()` sees in this process."""
    _known.update(v for v in values if v)


def redact(text: str, *secrets: str) -> str:
    """``text`` with every occurrence of each secret replaced by ``[REDACTED]``."""
    # Longest first, so that a secret containing another is replaced whole.
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "[REDACTED]")
    return text


def without_credentials(uri: str) -> str:
    """``uri`` without the user and password it may hold
    (``scheme://user:password@host/...`` shown as ``scheme://host/...``)."""
    scheme, sep, rest = uri.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}" if sep else uri


# Environment variables whose values are credentials: what a job cluster gets
# from {{secrets/...}} references (DATABRICKS_TOKEN, MLFLOW_TRACKING_TOKEN,
# AWS_SECRET_ACCESS_KEY, DIST_DL_SECRET_*, ...).
_SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_KEY|"
                         r"PRIVATE_KEY|SAS|^DIST_DL_CHECKPOINT_KEY$", re.IGNORECASE)
# Credentials that show their kind in the text: signed-URL and SAS query
# parameters, bearer tokens, Databricks personal access tokens.
_SECRET_TEXT = re.compile(
    r"(?i)(\b(?:sig|signature|token|access_token|password|secret|x-amz-signature|"
    r"x-amz-credential|x-amz-security-token|x-goog-signature)=)[^&\s\"'<>]+"
    r"|(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"
    r"|()\bdapi[0-9a-f]{32}\b")
_MIN_SECRET = 8  # shorter environment values ("1", "true") are not credentials


def redact_secrets(text: str) -> str:
    """``text`` as it may be stored (MLflow tags and artifacts, logs): with
    every secret this process knows replaced by ``[REDACTED]``.

    Known here: values read with `dist_dl.app.databricks.read_secret()` or given to
    `dist_dl.app.databricks.use_sas_token()` in this process, values of environment variables
    named like credentials (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``,
    ``*KEY*`` of access keys, ``DIST_DL_SECRET_*``, ...), and credentials
    recognisable in the text itself (``sig=``/``token=`` query parameters,
    ``Bearer ...``, Databricks ``dapi...`` tokens). Worker errors pass
    through it on the worker and again on the driver before anything of them
    is stored, as parameters pass through their own redaction.
    """
    if not text:
        return text
    values = set(_known)
    values.update(v for k, v in os.environ.items()
                  if _SECRET_ENV.search(k) and len(v) >= _MIN_SECRET)
    text = redact(text, *values)
    return _SECRET_TEXT.sub(lambda m: (m.group(1) or m.group(2) or "") + "[REDACTED]", text)
