"""Configuration files load into validated dataclasses; mistakes name the key."""
import dataclasses
from pathlib import Path

import pytest

from dist_dl import TrainConfig, train_distributed
from dist_dl.app.cli import build_parser, main
from dist_dl.app.config import (PipelineConfig, config_names, config_path, load_config,
                            parse_overrides, to_dict)
from dist_dl.app.databricks.widgets import read_widgets

CONF = Path(__file__).parents[2] / "conf"


def test_every_shipped_configuration_loads_and_defaults_yaml_is_the_code_defaults():
    names = config_names()
    assert {"defaults", "demo", "demo-torch", "imagenet_resnet50",
            "synthetic_benchmark"} <= set(names)
    assert sorted(p.stem for p in CONF.glob("*.yaml")) == names
    for name in names:
        assert isinstance(load_config(PipelineConfig, name), PipelineConfig)
    # conf/defaults.yaml documents the defaults: it may not drift from the code.
    assert load_config(PipelineConfig, "defaults") == PipelineConfig()


def test_a_file_then_overrides_dotted_or_nested():
    config = load_config(PipelineConfig, CONF / "demo.yaml",
                         {"train.epochs": 1, "train.batch_size": None,
                          "tracking": {"experiment_name": "x"}})
    assert config.train.epochs == 1 and config.train.batch_size == 32  # None keeps the file's
    assert config.tracking.experiment_name == "x" and config.data.source == "sklearn_digits"
    assert config.evaluate == load_config(PipelineConfig, "demo").evaluate
    assert config_path("demo") == str(CONF / "demo.yaml")


def test_unknown_key_names_the_key_with_its_section_and_the_valid_ones(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochz: 3\n")
    with pytest.raises(ValueError, match=r"unknown key 'train.epochz' in .*bad.yaml \(did you "
                                         r"mean 'train.epochs'\?\); valid keys of train: .*epochs"):
        load_config(PipelineConfig, bad)
    with pytest.raises(ValueError, match=r"unknown key 'trian'.*did you mean 'train'"):
        load_config(PipelineConfig, None, {"trian.epochs": 3})


def test_wrong_type_and_bad_value_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"'train.batch_size' in overrides must be int, got str"):
        load_config(PipelineConfig, None, {"train.batch_size": "32"})
    with pytest.raises(ValueError, match=r"TrainConfig.num_workers must be a positive int"):
        load_config(PipelineConfig, None, {"train.num_workers": 0})
    with pytest.raises(ValueError, match=r"data.source is 'folder' but data.train_dir is not set"):
        load_config(PipelineConfig, None, {"data.source": "folder"})
    with pytest.raises(ValueError, match=r"search.space names \['learning_rat'\]"):
        load_config(PipelineConfig, None, {"search.space": {"learning_rat": [0.1, 0.2]}})
    with pytest.raises(FileNotFoundError, match=r"no configuration 'nope'.*demo"):
        load_config(PipelineConfig, "nope")


def test_every_setting_is_checked_including_the_flags_and_names_after_the_numbers(tmp_path):
    # TrainConfig's checks of its flags and names once sat after a return and
    # never ran, so shuffle="false" (a truthy string) trained with shuffling.
    with pytest.raises(ValueError, match="TrainConfig.shuffle must be true or false, got 'false'"):
        TrainConfig(shuffle="false")
    with pytest.raises(ValueError, match="TrainConfig.label_col must be a non-empty string"):
        TrainConfig(label_col="")
    # train_distributed checks its settings before it looks at the data.
    with pytest.raises(ValueError, match="TrainConfig.shuffle must be true or false"):
        train_distributed(str(tmp_path / "nowhere"), shuffle="false")
    with pytest.raises(ValueError, match=r"data.mode must be one of \('error', 'overwrite', "
                                         r"'append'\), got 'replace'"):
        load_config(PipelineConfig, None, {"data.mode": "replace"})
    with pytest.raises(ValueError, match=r"bench.warmup_steps must be an int >= 0, got -1"):
        load_config(PipelineConfig, None, {"bench.warmup_steps": -1})
    with pytest.raises(ValueError, match=r"evaluate.alias must be a name \(letters, digits, _\)"):
        load_config(PipelineConfig, None, {"evaluate.alias": "a b"})


def test_overrides_parse_as_yaml_scalars():
    assert parse_overrides(["train.epochs=3", "train.augment=false", "tracking.run_name=a=b",
                            "train.cache_dir=null", "data.output="]) == {
        "train.epochs": 3, "train.augment": False, "tracking.run_name": "a=b",
        "train.cache_dir": None, "data.output": ""}
    with pytest.raises(ValueError, match="section.key=value"):
        parse_overrides(["train.epochs"])


def test_every_step_is_a_command_and_bad_settings_exit_with_one_line(capsys):
    parser = build_parser()
    for command in ("prepare-data", "train", "evaluate", "score", "bench", "ensemble", "search",
                    "pipeline", "configs", "jobs"):
        assert parser.parse_args([command] + ([] if command != "jobs" else ["validate"]))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", "demo", "--set", "train.epochz=2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "dist-dl train: error: unknown key 'train.epochz'" in err and "Traceback" not in err
    assert main(["configs", "demo", "--set", "train.epochs=7"]) == 0
    assert "epochs: 7" in capsys.readouterr().out


def test_to_dict_round_trips():
    config = load_config(PipelineConfig, "imagenet_resnet50")
    assert load_config(PipelineConfig, None, _flatten(to_dict(config))) == config


def _flatten(nested, prefix=""):
    flat = {}
    for key, value in nested.items():
        if isinstance(value, dict) and not (prefix == "search." and key == "space"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return {k: v for k, v in flat.items() if v is not None}


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


def test_blank_widgets_defer_to_the_configuration_and_local_values_apply_without_dbutils():
    defaults = {"config": "demo", "epochs": None, "lr": None}
    assert read_widgets(defaults, local={"epochs": 2}) == {"config": "demo", "epochs": 2,
                                                            "lr": None}
    dbutils = _DbUtils({"config": "imagenet_resnet50", "lr": "0.05"})
    values = read_widgets(defaults, dbutils, local={"epochs": 2})
    assert values == {"config": "imagenet_resnet50", "epochs": None, "lr": 0.05}
    assert ("epochs", "") in dbutils.widgets.created
    config = load_config(PipelineConfig, values["config"], {"train.epochs": values["epochs"],
                                                              "train.learning_rate": values["lr"]})
    assert config.train.epochs == 90 and config.train.learning_rate == 0.05
    with pytest.raises(ValueError, match="local names \\['epoch'\\]"):
        read_widgets(defaults, local={"epoch": 2})


def test_config_dataclasses_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PipelineConfig().train.epochs = 3  # type: ignore[misc]
