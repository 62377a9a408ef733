"""The backstop behind pytest-timeout's signal method (pytest.ini), as a
pytest plugin (tests/conftest.py loads it).

A test still running ``BACKSTOP_S`` seconds (``TESTS_BACKSTOP_S`` in the
environment, 60 unless set) after its timeout is stuck where
the signal cannot act (in C code, or with SIGALRM blocked): faulthandler
prints every thread's stack to the run's standard error (which output
capture does not hold back, so CI's log has it) and ends the test process,
which pytest-xdist then reports as crashed while running that test.
"""
from __future__ import annotations

import faulthandler
import os

import pytest

BACKSTOP_S = float(os.environ.get("TESTS_BACKSTOP_S", 60))

_stderr = None


def pytest_configure(config):
    global _stderr
    if _stderr is None:
        _stderr = os.fdopen(os.dup(2), "w")  # before output capture replaces fd 2


def pytest_unconfigure(config):
    global _stderr
    if _stderr is not None:
        faulthandler.cancel_dump_traceback_later()
        _stderr.close()
        _stderr = None


def _timeout(item) -> float:
    """The test's timeout: its marker's, else pytest.ini's (0: none)."""
    marker = item.get_closest_marker("timeout")
    value = (marker.args[0] if marker.args else marker.kwargs.get("timeout")) if marker else None
    return float(item.config.getini("timeout") or 0 if value is None else value)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout = _timeout(item)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout + BACKSTOP_S, exit=True, file=_stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
