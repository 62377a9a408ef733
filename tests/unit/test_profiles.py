"""Each runtime profile (constraints/<profile>.txt) pins what its Databricks
runtime ships (constraints/runtimes.json): a pin of another version, a pin of
a package the runtime does not have, a runtime package left unpinned or
another Python each fail here unless the profile says why, in one of these
forms (docs/guides/profiles.md):

    torch==2.9.0  # differs: <why>            on the pin's own line
    # not pinned: <package>: <why>            a runtime package the profile leaves out
    # python: 3.12                            the profile's Python (the Makefile reads it)

A build label (+cu129: the runtime's CUDA build) is no difference of version:
the profiles install what PyPI has of that version.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)(?:\s+#\s*(.*))?$")
NOT_PINNED = re.compile(r"^#\s*not pinned:\s*([A-Za-z0-9_.-]+):\s*(\S.*)$")
PYTHON = re.compile(r"^#\s*python:\s*(\d+\.\d+)(?:\s+differs:\s*(\S.*))?$")
DIFFERS = re.compile(r"^differs:\s*\S")


def _name(package: str) -> str:
    return re.sub(r"[-_.]+", "-", package).lower()


def _base(version: str) -> str:
    return version.split("+")[0]


def _runtimes() -> dict:
    return json.loads((CONSTRAINTS / "runtimes.json").read_text())


def _profiles() -> list[str]:
    return sorted(p.stem for p in CONSTRAINTS.glob("*.txt"))


def _read(profile: str) -> tuple[dict, dict, tuple]:
    """The profile's pins (name -> (version, declared difference or None)), its
    `not pinned` declarations (name -> why) and its Python (version, why)."""
    pins, not_pinned, python = {}, {}, (None, None)
    for line in (CONSTRAINTS / f"{profile}.txt").read_text().splitlines():
        line = line.strip()
        if (m := PIN.match(line)):
            comment = m.group(3) or ""
            pins[_name(m.group(1))] = (m.group(2), comment if DIFFERS.match(comment) else None)
        elif (m := NOT_PINNED.match(line)):
            not_pinned[_name(m.group(1))] = m.group(2)
        elif (m := PYTHON.match(line)):
            python = (m.group(1), m.group(2))
    return pins, not_pinned, python


def test_the_data_file_and_the_profiles_name_the_same_runtimes():
    data = _runtimes()
    runtimes, profiles = data.get("runtimes") or {}, _profiles()
    assert profiles, f"no profile: {CONSTRAINTS}/*.txt is empty"
    assert runtimes, "constraints/runtimes.json names no runtime"
    assert data.get("sources"), "constraints/runtimes.json names no source for its versions"
    for name, runtime in runtimes.items():
        assert runtime.get("packages") and runtime.get("python"), (
            f"constraints/runtimes.json: {name} has no packages or no python")
    assert set(profiles) == set(runtimes), (
        f"profiles without a runtime in constraints/runtimes.json: {sorted(set(profiles) - set(runtimes))}; "
        f"runtimes without a profile: {sorted(set(runtimes) - set(profiles))}")


def test_each_pin_is_the_runtimes_version_or_says_why_it_differs():
    data = _runtimes()
    aliases = {_name(k): _name(v) for k, v in data.get("aliases", {}).items()}
    wrong, checked = [], 0
    for profile in _profiles():
        runtime = data["runtimes"].get(profile, {})
        shipped = {_name(k): v for k, v in runtime.get("packages", {}).items()}
        absent = {_name(k) for k in runtime.get("not_shipped", [])}
        pins, _, _ = _read(profile)
        for name, (version, why) in pins.items():
            published = aliases.get(name, name)
            if published in shipped:
                checked += 1
                if _base(version) != _base(shipped[published]) and why is None:
                    wrong.append(f"{profile}: {name}=={version}, the runtime has {shipped[published]}")
            elif published in absent and why is None:
                wrong.append(f"{profile}: {name}=={version}, which the runtime does not ship")
    assert checked, "no profile pins any runtime package: the check compared nothing"
    assert not wrong, ("pins that differ from the runtime (constraints/runtimes.json) without "
                       "`# differs: <why>` on the pin's line:\n  " + "\n  ".join(wrong))


def test_each_runtime_package_is_pinned_or_says_why_not():
    data = _runtimes()
    aliases = {_name(k): _name(v) for k, v in data.get("aliases", {}).items()}
    missing = []
    for profile in _profiles():
        pins, not_pinned, _ = _read(profile)
        covered = {aliases.get(n, n) for n in pins} | set(not_pinned)
        for name in data["runtimes"].get(profile, {}).get("packages", {}):
            if _name(name) not in covered:
                missing.append(f"{profile}: {name}")
    assert not missing, ("runtime packages a profile neither pins nor declares "
                         "`# not pinned: <package>: <why>`:\n  " + "\n  ".join(missing))


def test_each_profile_runs_the_runtimes_python_or_says_why():
    wrong = []
    for profile in _profiles():
        version, why = _read(profile)[2]
        wanted = _runtimes()["runtimes"].get(profile, {}).get("python")
        if version is None:
            wrong.append(f"{profile}: no `# python: X.Y` line (the Makefile reads it)")
        elif version != wanted and why is None:
            wrong.append(f"{profile}: python {version}, the runtime has {wanted}")
    assert not wrong, "\n".join(wrong)


def test_each_connect_client_overlay_is_a_profiles_and_says_why_of_each_pin():
    """constraints/connect-client/<profile>.txt: the packages a profile's
    Spark Connect client has over its environment (the Makefile's
    CONNECT_CLIENT), each pin with its reason on its line."""
    wrong = []
    for overlay in sorted((CONSTRAINTS / "connect-client").glob("*.txt")):
        if overlay.stem not in _profiles():
            wrong.append(f"{overlay.name}: no profile {overlay.stem}")
        pins = [PIN.match(line.strip()) for line in overlay.read_text().splitlines()]
        wrong += [f"{overlay.name}: {m.group(1)}=={m.group(2)} says no reason on its line"
                  for m in pins if m and not m.group(3)]
    assert not wrong, "\n".join(wrong)


def test_the_parser_finds_a_difference_and_its_declaration():
    """The patterns above, on lines written as the profiles write them."""
    assert PIN.match("torch==2.9.0  # differs: a reason").group(3) == "differs: a reason"
    assert DIFFERS.match(PIN.match("torch==2.9.0  # differs: a reason").group(3))
    assert not DIFFERS.match(PIN.match("torch==2.9.0  # the runtime's").group(3))
    assert PIN.match("tf-keras==2.20.1").group(3) is None
    assert NOT_PINNED.match("# not pinned: mosaicml-streaming: why").group(1) == "mosaicml-streaming"
    assert PYTHON.match("# python: 3.12").groups() == ("3.12", None)


def test_a_profile_that_is_none_fails_before_installing_and_lists_the_profiles():
    done = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", "-n", "install",
                           "PROFILE=dbr-0-ml"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "PROFILE=dbr-0-ml is not a profile" in done.stderr, done.stderr
    for profile in _profiles():
        assert profile in done.stderr, done.stderr
    assert not (ROOT / ".venv-dbr-0-ml").exists()
