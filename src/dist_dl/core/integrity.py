"""Files from shared storage are checked against digests before they are loaded.

Used on the driver, in Spark tasks and in Horovod workers; imports only the
standard library. A shared folder (``output_dir`` on DBFS, a volume, a network
mount) can be written by everyone who can write that storage, not only by the
run that put a file there. Two things the library loads from it could run
code or plant a model: ensemble members (pickles, unpickled by executors) and
training checkpoints (restored by every attempt and by a resumed run). So:

- ensemble members: the Spark task that writes a member returns its SHA-256
  with its path (through Spark's result, not the folder); the driver keeps
  the digests in memory and hands them to the tasks that read the members
  (in the task's closure). A file whose bytes do not match is never
  unpickled (`read_verified()`).
- checkpoints: the writer (Horovod rank 0) records each file's SHA-256 in a
  manifest and signs the manifest with an HMAC whose key is kept out of the
  shared folder (`checkpoint_key()`); readers refuse a manifest whose
  signature does not verify (see ``dist_dl.train.checkpoint``).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

__all__ = ["IntegrityError", "HashingWriter", "sha256_bytes", "sha256_file", "verify_file",
           "read_verified", "sign", "signature_matches", "key_id", "checkpoint_key", "KEY_ENV"]

# Where the checkpoint signing key comes from, first match wins: this
# environment variable (on Databricks, set from a secret scope with
# {{secrets/<scope>/<key>}} in the cluster's environment), else a key file in
# the driver user's home (created on first use, mode 0600).
KEY_ENV = "DIST_DL_CHECKPOINT_KEY"
_KEY_FILE = Path("~/.config/dist_dl/checkpoint.key")


class IntegrityError(ValueError):
    """A file does not match the digest the run that wrote it recorded."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class HashingWriter:
    """A binary file wrapper that hashes what is written through it."""

    def __init__(self, file):
        self._file = file
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self._hash.update(data)
        self.size += memoryview(data).nbytes
        return self._file.write(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _check(path, what: str, expected: str, found: str) -> None:
    if not hmac.compare_digest(found, str(expected)):
        raise IntegrityError(
            f"refusing to load {what} {os.fspath(path)}: its SHA-256 is {found}, but the run "
            f"that wrote it recorded {expected}; the file was replaced or damaged after it was "
            "written (shared storage is writable by others: check who wrote it)")


def verify_file(path: str | os.PathLike, expected: str, what: str = "file") -> None:
    """Raise `IntegrityError` (naming the file, the expected and the
    found digest) unless the SHA-256 of ``path`` is ``expected``."""
    _check(path, what, expected, sha256_file(path))


def read_verified(path: str | os.PathLike, expected: str, what: str = "file") -> bytes:
    """The bytes of ``path``, if their SHA-256 is ``expected``.

    The bytes returned are the ones checked (read once), so a file swapped
    between the check and the use cannot slip through.

    Raises:
        IntegrityError: naming the file, the expected and the found digest.
    """
    with open(path, "rb") as f:
        data = f.read()
    _check(path, what, expected, sha256_bytes(data))
    return data


def _canonical(payload: dict) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def sign(key: bytes, payload: dict) -> str:
    """HMAC-SHA256 (hex) of ``payload``'s canonical JSON."""
    return hmac.new(key, _canonical(payload), hashlib.sha256).hexdigest()


def signature_matches(key: bytes, payload: dict, signature: object) -> bool:
    return isinstance(signature, str) and hmac.compare_digest(sign(key, payload), signature)


def key_id(key: bytes) -> str:
    """A short public fingerprint of a key (never the key): which key signed
    what, in manifests, errors and MLflow tags."""
    return hashlib.sha256(b"dist_dl key id\0" + key).hexdigest()[:16]


def checkpoint_key(create: bool = True) -> bytes:
    """The key that signs checkpoint manifests, resolved on the driver.

    ``DIST_DL_CHECKPOINT_KEY`` if set (use a secret scope on Databricks, so
    a restarted driver on a new cluster resumes); otherwise a random key
    kept in ``~/.config/dist_dl/checkpoint.key`` on the driver (created now
    if ``create``), which a driver restarted on the same machine finds
    again. Either way the key is not in the shared folder; the driver passes
    it to the workers inside their task (never in a file they read).
    """
    value = os.environ.get(KEY_ENV)
    if value:
        if len(value) < 16:
            raise ValueError(f"{KEY_ENV} is {len(value)} characters; use a random value of at "
                             "least 16 (e.g. python -c 'import secrets; "
                             "print(secrets.token_hex(32))')")
        return value.encode()
    path = _KEY_FILE.expanduser()
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        if not create:
            raise
    except ValueError:
        raise ValueError(f"{path} does not hold a hex key; remove it (checkpoints signed with "
                         f"it will no longer verify) or set {KEY_ENV}") from None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_bytes(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    try:
        # Another driver may have created one meanwhile: keep the first.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return bytes.fromhex(path.read_text().strip())
