"""The fenced code blocks of README.md and docs/, and how each is run.

Convention (the docs' own rule, checked by tests/unit/test_docs.py):

- Every fenced block names its language (```python, ```bash, ```text, ...).
- A ``python`` or ``bash`` block runs in a test, unless the line right before
  it is ``<!-- not run: REASON -->`` (a reason is required). The runnable
  ``python`` blocks of one file run in order, in one process, in
  tests/integration/test_docs_examples.py; the runnable ``bash`` blocks there
  too, one shell each, in the repository root.
- Blocks in other languages (``text``, ``yaml``, ``json``, ``console`` output)
  are not code to run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = ("python", "bash")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int              # 1-based line of the opening fence
    language: str          # "" when the fence names none
    code: str
    not_run: str | None    # the reason, when marked not run ("" if the marker gives none)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUNNABLE and self.not_run is None


def documents() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, language = m.group(1), m.group(2), m.group(3).lower()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        before = lines[start - 1] if start > 0 else ""
        marker = _NOT_RUN.match(before)
        out.append(Block(path, start + 1, language, "\n".join(body) + "\n",
                         marker.group(1) if marker else None))
    return out
