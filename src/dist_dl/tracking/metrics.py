"""Metric values as MLflow takes them, without importing MLflow: every
training worker needs this (its checkpoints store the epoch's metrics), but
only rank 0 logs, so only rank 0 should pay for loading MLflow.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["numeric_logs"]


def numeric_logs(logs: Mapping | None) -> dict[str, float]:
    """The entries of Keras' ``logs`` that are numbers, as floats (NaN and
    inf kept: a diverging loss must show)."""
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            pass
    return out
