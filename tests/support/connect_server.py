"""A Spark Connect server on 127.0.0.1 in a process of its own, for the
tests of Connect sessions (tests/integration/test_connect.py,
tests/reliability/test_connect_client.py).

``python tests/support/connect_server.py PORT [KEY=VALUE ...]`` starts a
``local[2]`` Spark with Spark's Connect plugin listening on ``PORT`` (and the
given Spark settings), prints ``ready``, and serves until its stdin closes:
the test process holds the pipe, so the server ends with it, whatever way it
ends. In its own process, because a Connect client made in the test process
would otherwise share that process's JVM (``remote("local[2]")`` starts the
server inside it) with the classic session of the other test modules.

The client and the server may run different packages, as a Databricks
Connect client (a laptop's environment) and its cluster (the runtime's) do:
where pyspark's Connect client does not load with the profile's packages
(dbr-18-ml: pyspark 4.1.0's client code needs protobuf 6, the runtime ships
5.29), the client's own are in the environment's client overlay,
``<environment>/connect-client`` (the Makefile's CONNECT_CLIENT, pinned in
constraints/connect-client/<profile>.txt), which the client process has first
on its PYTHONPATH; the server, and the Python workers of its executors, start
without it (`server_env()`).

`skip_without_a_client()` skips a test module where no Connect session can be
made here; `serving()` starts the server for a test and stops it after.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The environment's Connect client overlay (where a profile has one).
CLIENT_OVERLAY = Path(sys.prefix) / "connect-client"


def _is_overlay(entry: str) -> bool:
    return bool(entry) and os.path.realpath(entry) == os.path.realpath(CLIENT_OVERLAY)


def overlay_in_use() -> bool:
    """Whether this process runs with the client overlay on its path."""
    return any(_is_overlay(entry) for entry in sys.path)


def server_env() -> dict[str, str]:
    """This process's environment without the client overlay on PYTHONPATH:
    what the server runs with, and the Python workers of its executors,
    which inherit it (PYSPARK_PYTHON: this environment's Python)."""
    env = dict(os.environ)
    kept = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e and not _is_overlay(e)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def skip_without_a_client() -> None:
    """Skip the calling test module (pytest's module-level skip) where this
    environment cannot make a Connect session with a barrier stage: torch,
    pyspark 3.5 or later, its Connect client's packages (the `connect`
    extra) and client code that loads with this protobuf."""
    import pytest

    pytest.importorskip("torch", reason="torch is not installed in this profile (the `torch` "
                                        "extra)")
    pyspark = pytest.importorskip("pyspark")
    if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (3, 5):
        pytest.skip("a barrier stage from a Connect session needs pyspark 3.5 "
                    "(mapInArrow(..., barrier=True)); this profile has " + pyspark.__version__,
                    allow_module_level=True)
    # pyspark's Connect client's own requirements (pyspark[connect]; the
    # `connect` extra of dist_dl), and its generated code, which needs the
    # protobuf it was generated with: profiles dbr-17.3-ml and dbr-19-ml
    # install them, dbr-18-ml has them in its client overlay.
    try:
        import grpc  # noqa: F401
        import grpc_status  # noqa: F401
        import pyspark.sql.connect.proto  # noqa: F401
    except Exception as exc:  # protobuf's VersionError: dbr-18-ml's protobuf 5 with pyspark 4.1
        overlays = sorted(p.stem for p in (REPO / "constraints" / "connect-client").glob("*.txt"))
        how = "; ".join(f"make test-connect PROFILE={p}" for p in overlays)
        pytest.skip(f"pyspark {pyspark.__version__}'s Connect client does not load here (its "
                    f"packages: the `connect` extra): {exc!r}. Where a profile's runtime has "
                    f"other versions, the Connect tests run with the profile's client overlay "
                    f"({CLIENT_OVERLAY}) on the client's PYTHONPATH: {how} (make test runs "
                    f"them so, in a pass of their own)", allow_module_level=True)


@contextlib.contextmanager
def serving(conf: dict[str, str] | None = None):
    """A server with the Spark settings ``conf``: yields (its process, its
    port); ends it when the block ends."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = [f"{k}={v}" for k, v in (conf or {}).items()]
    proc = subprocess.Popen([sys.executable, str(Path(__file__)), str(port), *settings],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, text=True,
                            env=server_env())
    try:
        line = proc.stdout.readline()  # "ready", or "" where it failed to start
        assert line.strip() == "ready", f"the Connect server did not start ({proc.poll()})"
        yield proc, port
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(port: int, settings: list[str]) -> None:
    from dist_dl.core.session import get_spark

    conf = {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
    }
    conf.update(setting.split("=", 1) for setting in settings)
    spark = get_spark("local[2]", app_name="dist_dl-connect-server", conf=conf)
    print("ready", flush=True)
    sys.stdin.read()  # until the test process closes the pipe (or ends)
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
