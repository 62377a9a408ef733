"""Lazily defined classes (dist_dl.core.lazy): an error while defining one reaches
the caller as itself, not as "cannot import name"."""


import pytest


pytestmark = [pytest.mark.timeout(120), pytest.mark.profile_subset_164]  # the last test imports TensorFlow


@pytest.mark.needs("tensorflow")
def test_the_library_schedule_is_defined_on_first_use():
    from dist_dl.train.schedule import WarmupScaledSchedule

    assert WarmupScaledSchedule(0.1, 2, 10, warmup_epochs=1).value_at(10) == pytest.approx(0.2)
