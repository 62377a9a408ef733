"""Configuration: frozen dataclasses, loaded from YAML files in ``conf/`` and
overridden by command-line (``--set train.epochs=3``) or notebook-widget values.

A file has one section per step (``data``, ``train``, ``tracking``,
``evaluate``, ``score``, ...), each a dataclass validated on construction. An
unknown or mistyped key is an error that names the key (with its section)
and the valid ones; a value of the wrong type names the key and the type.

Files are found by path, or by name among the configurations shipped with
the wheel (the repository's ``conf/`` folder, installed as ``dist_dl.conf``):
``load_config(PipelineConfig, "imagenet_resnet50")``.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from typing import Any, Mapping, TypeVar

from dist_dl.core.deprecation import rename_keys, renamed_parameters, renames_of
from dist_dl.core.settings import checked, setting
from dist_dl.prepare.config import DataConfig
from dist_dl.train.config import TrainConfig

__all__ = ["PipelineConfig", "TrackingConfig", "EvaluateConfig", "ScoreConfig", "BenchConfig",
           "EnsembleConfig", "SearchConfig",
           "load_config", "from_mapping", "parse_overrides", "config_path", "config_names",
           "to_dict"]

T = TypeVar("T")

ENSEMBLE_SOURCES = ("table", "sklearn_digits", "sklearn_wine", "sklearn_breast_cancer")


@renamed_parameters({"experiment": "experiment_name"})
@dataclasses.dataclass(frozen=True)
@checked("tracking.")
class TrackingConfig:
    """Where runs and models are logged.

    Attributes:
        tracking_uri: MLflow tracking URI; None: MLflow's own default (the
            workspace on Databricks, ``MLFLOW_TRACKING_URI`` if set), and for
            the local jobs ``file:<output_dir>/mlruns``.
        experiment_name: MLflow experiment name (on Databricks a workspace
            path such as ``/Shared/dist_dl``). The old key ``experiment`` is
            read with a warning for one release.
        run_name: Name of the training run; default: the model's name.
        registered_model_name: Register the trained model under this name.
    """

    tracking_uri: str | None = setting(None)
    experiment_name: str = setting("dist_dl", nonempty=True)
    run_name: str | None = setting(None)
    registered_model_name: str | None = setting(None)


@dataclasses.dataclass(frozen=True)
@checked("evaluate.")
class EvaluateConfig:
    """The gate between training and scoring.

    Attributes:
        min_accuracy: The model is promoted (``alias`` set on its registered
            version) only if its accuracy on the validation shards is at
            least this.
        alias: Registry alias given to a model that passes.
        batch_size: Images per forward pass.
    """

    min_accuracy: float = setting(0.0, low=0.0, high=1.0)
    alias: str = setting("champion", test=str.isidentifier,
                         expected="a name (letters, digits, _)")
    batch_size: int = setting(64, low=1)


@dataclasses.dataclass(frozen=True)
@checked("score.")
class ScoreConfig:
    """Batch scoring with a logged model.

    Attributes:
        input: What to score: image shards (folder or Delta table) or a Spark
            table name; default: the validation shards of the ``data`` section.
        output: Where the scored rows go (Parquet folder, or a table name when
            ``input`` is a table).
        model_uri: MLflow model URI; default
            ``models:/<registered_model_name>@<evaluate.alias>``.
        image_col: Column of encoded images in ``input``.
        batch_size: Rows per call to the model on each executor.
        on_error: An image that cannot be scored: ``"raise"`` fails the job
            naming it; ``"null"`` writes a null prediction and the reason in
            column ``score_error``.
    """

    input: str | None = setting(None)
    output: str | None = setting(None)
    model_uri: str | None = setting(None)
    image_col: str = setting("image", nonempty=True)
    batch_size: int = setting(64, low=1)
    on_error: str = setting("raise", choices=("raise", "null"))


@renamed_parameters({"workers": "num_workers"})
@dataclasses.dataclass(frozen=True)
@checked("bench.")
class BenchConfig:
    """The throughput and scaling benchmark (``dist-dl bench``).

    Attributes:
        model: Model name from the registry.
        image_size: Side of the synthetic images.
        batch_size: Images per step on each worker.
        num_workers: Data-parallel workers of the scaled setup (the old key
            ``workers`` is read with a warning for one release).
        steps: Timed steps per measurement (after ``warmup_steps``).
        warmup_steps: Untimed steps first (graph tracing, allocator warm-up).
        rounds: Times the setups are repeated, interleaved (medians are
            reported: shared machines are noisy).
        threads_per_worker: TensorFlow threads of each worker.
        fp16_allreduce: Compress gradients to float16 in the scaled setup.
        mixed_precision: ``"auto"`` (float16 compute on GPUs, float32 on
            CPUs), ``"on"`` or ``"off"``, in every setup.
        peer: Also run the peer: Horovod's own Keras recipe, launched with
            ``horovod.spark.run`` on the same Spark (``dist / peer``).
        reader_check: Also time one worker's reader alone on the same shards
            (is training input-bound?), and say how many CPU cores each
            device needs to feed it (`cores_per_device()`).
        device_images_per_second: The training rate of one device to size the
            input for (e.g. one GPU's images/s for this model); default: the
            rate per worker measured here.
        output: JSON file the full record is written to (optional).
        results: Shared results file the headline ratios are merged into,
            with a PNG beside it (e.g. ``benchmarks/results.json``; optional).
    """

    model: str = setting("resnet50", nonempty=True)
    image_size: int = setting(64, low=1)
    batch_size: int = setting(32, low=1)
    num_workers: int = setting(2, low=1)
    steps: int = setting(20, low=1)
    warmup_steps: int = setting(5, low=0)
    rounds: int = setting(3, low=1)
    threads_per_worker: int = setting(1, low=1)
    fp16_allreduce: bool = setting(False)
    mixed_precision: str = setting("auto", choices=("auto", "on", "off"))
    peer: bool = setting(True)
    reader_check: bool = setting(True)
    device_images_per_second: float | None = setting(None, low=0.0, low_open=True)
    output: str | None = setting(None)
    results: str | None = setting(None)


@dataclasses.dataclass(frozen=True)
@checked("ensemble.")
class EnsembleConfig:
    """An ensemble of random forests on a table (``dist-dl ensemble``).

    Attributes:
        source: ``"table"`` (the Spark table ``table``) or one of
            scikit-learn's bundled tabular datasets: ``"sklearn_digits"``,
            ``"sklearn_wine"``, ``"sklearn_breast_cancer"``.
        table: Spark table (or view) name for ``source: table``.
        feature_cols: Feature columns; default every numeric column but the label.
        label_col: Label column.
        num_models: Members (and partitions).
        combine: ``"vote"`` or ``"mean"``.
        n_estimators, max_depth: Each member's random forest.
        validation_fraction: Rows held out to score members and ensemble.
        seed: Seed of the split and the members.
    """

    source: str = setting("sklearn_digits", choices=ENSEMBLE_SOURCES)
    table: str | None = setting(None)
    feature_cols: tuple | None = setting(None)
    label_col: str = setting("label", nonempty=True)
    num_models: int = setting(4, low=2)
    combine: str = setting("vote", choices=("vote", "mean"))
    n_estimators: int = setting(50, low=1)
    max_depth: int | None = setting(12, low=1)
    validation_fraction: float = setting(0.2, low=0.0, high=0.5, low_open=True, high_open=True)
    seed: int = setting(0)

    def __post_init__(self):
        if self.source == "table" and not self.table:
            raise ValueError("ensemble.source is 'table' but ensemble.table is not set")


@dataclasses.dataclass(frozen=True)
@checked("search.")
class SearchConfig:
    """Hyperparameter trials of the ``train`` settings (``dist-dl search``).

    Each trial trains the ``train`` section's model on the ``data`` shards in
    one Spark task (one process, no Horovod) with the sampled values.

    Attributes:
        space: ``train`` key -> ``{"loguniform": [low, high]}``,
            ``{"uniform": [low, high]}``, ``{"int": [low, high]}`` or a list
            of choices.
        max_trials: Trials to run.
        max_concurrent: Trials at once (one Spark task slot each).
        algorithm: ``"random"``, ``"grid"`` or ``"tpe"`` (Optuna).
        early_stopping: ``"median"``, ``"hyperband"`` or null.
        epochs: Epochs per trial.
        max_steps_per_epoch: Cap on each trial's steps per epoch.
        seed: Seed of the sampler.
    """

    space: dict = setting(default_factory=lambda: {
        "learning_rate": {"loguniform": [0.001, 0.1]}, "momentum": [0.0, 0.9]},
        nonempty=True, expected="a mapping of train keys to ranges or lists of choices")
    max_trials: int = setting(8, low=1)
    max_concurrent: int = setting(2, low=1)
    algorithm: str = setting("tpe", choices=("random", "grid", "tpe"))
    early_stopping: str | None = setting("median", choices=("median", "hyperband"))
    epochs: int = setting(3, low=1)
    max_steps_per_epoch: int | None = setting(None, low=1)
    seed: int = setting(0)

    def __post_init__(self):
        unknown = sorted(set(self.space) - {f.name for f in dataclasses.fields(TrainConfig)})
        if unknown:
            raise ValueError(f"search.space names {unknown}, which are not keys of the train "
                             f"section; valid: {', '.join(f.name for f in dataclasses.fields(TrainConfig))}")


@dataclasses.dataclass(frozen=True)
@checked("")
class PipelineConfig:
    """One configuration file: a section per step of the pipeline (each
    section checks its own settings)."""

    data: DataConfig = setting(DataConfig())
    train: TrainConfig = setting(TrainConfig())
    tracking: TrackingConfig = setting(TrackingConfig())
    evaluate: EvaluateConfig = setting(EvaluateConfig())
    score: ScoreConfig = setting(ScoreConfig())
    bench: BenchConfig = setting(BenchConfig())
    ensemble: EnsembleConfig = setting(EnsembleConfig())
    search: SearchConfig = setting(SearchConfig())


# ------------------------------------------------------------------ loading

def _allowed(hint) -> tuple[tuple[type, ...], bool]:
    """(accepted types, None allowed) for a field's type hint."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return tuple(a for a in args if a is not type(None)), type(None) in args
    return (origin or hint,), False


def _check_value(key: str, value: Any, hint, source: str) -> Any:
    kinds, nullable = _allowed(hint)
    if value is None:
        if nullable:
            return None
        raise ValueError(f"{key!r} in {source} must be {_names(kinds)}, got null")
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tuple in kinds and isinstance(value, list):
        return tuple(value)
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise ValueError(f"{key!r} in {source} must be {_names(kinds)}, "
                         f"got {type(value).__name__} {value!r}")
    return value


def _names(kinds) -> str:
    return " or ".join(k.__name__ for k in kinds)


def from_mapping(cls: type[T], values: Mapping[str, Any], source: str = "configuration",
                 prefix: str = "") -> T:
    """Build ``cls`` from a mapping, checking keys and types; a field whose
    type is itself a config dataclass takes a nested mapping (a section)."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{prefix.rstrip('.') or 'the configuration'} in {source} must be a "
                         f"mapping of keys to values, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = rename_keys(values, renames_of(cls), error=ValueError,
                         where=f"{prefix.rstrip('.') or 'the configuration'} in {source}")
    unknown = [k for k in values if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
        raise ValueError(f"unknown key {prefix + str(key)!r} in {source}{hint}; valid keys"
                         f"{' of ' + prefix.rstrip('.') if prefix else ''}: {', '.join(fields)}")
    checked = {}
    for key, value in values.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            checked[key] = from_mapping(hint, value, source, prefix=f"{prefix}{key}.")
        else:
            checked[key] = _check_value(f"{prefix}{key}", value, hint, source)
    try:
        return cls(**checked)
    except ValueError as exc:
        raise ValueError(f"{exc} (in {source})") from None


def config_names() -> list[str]:
    """The configurations shipped with the package (``conf/*.yaml``)."""
    folder = _shipped()
    return sorted(p[:-5] for p in os.listdir(folder) if p.endswith(".yaml")) if folder else []


def _shipped() -> str | None:
    try:
        import dist_dl.conf as conf
    except ImportError:
        return None
    return list(conf.__path__)[0]


def config_path(name: str | os.PathLike) -> str:
    """The file for ``name``: an existing path, or the name of a shipped
    configuration (``"demo"`` -> ``conf/demo.yaml``)."""
    text = os.fspath(name)
    if os.path.isfile(text):
        return text
    folder = _shipped()
    if folder and os.sep not in text and not text.endswith((".yaml", ".yml")):
        candidate = os.path.join(folder, f"{text}.yaml")
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"no configuration {text!r}: give a YAML file's path or one of the "
                            f"shipped names ({', '.join(config_names()) or 'none found'})")


def parse_overrides(items) -> dict[str, Any]:
    """``["train.epochs=3", "tracking.run_name=x"]`` to a mapping; values are
    read as YAML scalars (``3`` is an int, ``true`` a bool, ``null`` None)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, text = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} must look like section.key=value")
        out[key.strip()] = yaml.safe_load(text) if text.strip() else ""
    return out


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r} goes inside {part!r}, which is a value")
        node[leaf] = value
    return nested


def _merge(base: dict, extra: Mapping) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(cls: type[T], path: str | os.PathLike | None = None,
                overrides: Mapping[str, Any] | None = None) -> T:
    """Load ``cls`` from a YAML file (a path or a shipped name; optional),
    then apply ``overrides``.

    Overrides may be nested mappings or dotted keys (``{"train.epochs": 3}``);
    values that are None are ignored, so unset command-line flags keep the
    file's values.
    """
    import yaml

    values: dict[str, Any] = {}
    source = "overrides"
    if path is not None:
        source = config_path(path)
        with open(source) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{source} must hold a mapping of keys to values, "
                             f"got {type(loaded).__name__}")
        values = _renamed(cls, loaded, source)
        from_mapping(cls, values, source=source)  # report the file's own errors as such
    given = _renamed(cls, _nest({k: v for k, v in (overrides or {}).items() if v is not None}),
                     "overrides")
    if given:
        values = _merge(values, given)
        source = f"{source} with overrides" if path is not None else source
    return from_mapping(cls, values, source=source)


def _renamed(cls, values, source: str, prefix: str = ""):
    """``values`` with the deprecated keys of ``cls`` and of its sections
    under their new names (each warns once, here, before file and overrides
    are merged: an old key in the file and its new name in an override is
    the override winning, not a clash)."""
    if not isinstance(values, Mapping):
        return values  # from_mapping reports it
    values = rename_keys(values, renames_of(cls),
                         where=f"{prefix.rstrip('.') or 'the configuration'} in {source}",
                         stacklevel=3, error=ValueError)
    hints = typing.get_type_hints(cls)
    return {key: _renamed(hints[key], value, source, f"{prefix}{key}.")
            if key in hints and dataclasses.is_dataclass(hints[key]) else value
            for key, value in values.items()}


def to_dict(config) -> dict[str, Any]:
    """A config as plain nested values (for MLflow params and YAML)."""
    return dataclasses.asdict(config)
