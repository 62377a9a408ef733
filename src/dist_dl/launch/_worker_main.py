"""Process entry of a local worker: ``python -m dist_dl.launch._worker_main PAYLOAD RESULT``.

A module of its own so that ``dist_dl.launch.worker`` is imported once, as
itself: ``log_to_driver`` in user code must see the capture ``run_worker`` set.
"""
import sys

from dist_dl.launch.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
