"""Every configuration field declares its check; the declarations are enforced."""
import dataclasses
import importlib
import pkgutil

import pytest

import dist_dl
from dist_dl.core.settings import SETTING, checked, checked_classes, setting


def _config_classes() -> list[type]:
    """Every dataclass named ``*Config`` in the package, and every class
    checked by declaration (the argument specs of ``search`` and
    ``train_ensemble``)."""
    found = set()
    for info in pkgutil.walk_packages(dist_dl.__path__, "dist_dl."):
        leaf = info.name.rsplit(".", 1)[-1]
        if leaf.endswith("_worker_main") or leaf == "__main__":
            continue  # process entry points (they run on import), not library modules
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (isinstance(value, type) and dataclasses.is_dataclass(value)
                    and value.__module__ == module.__name__ and value.__name__.endswith("Config")):
                found.add(value)
    return sorted(found | set(checked_classes()), key=lambda c: (c.__module__, c.__qualname__))


def test_every_field_of_every_configuration_declares_its_check():
    classes = _config_classes()
    names = {c.__name__ for c in classes}
    # The walk must find the configurations at all (a broken walk passes nothing).
    assert {"TrainConfig", "DataConfig", "ShardConfig", "ReaderConfig", "PipelineConfig",
            "BenchConfig", "SearchConfig", "EnsembleConfig", "_Spec"} <= names, names
    unchecked = [c.__qualname__ for c in classes if c not in checked_classes()]
    assert not unchecked, f"decorate these with @dist_dl.core.settings.checked(...): {unchecked}"
    undeclared = [f"{c.__qualname__}.{f.name}" for c in classes for f in dataclasses.fields(c)
                  if SETTING not in f.metadata]
    assert not undeclared, f"declare these with dist_dl.core.settings.setting(...): {undeclared}"


def test_a_field_without_a_declaration_is_refused_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"declares \['steps'\] without dist_dl.core.settings.setting"):
        @dataclasses.dataclass(frozen=True)
        @checked("x.")
        class Loose:
            epochs: int = setting(1, low=1)
            steps: int = 3
    with pytest.raises(TypeError, match="put @checked below @dataclass"):
        @checked("x.")
        @dataclasses.dataclass(frozen=True)
        class Upside:
            epochs: int = setting(1, low=1)


def test_declared_types_bounds_and_choices_are_checked_with_named_errors():
    @dataclasses.dataclass(frozen=True)
    @checked("demo.")
    class Demo:
        count: int = setting(1, low=1)
        share: float = setting(0.5, low=0.0, high=1.0, high_open=True)
        limit: float | None = setting(None, low=0.0, low_open=True)
        mode: str = setting("a", choices=("a", "b"))
        on: bool = setting(True)
        name: str = setting("x", nonempty=True)

        def __post_init__(self):  # runs after the declared checks
            if self.mode == "b" and self.limit is None:
                raise ValueError("demo.mode 'b' needs demo.limit")

    assert Demo(share=0, limit=2).share == 0
    cases = [
        (dict(count=0), "demo.count must be a positive int, got 0"),
        (dict(count=True), "demo.count must be a positive int, got True"),
        (dict(count=1.0), "demo.count must be a positive int, got 1.0"),
        (dict(share=1.0), r"demo.share must be a number in \[0, 1\), got 1.0"),
        (dict(limit=0), "demo.limit must be a number > 0 or None, got 0"),
        (dict(mode="c"), r"demo.mode must be one of \('a', 'b'\), got 'c'"),
        (dict(on="false"), "demo.on must be true or false, got 'false'"),
        (dict(name=""), "demo.name must be a non-empty string, got ''"),
        (dict(mode="b"), "demo.mode 'b' needs demo.limit"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            Demo(**kwargs)

    @dataclasses.dataclass(frozen=True)
    @checked()
    class Arguments:
        workers: int = setting(low=2, why="one is not an ensemble")

    with pytest.raises(ValueError, match=r"^workers=1 must be an int >= 2 \(one is not an "):
        Arguments(workers=1)
