"""The ``dist-dl`` command: the console script's entry point and
``python -m dist_dl.cli``. The commands are in `dist_dl.app.cli`."""
import sys

from dist_dl.app.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
