"""The driver's connections to a host that drops off the network end within
the launcher's bound (dist_dl.launch.horovod.spark.DEAD_PEER_SECONDS), in the two
cases TCP keepalive does not cover: a connect() to the silent host, and a
connection with data sent and never acknowledged. Horovod's driver makes such
connections to its task services (a new one per request), so an unbounded one
holds a job whose host was cut off past its timeout."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.hosts]

_PROBE = '''
import json, socket, sys, threading, time
from dist_dl.launch.horovod.spark import DEAD_PEER_SECONDS, _KeepAliveSockets

address, port = sys.argv[1], int(sys.argv[2])
sockets = _KeepAliveSockets()
# Connected while the host answers; the test cuts it off once this is printed.
sent = sockets.socket(socket.AF_INET, socket.SOCK_STREAM)
sent.connect((address, port))
print("connected", flush=True)
sys.stdin.readline()
results = {"bound": DEAD_PEER_SECONDS}

def connect():
    start = time.time()
    try:
        sockets.socket(socket.AF_INET, socket.SOCK_STREAM).connect((address, port))
        results["connect"] = ["connected", time.time() - start]
    except OSError as exc:
        results["connect"] = [type(exc).__name__, time.time() - start]

def in_flight():
    start = time.time()
    try:
        sent.sendall(b"x" * 1000)
        sent.recv(1)
        results["in_flight"] = ["answered", time.time() - start]
    except OSError as exc:
        results["in_flight"] = [type(exc).__name__, time.time() - start]

threads = [threading.Thread(target=f) for f in (connect, in_flight)]
for t in threads:
    t.start()
for t in threads:
    t.join(120)
print(json.dumps(results), flush=True)
'''

# A listener that accepts and then never answers.
_LISTENER = ("import socket, time\n"
             "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             "s.bind(('0.0.0.0', 7099)); s.listen(8); print('listening', flush=True)\n"
             "conns = []\n"
             "while True:\n"
             "    c, _ = s.accept(); conns.append(c)\n")


@pytest.mark.timeout(300)
def test_a_connection_to_a_host_cut_off_ends_within_the_bound(hosts):
    import json

    worker = hosts.hosts["worker2"]
    listener = worker.popen([sys.executable, "-c", _LISTENER], env=hosts.env("worker2"),
                            log=hosts.logs / "dead-peers-listener.log")
    hosts.wait_for_port(worker, 7099, 60)
    driver = hosts.hosts["driver"]
    probe = subprocess.Popen([*driver._enter(), sys.executable, "-c", _PROBE, worker.address,
                              "7099"], env=hosts.env("driver"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    netns = worker.netns
    try:
        assert probe.stdout.readline().strip() == "connected", probe.stderr.read()
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True, timeout=30)
        cut = time.time()
        probe.stdin.write("go\n")
        probe.stdin.flush()
        out, err = probe.communicate(timeout=180)
    finally:
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True, timeout=30)
        if probe.poll() is None:
            probe.kill()
        listener.kill()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"the probe printed no result:\n{out}\n{err}"
    results = json.loads(lines[-1])
    bound = results["bound"]
    # Without the bound: about 127 s for the connect (SYN retries), about 15
    # minutes for the unacknowledged data (tcp_retries2).
    for case in ("connect", "in_flight"):
        outcome, seconds = results.get(case, ["still waiting after 120 s", 120.0])
        assert outcome in ("TimeoutError", "OSError", "ConnectionError"), (case, results)
        assert seconds < bound + 10, f"{case}: ended after {seconds:.0f} s, bound {bound} s"
    assert time.time() - cut < 180
