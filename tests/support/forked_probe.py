"""What a worker process sees of itself: ``python -m forked_probe OUT [CODE|sleep]``
writes it to OUT as JSON, one line to stdout and one to stderr, then exits
with CODE (or sleeps until killed). Run by the fork server's tests as a new
interpreter and as a forked worker, to compare the two."""
import json
import os
import sys
import time

import numpy as np


def main(out: str, then: str = "0") -> int:
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode().strip()
    state = {"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
             "cwd": os.getcwd(), "argv": sys.argv[1:], "main": sys.modules["__main__"].__spec__.name,
             "env": dict(os.environ), "stdin": os.readlink("/proc/self/fd/0"),
             "cmdline": cmdline, "numpy": int(np.random.randint(1 << 30))}
    with open(out + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(out + ".tmp", out)
    print(f"out {os.getpid()}", flush=True)
    print(f"err {os.getpid()}", file=sys.stderr, flush=True)
    if then == "sleep":
        time.sleep(600)
    return int(then)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
