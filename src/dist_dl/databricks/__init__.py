"""Databricks integration: notebook widgets, secrets and storage credentials,
and the jobs command (``dist_dl.databricks.jobs``)."""
from dist_dl.databricks.secrets import read_secret, redact, sas_expiry, use_sas_token
from dist_dl.databricks.widgets import config_from_widgets, read_widgets

__all__ = ["read_widgets", "config_from_widgets", "read_secret", "use_sas_token", "sas_expiry", "redact"]
