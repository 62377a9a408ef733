"""Writes, in one process, the bytecode of the modules a run of the tests imports.

pip installs without compiling (the Makefile's INSTALL): an environment holds
tens of thousands of modules and a run imports a part. Each is compiled on its
first import; without this step, the first imports happen in several test
processes at once, each compiling the same modules. Run by `make install`
after the install, with the modules the tests' processes load::

    python -m tools.warm_bytecode torch tensorflow pyspark.sql mlflow ...

A module that does not import here (another profile's) is passed over and named.
"""
from __future__ import annotations

import importlib
import sys


def main(names: list[str]) -> int:
    if sys.flags.dont_write_bytecode:
        print("warm_bytecode: this Python writes no bytecode (PYTHONDONTWRITEBYTECODE or -B): "
              "nothing to do", file=sys.stderr)
        return 1
    before = len(sys.modules)
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # not this profile's (the install's own check is CHECK)
            missing.append(f"{name} ({exc})")
    print(f"bytecode of {len(sys.modules) - before} modules written or current"
          + (f"; not importable here: {'; '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
