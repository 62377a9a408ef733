"""One name per concept in the public API, and the old names of renamed
parameters and keys accepted for one release (``dist_dl.core.deprecation``).

No Spark, no training: the runners are constructed, never run; the readers
plan tiny Parquet shards written with pyarrow.
"""
import argparse
import dataclasses
import importlib
import inspect
import warnings

import pytest

from dist_dl.core.deprecation import rename_keys, renamed_attribute, renamed_parameters, renames_of

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------------------ the rule

# What each concept is called in dist_dl's own API, and the synonyms that must
# not appear in a public signature, dataclass field, configuration key or
# command-line flag (outside the compatibility boundaries below).
SYNONYMS = {
    "num_workers": {"np", "num_proc", "num_processes", "nproc", "workers", "n_workers",
                    "world_size", "size", "num_ranks"},
    "experiment_name": {"experiment", "experiment_path", "mlflow_experiment", "exp_name"},
    "tracking_uri": {"mlflow_uri", "tracking_url", "mlflow_tracking_uri"},
    "registered_model_name": {"registered_model", "registry_name"},
    "image_col": {"image_column", "img_col", "images_col"},
    "label_col": {"label_column", "target_col", "y_col"},
    "seed": {"random_state", "random_seed", "rng_seed"},
    "output_dir": {"out_dir", "outdir", "output_folder", "work_dir"},
    "classes": {"num_classes", "n_classes"},
    "class_names": {"labels_names", "class_labels"},
}
FORBIDDEN = {old: new for new, olds in SYNONYMS.items() for old in olds}

# The names a compatibility contract fixes, where they may stay:
# HorovodRunner(np=...) is sparkdl's constructor, and TFDistributeRunner keeps
# it so that swapping one runner for the other changes the class name only
# (np carries a count and a place in its sign, which num_workers does not).
# TorchDistributor(num_processes=...) is pyspark's constructor.
BOUNDARY = {("np", "HorovodRunner"), ("np", "TFDistributeRunner"),
            ("num_processes", "TorchDistributor")}

PUBLIC_MODULES = ["dist_dl", "dist_dl.launch", "dist_dl.train", "dist_dl.prepare", "dist_dl.read",
                  "dist_dl.ensemble", "dist_dl.search", "dist_dl.score", "dist_dl.tracking",
                  "dist_dl.app.databricks", "dist_dl.app.config", "dist_dl.app.bench", "dist_dl.app.pipeline"]


def _public_objects():
    seen = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            if attr in ("MlflowEpochLogger", "Normalize"):
                continue  # a Keras callback, a torch module: defined on first use (import them)
            value = getattr(module, attr)
            if callable(value):
                seen.setdefault(f"{name}.{attr}", value)
    return seen


def _names_of(obj):
    """(owner, name) of every parameter of obj (and of a class's public
    methods) and every field of a dataclass, nested sections included."""
    owner = getattr(obj, "__qualname__", repr(obj))
    out = []
    if dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            out.append((owner, field.name))
            if isinstance(field.type, type) and dataclasses.is_dataclass(field.type):
                out += _names_of(field.type)
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        params = {}
    out += [(owner, p) for p in params if p not in ("self", "cls", "args", "kwargs")]
    if inspect.isclass(obj):
        for attr, member in vars(obj).items():
            if not attr.startswith("_") and inspect.isfunction(member):
                out += [(f"{owner}.{attr}", p) for p in inspect.signature(member).parameters
                        if p not in ("self", "cls", "args", "kwargs")]
    return out


def test_public_signatures_use_one_name_per_concept():
    objects = _public_objects()
    # The walk must find the API at all (a broken walk passes nothing).
    assert {"dist_dl.HorovodRunner", "dist_dl.train_distributed", "dist_dl.TrainConfig",
            "dist_dl.ensemble.train_ensemble", "dist_dl.search.search",
            "dist_dl.read.make_dataset", "dist_dl.app.config.PipelineConfig",
            "dist_dl.app.bench.run_benchmark"} <= set(objects)
    from dist_dl.app.config import PipelineConfig

    found = set()
    for obj in list(objects.values()) + [PipelineConfig]:
        found.update(_names_of(obj))
    assert ("TrainConfig", "num_workers") in found and ("HorovodRunner", "np") in found
    wrong = sorted(f"{owner}({name}): call it {FORBIDDEN[name]!r}" for owner, name in found
                   if name in FORBIDDEN and (name, owner.split(".")[0]) not in BOUNDARY)
    assert not wrong, "synonyms in the public API:\n" + "\n".join(wrong)


def test_command_line_flags_use_the_same_names():
    from dist_dl.app.cli import build_parser

    flags = set()
    parsers = [build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(s.lstrip("-").replace("-", "_") for s in action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    assert {"config", "set", "master"} <= flags
    assert not flags & set(FORBIDDEN), sorted(flags & set(FORBIDDEN))


# ---------------------------------------------------------------- the helper

def test_the_helper_passes_an_old_keyword_under_its_new_name_with_a_warning():
    @renamed_parameters({"old": "new"})
    def f(*, new=None):
        return new

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(new=1) == 1  # the new name: no warning
    with pytest.warns(FutureWarning, match="'old' of .*f\\(\\) is deprecated .*use 'new'") as rec:
        assert f(old=2) == 2
    assert rec[0].filename == __file__  # points at the caller's line
    with pytest.raises(TypeError, match="both argument 'old' and its new name 'new'"):
        f(old=1, new=1)
    assert list(inspect.signature(f).parameters) == ["new"]
    assert renames_of(f) == {"old": "new"}


def test_keys_and_attributes_too():
    with pytest.warns(FutureWarning, match="key 'a' of x is deprecated .*use 'b'"):
        assert rename_keys({"a": 1, "c": 2}, {"a": "b"}, where="x") == {"b": 1, "c": 2}
    with pytest.raises(ValueError, match="both key 'a' and its new name 'b'"):
        rename_keys({"a": 1, "b": 1}, {"a": "b"}, where="x", error=ValueError)

    @dataclasses.dataclass(frozen=True)
    class Result:
        new: int
        old = renamed_attribute("new")

    with pytest.warns(FutureWarning, match="attribute 'old' of .*Result is deprecated .*use 'new'"):
        assert Result(3).old == 3
    assert [f.name for f in dataclasses.fields(Result)] == ["new"]


def test_the_helper_refuses_a_rename_that_is_not_one():
    with pytest.raises(ValueError, match="identifiers that differ"):
        renamed_parameters({"same": "same"})


# ------------------------------------------------- each renamed public name

def _renamed_callables():
    from dist_dl.app.bench import publish_results, run_benchmark
    from dist_dl.app.config import BenchConfig, TrackingConfig
    from dist_dl.ensemble import Ensemble
    from dist_dl.read import ShardPlan, make_dataset, plan_shards, steps_per_epoch
    from dist_dl.train import train_distributed

    return [(train_distributed, "experiment", "experiment_name"),
            (run_benchmark, "experiment", "experiment_name"),
            (publish_results, "experiment", "experiment_name"),
            (TrackingConfig, "experiment", "experiment_name"),
            (BenchConfig, "workers", "num_workers"),
            (make_dataset, "size", "num_workers"),
            (plan_shards, "size", "num_workers"),
            (steps_per_epoch, "size", "num_workers"),
            (ShardPlan, "size", "num_workers"),
            (Ensemble, "classes", "class_names")]


@pytest.mark.parametrize("index", range(10))
def test_every_renamed_parameter_takes_its_new_name_and_refuses_both(index):
    target, old, new = _renamed_callables()[index]
    assert renames_of(target).get(old) == new
    params = inspect.signature(target).parameters
    assert new in params and old not in params
    # Both names: refused before the call does anything.
    with pytest.raises(TypeError, match=f"both argument '{old}' and its new name '{new}'"):
        target(**{old: 1, new: 1})


def test_old_names_of_the_configuration_sections_warn_and_work():
    from dist_dl.app.config import BenchConfig, TrackingConfig

    with pytest.warns(FutureWarning, match="'experiment' of TrackingConfig\\(\\) .*'experiment_name'"):
        assert TrackingConfig(experiment="x").experiment_name == "x"
    with pytest.warns(FutureWarning, match="'workers' of BenchConfig\\(\\) .*'num_workers'"):
        assert BenchConfig(workers=3).num_workers == 3
    with pytest.raises(TypeError, match="'workers' and its new name 'num_workers'"):
        BenchConfig(workers=3, num_workers=3)


def test_old_yaml_keys_and_overrides_warn_and_load(tmp_path, capsys):
    from dist_dl.cli import main
    from dist_dl.app.config import PipelineConfig, from_mapping, load_config

    old = tmp_path / "old.yaml"
    old.write_text("tracking:\n  experiment: x\nbench:\n  workers: 3\n")
    with pytest.warns(FutureWarning) as rec:
        config = load_config(PipelineConfig, old)
    assert (config.tracking.experiment_name, config.bench.num_workers) == ("x", 3)
    messages = sorted(str(w.message) for w in rec)
    assert len(messages) == 2, messages  # once each, not once per pass over the file
    assert "key 'experiment' of tracking in " in messages[0] and \
        "use 'experiment_name'" in messages[0]
    assert "key 'workers' of bench in " in messages[1] and "use 'num_workers'" in messages[1]

    # An override in the new name wins over the file's old key (not a clash).
    with pytest.warns(FutureWarning):
        config = load_config(PipelineConfig, old, {"tracking.experiment_name": "y"})
    assert config.tracking.experiment_name == "y"
    with pytest.warns(FutureWarning, match="key 'experiment' of tracking in overrides"):
        config = load_config(PipelineConfig, None, {"tracking.experiment": "z"})
    assert config.tracking.experiment_name == "z"
    with pytest.warns(FutureWarning):
        assert from_mapping(PipelineConfig, {"bench": {"workers": 4}}).bench.num_workers == 4

    both = tmp_path / "both.yaml"
    both.write_text("tracking:\n  experiment: x\n  experiment_name: x\n")
    with pytest.raises(ValueError, match="tracking in .*both.yaml got both key 'experiment' and "
                                         "its new name 'experiment_name': give only"):
        load_config(PipelineConfig, both)

    with pytest.warns(FutureWarning):
        assert main(["configs", "defaults", "--set", "tracking.experiment=cli"]) == 0
    assert "experiment_name: cli" in capsys.readouterr().out


def test_old_names_of_functions_and_results_warn_and_work(tmp_path):
    from dist_dl.app.bench import publish_results, result_entry
    from dist_dl.prepare import make_synthetic_images
    from dist_dl.read import plan_shards, steps_per_epoch
    from dist_dl.train import train_distributed

    url = str(tmp_path / "shards")
    make_synthetic_images(url, rows=32, image_size=8, classes=2, rows_per_row_group=4)
    with pytest.warns(FutureWarning, match="'size' of plan_shards\\(\\) .*'num_workers'"):
        plan = plan_shards(url, size=2, batch_size=4)
    assert plan.num_workers == 2
    with pytest.warns(FutureWarning, match="attribute 'size' of ShardPlan .*'num_workers'"):
        assert plan.size == 2
    with pytest.warns(FutureWarning, match="'size' of steps_per_epoch\\(\\)"):
        assert steps_per_epoch(url, size=2, batch_size=4) == plan.steps_per_epoch

    results = str(tmp_path / "results.json")
    with pytest.warns(FutureWarning, match="'experiment' of publish_results\\(\\)"):
        out = publish_results(results, {"x": result_entry([1.0], command="test")},
                              experiment="unused without log")
    assert out["run_id"] is None

    # The old name reaches the call, which goes on to check its settings.
    with pytest.warns(FutureWarning, match="'experiment' of train_distributed\\(\\)"), \
            pytest.raises(ValueError, match="num_workers"):
        train_distributed(url, experiment="x", num_workers=0)


def test_old_attribute_of_an_ensemble_warns():
    from dist_dl.ensemble import Ensemble

    fields = dict(run_id="r", model_uri="m", score=1.0, member_scores=(), member_rows=(),
                  feature_cols=("a",), label_col="y", combine="vote")
    with pytest.warns(FutureWarning, match="'classes' of Ensemble\\(\\) .*'class_names'"):
        ensemble = Ensemble(classes=(0, 1), **fields)
    assert ensemble == Ensemble(class_names=(0, 1), **fields)
    with pytest.warns(FutureWarning, match="attribute 'classes' of Ensemble .*'class_names'"):
        assert ensemble.classes == (0, 1)


# ----------------------------------------------------------------- backend

def test_backend_is_one_thing_a_name_or_a_launcher_object():
    from dist_dl.launch import HorovodRunner, TFDistributeRunner
    from dist_dl.launch.runners.base import BACKEND_NAMES
    from dist_dl.train.config import BACKENDS

    assert BACKEND_NAMES == BACKENDS  # the runners' names are TrainConfig.backend's
    for runner in (HorovodRunner, TFDistributeRunner):
        assert runner(np=-2, backend="local")._backend is None  # chosen by np, as sparkdl
        assert runner(np=2, backend="spark")._backend is None
        assert runner(np=2)._backend is None and runner(np=-2, backend="auto")._backend is None
        with pytest.raises(ValueError, match="backend='local' but np=2 runs 2 Spark tasks: "
                                             "pass np=-2"):
            runner(np=2, backend="local")
        with pytest.raises(ValueError, match="backend='spark' but np=-2 .* pass np=2"):
            runner(np=-2, backend="spark")
        with pytest.raises(ValueError, match="backend must be one of .*got 'databricks'"):
            runner(np=2, backend="databricks")
        with pytest.raises(TypeError, match="a launcher object with a run"):
            runner(np=2, backend=object())

    class Launcher:
        name = "mine"

        def run(self, fn, kwargs, num_proc, options, sink):
            return fn(**kwargs)

    launcher = Launcher()
    assert HorovodRunner(np=2, backend=launcher)._backend is launcher
