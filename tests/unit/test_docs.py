"""The README and the documentation site: every code block is run or says
why not, every Python block parses, and the site builds in strict mode.

The convention is in tests/support/docblocks.py; the runnable blocks run in
tests/integration/test_docs_examples.py.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import browser  # noqa: E402
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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """`mkdocs build --strict` into a temporary folder, served over HTTP on
    127.0.0.1: (the site's folder, its base URL, seconds the build took).
    The site is built for the address it is served from (site_url), as a
    published site is."""
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings_handlers.python  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"the docs tools are not installed ({e}): pip install -e '.[docs]'")
    root = tmp_path_factory.mktemp("site") / "site"
    server, base = browser.serve(root)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(root)],
                          cwd=docblocks.ROOT, capture_output=True, text=True, timeout=90,
                          env=dict(os.environ, DIST_DL_SITE_URL=base))
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    yield root, base, seconds
    server.shutdown()


@pytest.mark.repository
def test_the_site_builds_in_strict_mode(site):
    """`mkdocs build --strict`: a broken link, a missing page or an API
    reference that does not resolve fails. mkdocstrings reads the sources
    statically (griffe), so this imports neither TensorFlow nor Spark."""
    root, _, seconds = site
    api = (root / "api" / "ensemble-search" / "index.html").read_text(encoding="utf-8")
    assert "one per random partition, in Spark tasks" in api, "the API reference has no docstrings"
    reliability = (root / "guides" / "reliability" / "index.html").read_text(encoding="utf-8")
    assert "<table>" in reliability, "the reliability table was not rendered from docs/reliability.json"
    benchmarks = (root / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "scaling_vs_peer" in benchmarks, "the benchmark table was not rendered from benchmarks/results.json"
    assert seconds < 60


@pytest.mark.repository
@pytest.mark.timeout(240)
def test_every_page_renders_in_a_browser(site, tmp_path):
    """Every page of the built site in one headless Chromium at 1280 px
    (tests/support/browser.py): no page wider than the window, no table wider
    than the text, every image loaded, no console error or failed request,
    nothing loaded from another host, no raw reST role, no broken link or
    anchor. Chromium missing is a failure that says how to install it."""
    root, base, _ = site
    found, opened = browser.check_site(root, base, tmp_path / "profile")
    assert opened >= 20, f"only {opened} pages in the built site"
    assert not found, "\n".join(f"{page}: {problem}" for page, problems in found.items()
                                for problem in problems)


DOCS = docblocks.ROOT / "docs"
JOB_STEMS = sorted({p.stem.rsplit("_", 1)[0] for p in (docblocks.ROOT / "jobs").glob("*.json")})


def test_the_jobs_tables_list_every_shipped_job():
    assert JOB_STEMS, "jobs/ holds no job file"
    site = (DOCS / "guides" / "jobs-cli.md").read_text(encoding="utf-8")
    readme = (docblocks.ROOT / "jobs" / "README.md").read_text(encoding="utf-8")
    missing = [s for s in JOB_STEMS if f"| `{s}_<cloud>.json` |" not in site]
    assert not missing, f"docs/guides/jobs-cli.md's table of jobs lacks {missing}"
    missing = [s for s in JOB_STEMS if f"`{s}_azure.json`, `{s}_aws.json`" not in readme]
    assert not missing, f"jobs/README.md's table of jobs lacks {missing}"


def test_the_limits_page_states_the_runtimes_the_job_validator_accepts():
    from dist_dl.app.databricks.jobs import clusters

    def version(release):
        return f"{release[0]}.{release[1]}"

    limits = (DOCS / "limits.md").read_text(encoding="utf-8")
    accepted = (f"Databricks Runtime ML {version(clusters._MIN_RUNTIME)} to "
                f"{version(clusters._MAX_RUNTIME)},")
    assert accepted in limits, f"docs/limits.md should say {accepted!r}"
    horovod = f"Horovod on {version(clusters._LAST_HOROVOD_RUNTIME)} LTS ML and older only"
    assert horovod in limits, f"docs/limits.md should say {horovod!r}"


def test_no_docstring_holds_a_restructuredtext_role():
    # mkdocstrings renders Markdown: a :class:`X` role shows as raw text on the API pages.
    role = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|ref):`")
    found = [f"{p.relative_to(docblocks.ROOT)}:{n}"
             for p in sorted((docblocks.ROOT / "src").rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if role.search(line)]
    assert not found, "reST roles (write `name` in backticks instead): " + ", ".join(found)


def _png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG file."""
    import struct

    data, found, at = path.read_bytes(), {}, 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt":
            key, _, value = data[at + 8:at + 8 + length].partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return found


def test_the_benchmark_plot_is_drawn_from_the_results_the_page_shows():
    """benchmarks/results.png (on the benchmarks page) names the results it
    was drawn from; a results.json changed without redrawing it fails here:
    redraw with dist_dl.app.bench.results.plot_results (the benchmarks do)."""
    import json

    from dist_dl.app.bench.results import PLOT_DIGEST_KEY, results_digest

    bench = docblocks.ROOT / "benchmarks"
    results = json.loads((bench / "results.json").read_text(encoding="utf-8"))
    assert _png_text(bench / "results.png").get(PLOT_DIGEST_KEY) == results_digest(results), (
        "benchmarks/results.png was not drawn from benchmarks/results.json: "
        "python -c \"import json; from dist_dl.app.bench.results import plot_results; "
        "plot_results(json.load(open('benchmarks/results.json')), 'benchmarks/results.png')\"")


@pytest.mark.repository
@pytest.mark.timeout(120)
def test_the_browser_check_finds_each_kind_of_problem(tmp_path):
    """The checker itself, on a page planted with one of each problem."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "other.html").write_text("<html><head><link rel='icon' href='data:,'></head>"
                                     "<body><h1 id='here'>other</h1></body></html>")
    (site / "index.html").write_text(
        "<html><head><script src='https://cdn.invalid/highlight.js'></script></head><body>"
        "<table><tr><td>" + "x" * 400 + "</td></tr></table>"
        "<img src='missing.png'>"
        "<p>see :class:`dist_dl.TrainedModel`</p>"
        "<a href='other.html#here'>fine</a> <a href='other.html#gone'>anchor</a> "
        "<a href='nowhere/'>page</a>"
        "<script>console.error('planted error')</script></body></html>")
    server, base = browser.serve(site)
    try:
        found, opened = browser.check_site(site, base, tmp_path / "profile")
    finally:
        server.shutdown()
    assert opened == 2 and list(found) == ["index.html"], found
    text = "\n".join(found["index.html"])
    for expected in ("the page is", "a table wider than the text", "image not loaded: missing.png",
                     "raw role: :class:`dist_dl.TrainedModel`", "console error: planted error",
                     "loads from another host: https://cdn.invalid/highlight.js",
                     f"link to a missing anchor: {base}other.html#gone",
                     f"broken link: {base}nowhere/"):
        assert expected in text, f"{expected!r} not reported:\n{text}"
