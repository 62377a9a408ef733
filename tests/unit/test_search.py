"""The cases of tests/integration/test_search.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import pytest

from dist_dl.search import (estimate_trial_memory, trials_per_worker)


def test_trial_memory_estimate_and_trials_per_worker():
    # 25M parameters (ResNet-50 size), Adam, float32, batch 32, 10M
    # activation values per sample.
    mem = estimate_trial_memory(num_params=25_000_000, batch_size=32,
                                activations_per_sample=10_000_000, overhead_bytes=0)
    assert mem.weights == 100_000_000 and mem.gradients == 100_000_000
    assert mem.optimizer_state == 200_000_000
    assert mem.activations == 2 * 32 * 10_000_000 * 4
    inference = estimate_trial_memory(num_params=25_000_000, batch_size=32,
                                      activations_per_sample=10_000_000, backprop=False,
                                      overhead_bytes=0)
    assert inference.total < mem.total / 2
    mixed = estimate_trial_memory(num_params=25_000_000, batch_size=32,
                                  activations_per_sample=10_000_000, precision="mixed",
                                  overhead_bytes=0)
    assert mixed.activations == mem.activations // 2 and mixed.weights == mem.weights
    assert trials_per_worker(mem.total, 16 * 2**30) == int(16 * 2**30 * 0.9 // mem.total)
    assert trials_per_worker(mem.total, mem.total) == 0
    with pytest.raises(ValueError, match="precision='fp8'"):
        estimate_trial_memory(num_params=1, batch_size=1, activations_per_sample=1,
                              precision="fp8")


def _report_server(on_report, token):
    import threading

    from dist_dl.search.driver import _make_handler, _ReportServer

    server = _ReportServer(("127.0.0.1", 0), _make_handler(on_report, token))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _send(address, payload: bytes) -> dict:
    import json
    import socket

    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(payload)
        return json.loads(conn.makefile("rb").readline() or b"{}")


@pytest.mark.timeout(60)
def test_report_server_refuses_and_logs_a_missing_wrong_or_replayed_signature(caplog, scenario):
    """The search's report server: the token never travels (reports are
    signed with it), and a report without a signature, signed with another
    token, replayed, or not a report at all is refused and logged."""
    import json
    import logging
    import secrets

    from dist_dl.search.task import Reporter, TrialPruned, sign_report

    s = scenario("S14a local", "search report server: forged reports",
                 "reports sent to the search's report server without a signature, signed "
                 "with another token, replayed, altered, and not JSON at all",
                 "each is refused and logged (without the token); none reaches the search")
    token = secrets.token_hex(16)
    accepted = []

    def on_report(fields):
        accepted.append(fields)
        return fields["value"] > 5

    server = _report_server(on_report, token)
    address = server.server_address[:2]
    try:
        reporter = Reporter(address, token, trial=3)
        reporter.report(1.0)
        with pytest.raises(TrialPruned):
            reporter.report(9.0)
        assert [(f["trial"], f["step"], f["value"]) for f in accepted] == [(3, 0, 1.0),
                                                                           (3, 1, 9.0)]
        caplog.set_level(logging.WARNING, logger="dist_dl.search.driver")
        signed = {"trial": 3, "step": 2, "value": 2.0, "nonce": "n1"}
        signed["mac"] = sign_report(token, signed)
        assert "prune" in _send(address, json.dumps(signed).encode() + b"\n")
        cases = {
            "no signature": {"token": token, "trial": 3, "step": 2, "value": 2.0},
            "wrong signature": {**signed, "nonce": "n2",
                                "mac": sign_report("another-token", {**signed, "nonce": "n2"})},
            "replayed": signed,
            "altered": {**signed, "value": 1e9},
        }
        for name, message in cases.items():
            reply = _send(address, json.dumps(message).encode() + b"\n")
            assert reply["error"].startswith("refused"), name
        assert "refused" in _send(address, b"\x80garbage" * 100 + b"\n")["error"]
        with pytest.raises(RuntimeError, match="refused a report: refused: wrong signature"):
            Reporter(address, "wrong-token", trial=3).report(1.0)
        assert len(accepted) == 3  # none of the refused ones reached the search
        refusals = [r.getMessage() for r in caplog.records if "refused a message" in r.getMessage()]
        assert len(refusals) == 6
        for reason in ("no signature", "wrong signature", "replayed", "not a JSON line"):
            assert any(reason in m for m in refusals), reason
        assert not any(token in m for m in refusals)
        s.figure("6 forged messages refused and logged, 0 reached the search; the token in "
                 "no log line")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(60)
def test_the_token_is_not_sent_and_a_forged_answer_is_refused(scenario):
    """What a listener between an executor and the driver sees of a report,
    and what a forged server achieves: no token on the wire, and an
    unsigned 'stop this trial' answer raises instead of pruning."""
    import secrets
    import socketserver
    import threading

    from dist_dl.search.task import Reporter

    s = scenario("S14b local", "search report token on the wire",
                 "a trial's reporter talks to a forged server that records what arrives "
                 "and answers 'stop this trial' unsigned",
                 "the token is not in what the server receives (reports are signed with "
                 "it, an HMAC); the unsigned answer is refused with an error")
    seen = []

    class Forger(socketserver.StreamRequestHandler):
        def handle(self):
            seen.append(self.rfile.readline())
            self.wfile.write(b'{"prune": true}\n')

    token = secrets.token_hex(16)
    with socketserver.TCPServer(("127.0.0.1", 0), Forger) as forger:
        threading.Thread(target=forger.serve_forever, daemon=True).start()
        try:
            with pytest.raises(RuntimeError, match="not signed with the search's token"):
                Reporter(forger.server_address[:2], token, trial=1).report(0.5)
        finally:
            forger.shutdown()
    assert len(seen) == 1 and b'"mac"' in seen[0] and token.encode() not in seen[0]
    s.figure("the token absent from the bytes sent; the forged answer refused")


@pytest.mark.timeout(120)
def test_a_reporter_logs_to_the_trials_run_and_stops_at_its_prune_tag(tmp_path):
    """A Connect session's trial with a stopping rule: each report is a metric
    of its MLflow run, and the run's prune tag (the driver's) stops it."""
    import socket
    import time

    from mlflow.tracking import MlflowClient

    from dist_dl.search.task import PRUNE_TAG, Reporter, TrialPruned

    store = (tmp_path / "mlruns").as_uri()
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    reporter = Reporter(None, "", trial=2, tracking=(store, run_id, "objective"))
    reporter.report(3.0)
    reporter.report(2.0)
    client.set_tag(run_id, PRUNE_TAG, "true")
    with pytest.raises(TrialPruned, match="trial 2 stopped early at step 2"):
        reporter.report(1.0)
    history = client.get_metric_history(run_id, "objective")
    assert [(m.step, m.value) for m in history] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert reporter.kept == [(0, 3.0), (1, 2.0), (2, 1.0)] and reporter.steps == 3

    # A store the executors cannot reach fails the report, naming it (without
    # its credentials), within MLflow's bounded retries.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    uri = f"http://user:pw@127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"^the executors cannot reach the tracking store "
                       rf"http://127\.0\.0\.1:{port} .*or early_stopping=None$"):
        Reporter(None, "", trial=0, tracking=(uri, run_id, "objective")).report(1.0)
    assert time.monotonic() - started < 90


def test_a_loopback_tracking_server_is_refused_where_executors_run_elsewhere():
    from dist_dl.search.driver import _loopback_store

    assert _loopback_store("http://localhost:5000", "local[2]") is None
    assert _loopback_store("http://10.0.0.5:5000", "spark://host:7077") is None
    assert _loopback_store("databricks", "") is None
    for uri in ("http://localhost:5000", "https://u:p@127.0.0.1:5000/x", "http://[::1]:5000"):
        problem = _loopback_store(uri, "spark://host:7077")
        assert problem.startswith("the tracking server ") and "early_stopping=None" in problem
        assert "u:p" not in problem


def test_the_connect_poller_reads_each_trial_twice_a_second_and_four_reads_a_second_at_most():
    from dist_dl.search.driver import _READS_PER_SECOND, _read_gap
    for trials in (1, 2, 3, 8, 64):
        gap = _read_gap(trials)
        assert 1 / gap <= _READS_PER_SECOND  # reads a second, all trials together
        assert gap * trials >= 0.5 - 1e-9  # each trial is read every half second at most
    assert _read_gap(1) == _read_gap(0) == 0.5  # few trials: each read every half second
    assert _read_gap(64) * 64 == 16  # many: each trial less often
