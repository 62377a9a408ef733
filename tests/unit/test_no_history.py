"""The product's text says what is, not what happened: no dates, no times in
UTC, no commit hashes in the README, the docs, the Makefile, .ci/run, the
library's sources (comments and docstrings included), the notebooks, the
configurations and jobs/README.md.

Dated measurements belong in benchmarks/RESULTS.md and
benchmarks/results.json, the story of a change in its commit message, an
upstream bug in a comment naming the upstream issue.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.repository]

ROOT = Path(__file__).resolve().parents[2]

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
PATTERNS = {
    "a date": re.compile(
        rf"\b\d{{1,2}} {_MONTH},? (?:19|20)\d\d\b"            # 26 Nov 2026
        rf"|\b{_MONTH} \d{{1,2}},? (?:19|20)\d\d\b"           # Nov 26, 2026
        rf"|\b{_MONTH} (?:19|20)\d\d\b"                       # Nov 2026
        r"|\b(?:19|20)\d\d-[01]\d-[0-3]\d\b"),                # 2026-11-26
    "a time in UTC": re.compile(r"\b\d{1,2}:\d\d(?::\d\d)?(?:\s*-\s*\d{1,2}:\d\d)?\s*(?:UTC|GMT|Z\b)"),
    # 7 to 40 hex digits with at least one digit and one letter, standing
    # alone: a commit hash. Longer runs (a SHA-256) and 0x constants do not match.
    "a commit hash": re.compile(r"(?<![\w.$/-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"),
}

# Files that are records of measured runs, dated on purpose (as
# benchmarks/RESULTS.md is): each with the reason.
ALLOWED_FILES: dict[str, str] = {
    "tests/unit/test_no_history.py": "the patterns' own examples of history",
}
# Lines that match a pattern without being history: (file, text on the line, reason).
_SAS_VERSION = ("sv=2022-11-02", "an Azure storage API version in a test's SAS token")
ALLOWED_LINES: list[tuple[str, str, str]] = [
    ("tests/integration/test_secrets.py", *_SAS_VERSION),
    ("tests/unit/test_jobs.py", *_SAS_VERSION),
    ("tests/unit/test_jobs.py", '"0123456789abcdef"', "a made-up token, not a commit"),
]


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / ".ci" / "run", ROOT / "jobs" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "src" / "dist_dl").rglob("*.py"))
    files += sorted(p for p in (ROOT / "notebooks").rglob("*") if p.is_file())
    files += sorted(p for p in (ROOT / "conf").rglob("*") if p.is_file() and p.suffix != ".pyc")
    # The code of the tests and benchmarks: their comments and docstrings too.
    files += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    return [p for p in files if p.exists() and "__pycache__" not in p.parts]


def findings(path: Path) -> list[str]:
    rel = str(path.relative_to(ROOT))
    if rel in ALLOWED_FILES:
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for what, pattern in PATTERNS.items():
            m = pattern.search(line)
            if m and not any(rel == f and text in line for f, text, _ in ALLOWED_LINES):
                out.append(f"{rel}:{number}: {what} ({m.group(0)!r}): {line.strip()[:120]}")
    return out


def test_the_scan_covers_the_product_and_catches_history():
    names = {str(p.relative_to(ROOT)) for p in scanned_files()}
    for expected in ("README.md", "Makefile", "src/dist_dl/__init__.py", "docs/index.md"):
        assert expected in names, f"{expected} is not scanned"
    assert any(n.startswith("notebooks/") for n in names) and any(n.startswith("conf/") for n in names)
    history = ["measured 26 Nov 2026 on 2 cores", "a clean clone on 2026-11-26", "since Nov 2026",
               "the run of 13:48-14:31 UTC", "fixed in bfc3f66", "CI at 3fbebc1 failed"]
    for text in history:
        assert any(p.search(text) for p in PATTERNS.values()), f"not caught: {text!r}"
    what_is = ["HMAC-SHA256 keyed with a token", "0x7fffffff", "float16 compute", "keras 3.11.2",
               "sha256 " + "a" * 64, "horovod==0.28.1", "an aware UTC datetime", "TF_CONFIG",
               "2**31-1 bytes", "1e-5 of 1 worker"]
    for text in what_is:
        assert not any(p.search(text) for p in PATTERNS.values()), f"false alarm: {text!r}"


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dates_times_or_commit_hashes(path):
    found = findings(path)
    assert not found, ("history in the product's text (say what is; dated measurements go to "
                       "benchmarks/RESULTS.md):\n" + "\n".join(found))
