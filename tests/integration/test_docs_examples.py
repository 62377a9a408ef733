"""The runnable code blocks of the README and the docs, run for real.

Each document's runnable ``python`` blocks run in order as one script, in one
fresh Python process, in a temporary working folder (the README's examples
start a local[2] Spark, train on scikit-learn's digits for one epoch and
write their MLflow runs there). Its runnable ``bash`` blocks run in the
repository root. The convention is in tests/support/docblocks.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import docblocks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUNNABLE = [(doc, [b for b in docblocks.blocks(doc) if b.runs]) for doc in docblocks.documents()]
PYTHON = [(doc, [b for b in bs if b.language == "python"]) for doc, bs in RUNNABLE]
PYTHON = [(doc, bs) for doc, bs in PYTHON if bs]
BASH = [b for _, bs in RUNNABLE for b in bs if b.language == "bash"]


def _env() -> dict:
    env = dict(os.environ)
    src = str(docblocks.ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


# The README's examples run HorovodRunner: skipped, saying so, where Horovod
# does not import (runtimes 16.0 ML and later).
NEEDS = {"README.md": "horovod.tensorflow"}


@pytest.mark.parametrize("doc,blocks", [
    pytest.param(doc, blocks, marks=[pytest.mark.needs(NEEDS[doc.name])] if doc.name in NEEDS
                 else []) for doc, blocks in PYTHON],
    ids=[str(d.relative_to(docblocks.ROOT)) for d, _ in PYTHON])
def test_python_examples_run(doc, blocks, tmp_path):
    # Each block starts with a comment naming where it is, so a traceback's
    # line points into the script and the comment above it names the block.
    script = "".join(f"# {b.where}\n{b.code}\n" for b in blocks)
    path = tmp_path / "examples.py"
    path.write_text(script, encoding="utf-8")
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (f"the examples of {doc.name} failed (script {path}):\n"
                                  + done.stdout[-3000:] + done.stderr[-6000:])


@pytest.mark.parametrize("block", BASH or [pytest.param(None, marks=pytest.mark.skip(
    reason="no bash block of the README or the docs is runnable: each says why not"))],
    ids=lambda b: b.where if b else "none")
def test_bash_examples_run(block):
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=docblocks.ROOT,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
