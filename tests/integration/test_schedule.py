"""The warmup-and-scale learning-rate rule."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="its tests train or load Keras models: "
                                  "TensorFlow is not installed (profile dbr-19-ml)")

from dist_dl.core import compat
from dist_dl.train.schedule import WarmupScaledSchedule

pytestmark = [pytest.mark.profile_subset_164]


def test_values_rise_linearly_then_stay_scaled():
    schedule = WarmupScaledSchedule(0.1, num_workers=4, steps_per_epoch=10, warmup_epochs=2)
    assert schedule.warmup_steps == 20 and schedule.scaled_lr == pytest.approx(0.4)
    steps = [0, 1, 10, 19, 20, 21, 1000]
    expected = [0.1, 0.1 + 0.3 / 20, 0.25, 0.1 + 0.3 * 19 / 20, 0.4, 0.4, 0.4]
    np.testing.assert_allclose([schedule.value_at(s) for s in steps], expected, rtol=1e-12)
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-6)


def test_no_warmup_and_one_worker():
    assert float(WarmupScaledSchedule(0.1, 2, 5, warmup_epochs=0)(0)) == pytest.approx(0.2)
    one = WarmupScaledSchedule(0.05, 1, 5)
    assert [one.value_at(s) for s in (0, 7, 100)] == [0.05, 0.05, 0.05]


def test_drives_a_keras_optimizer_and_round_trips_its_config():
    import tensorflow as tf
    keras = compat.keras()

    schedule = WarmupScaledSchedule(0.01, 2, steps_per_epoch=4, warmup_epochs=1)
    optimizer = keras.optimizers.SGD(schedule)
    var = tf.Variable(1.0)
    for _ in range(2):
        optimizer.apply_gradients([(tf.constant(1.0), var)])
    # Steps 0 and 1: 0.01 and 0.0125.
    assert float(var.numpy()) == pytest.approx(1.0 - 0.01 - 0.0125, rel=1e-6)
    assert int(optimizer.iterations.numpy()) == 2  # what checkpoints restore: the curve continues
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert clone.get_config() == schedule.get_config()


@pytest.mark.parametrize("kwargs, name", [
    ({"base_lr": 0}, "base_lr"), ({"num_workers": 0}, "num_workers"),
    ({"steps_per_epoch": 1.5}, "steps_per_epoch"), ({"warmup_epochs": -1}, "warmup_epochs"),
])
def test_bad_arguments_name_the_parameter(kwargs, name):
    args = {"base_lr": 0.1, "num_workers": 2, "steps_per_epoch": 10, **kwargs}
    with pytest.raises(ValueError, match=name):
        WarmupScaledSchedule(**args)


def test_cosine_decay_after_warmup_reaches_zero_at_the_end():
    schedule = WarmupScaledSchedule(0.1, num_workers=2, steps_per_epoch=10, warmup_epochs=1,
                                    total_epochs=3)
    assert schedule.total_steps == 30
    steps = [0, 5, 10, 20, 30, 40]
    # Warmup 0.1 -> 0.2 over 10 steps, then 0.2 * (1 + cos(pi * t)) / 2 over steps 10..30.
    expected = [0.1, 0.15, 0.2, 0.1, 0.0, 0.0]
    np.testing.assert_allclose([schedule.value_at(s) for s in steps], expected, atol=1e-12)
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, atol=1e-6)
    with pytest.raises(ValueError, match="total_epochs"):
        WarmupScaledSchedule(0.1, 2, 10, warmup_epochs=2, total_epochs=1)
