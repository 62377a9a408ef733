"""Databricks integration: notebook widgets (and, later, jobs and secrets)."""
from dist_dl.databricks.widgets import read_widgets

__all__ = ["read_widgets"]
