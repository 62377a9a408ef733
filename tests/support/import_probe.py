"""Why a module the tests' `needs` markers name does not import here.

Importing TensorFlow, torch or Horovod to find out costs seconds of CPU, and
Horovod's import loads TensorFlow and its own library into the process that
tries: each is tried in a child process, and the modules every run needs are
probed once per run, interpreter and PYTHONPATH, shared by every test process
through a file (tests/conftest.py: the `needs` marker).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys


# The modules the tests' `needs` markers name, in the order one process imports
# them (torch before TensorFlow: dist_dl.launch.fork.client._FRAMEWORKS).
NEEDED_MODULES = ("torch", "tensorflow", "horovod.tensorflow", "horovod.spark", "petastorm")
# The folder where the first test process of an interpreter and path to need
# them writes why each of NEEDED_MODULES does not import (set by the run's
# first process): every other test process of the run with the same
# interpreter and PYTHONPATH reads it instead of importing them again.
IMPORTS_FOLDER_VAR = "DIST_DL_TEST_IMPORT_FAILURES"
_PROBE = """
import json, sys
failures = {}
for name in sys.argv[1:]:
    try:
        __import__(name)
        failures[name] = None
    except Exception as exc:
        failures[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(failures))
"""


def share_across_processes(config) -> None:
    """Set by a run's first process (xdist's controller, before its workers
    start): the folder where the probes are shared, removed when it ends."""
    if IMPORTS_FOLDER_VAR in os.environ:
        return
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="pytest-imports-")
    os.environ[IMPORTS_FOLDER_VAR] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def _probe(modules) -> dict | None:
    """Why each of ``modules`` does not import in this environment's Python
    (None where it does), tried in a child process, so that the test
    process imports nothing it would not have (Horovod's import loads
    TensorFlow and its own library); None where the child did not answer in
    time, or crashed importing several."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                              text=True, timeout=180,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    except subprocess.TimeoutExpired:
        return None
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    if len(modules) > 1:
        return None  # one of them crashed the child: each is tried alone
    lines = done.stderr.strip().splitlines()
    return {modules[0]: lines[-1] if lines else f"exit status {done.returncode}"}


@functools.lru_cache(maxsize=None)
def _needed_failures() -> dict | None:
    """`_probe` of NEEDED_MODULES, made once per run, interpreter and
    PYTHONPATH (under a lock on its file in IMPORTS_FOLDER_VAR's folder) and
    read by every test process."""
    import fcntl
    import hashlib

    folder = os.environ.get(IMPORTS_FOLDER_VAR)
    if not folder or not os.path.isdir(folder):
        return _probe(NEEDED_MODULES)
    which = hashlib.sha256(f"{sys.executable}\0{os.environ.get('PYTHONPATH', '')}".encode())
    path = os.path.join(folder, which.hexdigest()[:16] + ".json")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        failures = _probe(NEEDED_MODULES)
        if failures is not None:
            with open(path + ".part", "w") as f:
                json.dump(failures, f)
            os.replace(path + ".part", path)
        return failures


@functools.lru_cache(maxsize=None)
def failure(module: str) -> str | None:
    """Why ``module`` does not import in this environment's Python, or None.
    A module of NEEDED_MODULES is read from the run's one probe of them all;
    another, or where that probe did not answer (a crash), is tried alone."""
    failures = _needed_failures() if module in NEEDED_MODULES else None
    if failures is None:
        failures = _probe([module])
    if failures is None:
        return None  # slow (a loaded machine), not missing: the test runs and says more
    return failures[module]
