"""Databricks integration: notebook widgets, secrets and storage credentials,
and the jobs command (``dist_dl.app.databricks.jobs``)."""
from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "read_widgets": "dist_dl.app.databricks.widgets",
    "config_from_widgets": "dist_dl.app.databricks.widgets",
    "read_secret": "dist_dl.app.databricks.secrets",
    "use_sas_token": "dist_dl.app.databricks.secrets",
    "sas_expiry": "dist_dl.app.databricks.secrets",
    "redact": "dist_dl.app.databricks.secrets",
}

__all__ = ["read_widgets", "config_from_widgets", "read_secret", "use_sas_token", "sas_expiry", "redact"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
