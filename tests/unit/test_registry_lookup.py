"""The registry lookups of dist_dl.app.pipeline: the versions of a registered model
are found by an MLflow search filter that no model name can break or change
(names with quotes, or written to widen the filter), in a file store and in a
SQL store (where the filter becomes SQL); and registered_or_trained, the
"which model will be scored" step that notebook 07 calls."""
from __future__ import annotations

import pytest

from dist_dl.app.config import PipelineConfig, load_config
from dist_dl.app.pipeline import model_versions, registered_or_trained

pytestmark = pytest.mark.timeout(120)

QUOTED = ["it's", 'say "hi"', "other"]


def _store(kind: str, folder):
    """(client, tracking URI) of an empty MLflow store with its registry."""
    from mlflow.tracking import MlflowClient

    uri = (folder / "mlruns").as_uri() if kind == "file" else f"sqlite:///{folder / 'mlflow.db'}"
    return MlflowClient(uri, registry_uri=uri), uri


@pytest.fixture(params=["file", "sqlite"])
def registry(request, tmp_path):
    """Both kinds of store (a SQL store's first use takes ~10 s: its migrations)."""
    return _store(request.param, tmp_path)


@pytest.fixture
def file_registry(tmp_path):
    return _store("file", tmp_path)


def _register(client, name: str, versions: int = 1) -> None:
    client.create_registered_model(name)
    for _ in range(versions):
        client.create_model_version(name, source="file:///nowhere/model")


def test_names_with_quotes_find_exactly_their_versions(registry):
    client, _ = registry
    for number, name in enumerate(QUOTED, start=1):
        _register(client, name, versions=number)
    for number, name in enumerate(QUOTED, start=1):
        found = model_versions(client, name)
        assert sorted((v.name, int(v.version)) for v in found) == \
            [(name, n) for n in range(1, number + 1)]


def test_a_name_cannot_change_the_filter(registry):
    # Formatted into `name = '...'`, the first of these selected the versions of
    # "other"; quoted as a literal it is just a name that is not registered.
    client, _ = registry
    _register(client, "other")
    for name in ["other' AND name != 'x", 'other" AND name != "x', "oth%", "othe_"]:
        assert model_versions(client, name) == [], name


@pytest.mark.parametrize("name", ["both ' and \"", "back\\slash", "line\nbreak", "", " "])
def test_names_that_no_quote_can_hold_are_refused(file_registry, name):
    client, _ = file_registry
    with pytest.raises(ValueError, match="registered model name"):
        model_versions(client, name)


def _config(uri: str, **overrides) -> PipelineConfig:
    return load_config(PipelineConfig, None, {"tracking.tracking_uri": uri, **overrides})


def test_registered_or_trained_gives_the_newest_version_or_says_what_to_do(file_registry):
    client, uri = file_registry
    given = "runs:/0123/model"
    assert registered_or_trained(_config(uri, **{"score.model_uri": given})) == given

    with pytest.raises(ValueError, match="set tracking.registered_model_name"):
        registered_or_trained(_config(uri))
    named = _config(uri, **{"tracking.registered_model_name": "it's"})
    with pytest.raises(ValueError, match=r"\"it's\" has no version: .*train_if_missing=true"):
        registered_or_trained(named)
    _register(client, "it's", versions=2)
    _register(client, "it", versions=3)
    assert registered_or_trained(named) == "models:/it's/2"
