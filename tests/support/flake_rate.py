"""Each test's failures over repeated rounds (``make test-repeat N=5``).

Usage: ``python tests/support/flake_rate.py ROUND.xml [ROUND.xml ...]`` with
the JUnit reports of the rounds. Prints one line a test: failed/ran, and the
first line of each failure; exits 1 if any test failed in any round.
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def outcomes(paths: list[str]) -> dict[str, list[str]]:
    """Test id -> one entry a round it ran in: "pass", "skip" or "FAIL: ..."."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            test = f"{case.get('classname')}::{case.get('name')}"
            result = "pass"
            for child in case:
                if child.tag in ("failure", "error"):
                    message = (child.get("message") or child.text or "").strip()
                    result = "FAIL: " + (message.splitlines() or [""])[0][:200]
                elif child.tag == "skipped":
                    result = "skip"
            found[test].append(result)
    return found


def main(paths: list[str]) -> int:
    if not paths:
        raise SystemExit("usage: python tests/support/flake_rate.py ROUND.xml [ROUND.xml ...]")
    found = outcomes(paths)
    any_failed = False
    print(f"{len(paths)} rounds")
    for test, results in sorted(found.items()):
        ran = [r for r in results if r != "skip"]
        failed = [r for r in ran if r.startswith("FAIL")]
        any_failed |= bool(failed)
        print(f"{len(failed)}/{len(ran)} failed  {test}")
        for r in failed:
            print(f"    {r}")
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
