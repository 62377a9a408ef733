"""The cases of tests/integration/test_integrity.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import stat

import cloudpickle
import pytest

import train_hooks
from dist_dl.core.integrity import KEY_ENV, checkpoint_key


cloudpickle.register_pickle_by_value(train_hooks)


def test_the_checkpoint_key_comes_from_the_environment_or_a_private_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(FileNotFoundError):
        checkpoint_key(create=False)
    key = checkpoint_key()
    path = tmp_path / ".config" / "dist_dl" / "checkpoint.key"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert checkpoint_key() == key  # a restarted driver finds it again
    monkeypatch.setenv(KEY_ENV, "a-secret-from-a-secret-scope")
    assert checkpoint_key() == b"a-secret-from-a-secret-scope"
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(ValueError, match=f"{KEY_ENV} is 5 characters"):
        checkpoint_key()
