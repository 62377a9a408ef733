"""Credentials: from a Databricks secret scope or an environment variable, and
storage access with scoped, expiring SAS tokens instead of account keys.

Driver side. Secrets never appear in files of the repository, job JSON,
notebook text, MLflow parameters or logs: job definitions reference them as
``{{secrets/<scope>/<key>}}`` (Databricks resolves those into cluster
environment variables and Spark configuration, and redacts them in logs);
notebooks and code read them with `read_secret()`; the library logs its
configuration, never its environment (``tests/test_secrets.py`` plants a
canary token and searches every output of a training run for it). What is
stored is redacted first (`dist_dl.core.redact`).

Storage (ADLS Gen2): give Spark a SAS token that is scoped to one container
(or directory) with only the permissions the job needs (read for raw images,
read-write for shards and runs) and that expires (``se=``), not the storage
account key, which opens the whole account forever. `use_sas_token()`
sets it for the session and refuses account keys and tokens without an
expiry or signature; the job definitions set the same three Spark settings
from the secret scope. On AWS the equivalent is an instance profile (no
secret at all), or temporary STS credentials.
"""
from __future__ import annotations

import base64
import datetime as _dt
import os
import re
import urllib.parse

from dist_dl.core.redact import redact, remember_secret

__all__ = ["read_secret", "use_sas_token", "sas_expiry", "redact"]


def _env_name(scope: str, key: str) -> str:
    return "DIST_DL_SECRET_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{scope}_{key}").upper()


def read_secret(scope: str, key: str, *, env: str | None = None, dbutils=None) -> str:
    """A secret: ``dbutils.secrets.get(scope, key)`` on Databricks, else the
    environment variable ``env`` (default ``DIST_DL_SECRET_<SCOPE>_<KEY>``).

    Raises:
        KeyError: Neither has it; the message names both places (never a value).
    """
    if dbutils is not None:
        value = dbutils.secrets.get(scope=scope, key=key)
    else:
        name = env or _env_name(scope, key)
        value = os.environ.get(name)
        if not value:
            raise KeyError(f"secret {scope}/{key} not found: on Databricks pass dbutils (the "
                           f"secret scope {scope!r}); elsewhere set the environment variable "
                           f"{name}")
    remember_secret(value)
    return value


def sas_expiry(token: str) -> _dt.datetime:
    """The expiry (``se=``) of a SAS token, as an aware UTC datetime.

    Raises:
        ValueError: Not a SAS token: an account key, or a token without a
            signature (``sig=``) or an expiry (``se=``). The message never
            contains the value.
    """
    text = token.lstrip("?")
    if _looks_like_account_key(text):
        raise ValueError("this is a storage account key, not a SAS token: an account key opens "
                         "the whole account and never expires; create a SAS token scoped to the "
                         "container with an expiry (az storage container generate-sas ... "
                         "--expiry ...) and store that in the secret scope")
    fields = urllib.parse.parse_qs(text, keep_blank_values=True)
    if "sig" not in fields or "se" not in fields:
        raise ValueError("not a SAS token: it needs a signature (sig=) and an expiry (se=); "
                         "create one with an expiry, e.g. az storage container generate-sas")
    raw = fields["se"][0]
    for pattern in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ", "%Y-%m-%d"):
        try:
            return _dt.datetime.strptime(raw, pattern).replace(tzinfo=_dt.timezone.utc)
        except ValueError:
            continue
    raise ValueError(f"the SAS token's expiry (se=) is not a date: {raw!r}")


def _looks_like_account_key(text: str) -> bool:
    # Azure account keys: 64 random bytes, base64 (88 characters, "==" at the end).
    if len(text) != 88 or not text.endswith("=="):
        return False
    try:
        return len(base64.b64decode(text, validate=True)) == 64
    except ValueError:
        return False


def use_sas_token(spark, account: str, token: str, *, min_validity_hours: float = 1.0) -> None:
    """Let this Spark session read and write ``abfss://...@<account>.dfs.core.windows.net``
    with a SAS token (the fixed-token provider of hadoop-azure).

    Args:
        spark: The SparkSession.
        account: The storage account name (not a URL).
        token: The SAS token (from `read_secret()`).
        min_validity_hours: Refuse a token that expires sooner (a long
            training job would lose its storage half way).

    Raises:
        ValueError: An account key instead of a SAS token, a token without a
            signature or expiry, an expired or soon-expiring token, or a bad
            account name. Messages never contain the token.
    """
    if not re.fullmatch(r"[a-z0-9]{3,24}", account or ""):
        raise ValueError(f"account must be a storage account name (3-24 lowercase letters and "
                         f"digits), got {account!r}")
    expiry = sas_expiry(token)
    remember_secret(token.lstrip("?"), *urllib.parse.parse_qs(token.lstrip("?"))["sig"])
    left = expiry - _dt.datetime.now(_dt.timezone.utc)
    if left < _dt.timedelta(hours=min_validity_hours):
        state = "expired" if left.total_seconds() <= 0 else "expires"
        raise ValueError(f"the SAS token for {account} {state} at {expiry.isoformat()}; the job "
                         f"needs at least {min_validity_hours:g} h: issue a new one")
    suffix = f"{account}.dfs.core.windows.net"
    spark.conf.set(f"fs.azure.account.auth.type.{suffix}", "SAS")
    spark.conf.set(f"fs.azure.sas.token.provider.type.{suffix}",
                   "org.apache.hadoop.fs.azurebfs.sas.FixedSASTokenProvider")
    spark.conf.set(f"fs.azure.sas.fixed.token.{suffix}", token.lstrip("?"))
