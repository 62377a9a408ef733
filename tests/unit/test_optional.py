"""A missing optional dependency is an error that names the extra to install."""
import re
import sys
from pathlib import Path

import pytest

from dist_dl.core.optional import PACKAGES, require


def _missing(monkeypatch, *modules):
    # None in sys.modules makes `import name` fail, as if it were not installed.
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_missing_scikit_learn_names_the_samples_extra(monkeypatch, tmp_path):
    from dist_dl.prepare import write_digits_tree

    _missing(monkeypatch, "sklearn", "sklearn.datasets")
    with pytest.raises(ImportError, match=re.escape(
            "the sklearn_digits sample images needs scikit-learn, which cannot be imported here")
            ) as info:
        write_digits_tree(str(tmp_path))
    assert "pip install 'dist_dl[samples]'" in str(info.value)


def test_missing_deltalake_names_the_delta_extra(monkeypatch, tmp_path):
    from dist_dl.read import resolve_files

    (tmp_path / "table" / "_delta_log").mkdir(parents=True)
    _missing(monkeypatch, "deltalake")
    with pytest.raises(ImportError, match=r"reading a Delta table needs deltalake.*"
                                          r"pip install 'dist_dl\[delta\]'"):
        resolve_files(str(tmp_path / "table"))


def test_missing_optuna_says_it_is_a_requirement_of_dist_dl(monkeypatch):
    from dist_dl.search import search

    _missing(monkeypatch, "optuna")
    with pytest.raises(ImportError, match=r"dist_dl.search needs optuna.*pip install "
                                          r"'optuna>=3.4' \(a requirement of dist_dl"):
        search(lambda params, reporter: 0.0, {"x": [1, 2]}, max_trials=2, max_concurrent=1)


def test_every_extra_named_here_is_declared_in_setup_py():
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    for requirement, extra in PACKAGES.values():
        where = f'"{extra}": [' if extra else "install_requires=["
        start = setup.index(where)
        assert f'"{requirement}"' in setup[start:setup.index("]", start)], (requirement, extra)
    assert require("optuna", "a test").__name__ == "optuna"  # present: returned as is
