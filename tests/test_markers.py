"""The test ids conftest.py names by hand exist: a renamed test would
otherwise drop silently out of `make test-fast`'s exclusions or out of the
dbr-15.4-ml or dbr-16.4-ml profile's subset (which dbr-17.3-ml runs too)."""
from pathlib import Path

import pytest

from conftest import (PROFILE_SUBSET, PROFILE_SUBSET_164, PROFILE_SUBSET_164_SLOW,
                      PROFILE_SUBSET_SLOW, SLOW_BY_DURATION)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(30)
@pytest.mark.parametrize("nodeid", sorted(SLOW_BY_DURATION | PROFILE_SUBSET_SLOW |
                                           PROFILE_SUBSET_164_SLOW))
def test_a_named_test_exists(nodeid):
    path, _, name = nodeid.partition("::")
    function, _, param = name.partition("[")
    source = (ROOT / path).read_text()
    assert f"def {function}(" in source, f"{nodeid}: no such test in {path}"
    param = param.rstrip("]")
    # A parameter is a value in the test's source or, for the notebook tests,
    # a notebook's name.
    assert not param or param in source or (ROOT / "notebooks" / f"{param}.py").exists(), (
        f"{nodeid}: no such parameter in {path}")


@pytest.mark.timeout(30)
def test_the_profile_subsets_slow_tests_are_in_its_modules():
    for nodeid in PROFILE_SUBSET_SLOW:
        assert Path(nodeid.partition("::")[0]).stem in PROFILE_SUBSET, nodeid
    for nodeid in PROFILE_SUBSET_164_SLOW:
        assert Path(nodeid.partition("::")[0]).stem in PROFILE_SUBSET_164, nodeid
