"""One setting of a running SparkContext's configuration, read on the driver.

``SparkContext.getConf()`` returns a copy of the whole SparkConf, made with
one Py4J round trip per entry (about 100; benchmarks/RESULTS.md counts the
round trips per ``train_ensemble`` call). The context's own SparkConf
(``sc._conf``, a view of the JVM's) answers one key in one call, and sees
what the JVM sees. Every single-setting read of the library goes through
`conf_value()`, so the private attribute is used in one place.
"""
from __future__ import annotations

__all__ = ["conf_value"]


def conf_value(sc, key: str, default: str | None = None) -> str | None:
    """``key``'s value in ``sc``'s live SparkConf; ``default`` where unset
    (an empty value is returned as set, as ``SparkConf.get`` does)."""
    return sc._conf.get(key, default)
