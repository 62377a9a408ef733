"""Databricks integration: notebook widgets, secrets and storage credentials,
and the jobs command (``dist_dl.app.databricks.jobs``)."""
from typing import TYPE_CHECKING

from dist_dl.core.lazy import lazy_exports

_EXPORTS = {
    "read_widgets": "dist_dl.app.databricks.widgets",
    "config_from_widgets": "dist_dl.app.databricks.widgets",
    "read_secret": "dist_dl.app.databricks.secrets",
    "use_sas_token": "dist_dl.app.databricks.secrets",
    "sas_expiry": "dist_dl.app.databricks.secrets",
    "redact": "dist_dl.app.databricks.secrets",
}

# What the names are, for type checkers and the API reference (mkdocstrings);
# at run time each is imported on first use.
if TYPE_CHECKING:
    from dist_dl.app.databricks.secrets import read_secret, redact, sas_expiry, use_sas_token  # noqa: F401
    from dist_dl.app.databricks.widgets import config_from_widgets, read_widgets  # noqa: F401

__all__ = ["read_widgets", "config_from_widgets", "read_secret", "use_sas_token", "sas_expiry", "redact"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
