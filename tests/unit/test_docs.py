"""The README and the documentation site: every code block is run or says
why not, every Python block parses, and the site builds in strict mode.

The convention is in tests/support/docblocks.py; the runnable blocks run in
tests/integration/test_docs_examples.py.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import docblocks  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ALL_BLOCKS = [b for doc in docblocks.documents() for b in docblocks.blocks(doc)]


def test_the_documents_are_found_and_hold_code():
    names = {str(p.relative_to(docblocks.ROOT)) for p in docblocks.documents()}
    assert "README.md" in names and "docs/index.md" in names, names
    assert sum(b.runs and b.language == "python" for b in ALL_BLOCKS) >= 5, \
        "the README's examples of the entry points should run in a test"


def test_every_code_block_names_its_language():
    unnamed = [b.where for b in ALL_BLOCKS if not b.language]
    assert not unnamed, ("fenced blocks without a language (```python, ```bash, ```text, ...): "
                         + ", ".join(unnamed))


def test_every_block_not_run_says_why():
    silent = [b.where for b in ALL_BLOCKS if b.not_run is not None and not b.not_run.strip()]
    assert not silent, "<!-- not run: REASON --> needs a reason: " + ", ".join(silent)


def test_a_not_run_marker_is_on_a_runnable_block():
    # A marker before a text or yaml block is a mistake: it marks nothing.
    stray = [f"{b.where} ({b.language})" for b in ALL_BLOCKS
             if b.not_run is not None and b.language not in docblocks.RUNNABLE]
    assert not stray, "not-run markers before blocks that are not code to run: " + ", ".join(stray)


def test_the_readme_examples_of_every_entry_point_run():
    readme = "".join(b.code for b in docblocks.blocks(docblocks.ROOT / "README.md") if b.runs)
    for entry in ("train_distributed(", "HorovodRunner(", "TFDistributeRunner(",
                  "train_ensemble(", "score_dataframe(", ".transform("):
        assert entry in readme, f"the README's runnable examples do not call {entry}"


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "python"],
                         ids=lambda b: b.where)
def test_every_python_block_parses(block):
    try:
        ast.parse(block.code, filename=block.where)
    except SyntaxError as e:
        pytest.fail(f"{block.where}: line {e.lineno} of the block: {e.msg}")


def test_the_readme_is_a_front_door():
    lines = (docblocks.ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_site_builds_in_strict_mode(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing page or an API
    reference that does not resolve fails. mkdocstrings reads the sources
    statically (griffe), so this imports neither TensorFlow nor Spark."""
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings_handlers.python  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"the docs tools are not installed ({e}): pip install -e '.[docs]'")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=docblocks.ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "ensemble-search" / "index.html").read_text(encoding="utf-8")
    assert "one per random partition, in Spark tasks" in api, "the API reference has no docstrings"
    reliability = (tmp_path / "site" / "guides" / "reliability" / "index.html").read_text(encoding="utf-8")
    assert "<table>" in reliability, "the reliability table was not rendered from docs/reliability.json"
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "scaling_vs_peer" in benchmarks, "the benchmark table was not rendered from benchmarks/results.json"
    assert time.monotonic() - start < 60
