"""A Spark Connect server on 127.0.0.1 in a process of its own, for the
tests of Connect sessions (tests/integration/test_connect.py).

``python -m tests.support.connect_server PORT`` starts a ``local[2]`` Spark
with Spark's Connect plugin listening on ``PORT``, prints ``ready``, and
serves until its stdin closes: the test process holds the pipe, so the server
ends with it, whatever way it ends. In its own process, because a Connect
client made in the test process would otherwise share that process's JVM
(``remote("local[2]")`` starts the server inside it) with the classic
session of the other test modules.
"""
from __future__ import annotations

import sys


def main(port: int) -> None:
    from dist_dl.core.session import get_spark

    spark = get_spark("local[2]", app_name="dist_dl-connect-server", conf={
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
    })
    print("ready", flush=True)
    sys.stdin.read()  # until the test process closes the pipe (or ends)
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
