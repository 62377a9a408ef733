"""Configuration files load into validated dataclasses; mistakes name the key."""
from pathlib import Path

import pytest

from dist_dl.config import DemoConfig, load_config
from dist_dl.databricks.widgets import read_widgets

CONF = Path(__file__).parent.parent / "conf"


def test_demo_yaml_loads_and_overrides_apply():
    config = load_config(DemoConfig, CONF / "demo.yaml", {"epochs": 1, "np": None})
    assert config.epochs == 1 and config.np == 2 and config.master == "local[2]"


def test_unknown_key_names_the_key_and_the_valid_ones(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochz: 3\n")
    with pytest.raises(ValueError, match=r"unknown key 'epochz'.*did you mean 'epochs'.*valid keys"):
        load_config(DemoConfig, bad)


def test_wrong_type_and_bad_value_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"'batch_size' in overrides must be int, got str"):
        load_config(DemoConfig, None, {"batch_size": "32"})
    with pytest.raises(ValueError, match="np must be non-zero"):
        load_config(DemoConfig, None, {"np": 0})


class _Widgets:
    def __init__(self, values):
        self.values, self.created = values, []

    def text(self, name, default):
        self.created.append((name, default))

    def get(self, name):
        return self.values.get(name, dict(self.created)[name])


class _DbUtils:
    def __init__(self, values):
        self.widgets = _Widgets(values)


def test_widgets_default_without_dbutils_and_convert_with_it():
    assert read_widgets({"np": 2, "lr": 0.1}) == {"np": 2, "lr": 0.1}
    dbutils = _DbUtils({"np": "4", "fast": "true"})
    assert read_widgets({"np": 2, "lr": 0.1, "fast": False}, dbutils) == {"np": 4, "lr": 0.1, "fast": True}
    assert dbutils.widgets.created == [("np", "2"), ("lr", "0.1"), ("fast", "False")]
    with pytest.raises(ValueError, match="widget 'np' must be int, got 'four'"):
        read_widgets({"np": 2}, _DbUtils({"np": "four"}))
