"""Parallel hyperparameter trials on local[2] Spark, logged to a temporary MLflow store."""
from __future__ import annotations

import pytest

from dist_dl.search import (Choice, IntRange, LogUniform, Uniform, estimate_trial_memory,
                            search, trials_per_worker)


def _max_overlap(intervals) -> int:
    """Most intervals open at one instant (an end before a start at a tie)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def _toy_objective():
    # Built inside a function so that Spark's cloudpickle ships it by value
    # (the tests folder is not importable in the Python workers).
    def train(params, reporter):
        import time

        x = params["x"]
        if x == 0:
            raise ValueError("deliberate failure for x=0")
        final = (x - 3) ** 2
        for epoch in range(1, 6):
            time.sleep(0.4)
            # Improves each epoch towards (x - 3)^2; far-off x stay far off.
            reporter.report(final + 10.0 / epoch, step=epoch)
        return final

    return train


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_grid_search_limits_concurrency_fails_and_stops_trials(spark, tmp_path):
    from mlflow.tracking import MlflowClient

    # Grid order is the listed order: x=3 (the optimum) and the ordinary ones
    # finish first, the hopeless x=40 and x=100 come last, when the median
    # rule has finished trials to compare them with.
    space = {"x": [1, 3, 5, 0, 2, 4, 40, 100]}
    result = search(_toy_objective(), space, max_trials=8, max_concurrent=2, algorithm="grid",
                    early_stopping="median", early_stopping_startup_trials=3, spark=spark,
                    tracking_uri=tmp_path.as_uri())

    trials = {t.params["x"]: t for t in result.trials}
    assert len(trials) == 8
    assert result.best_params == {"x": 3} and result.best_value == 0

    # At most two at a time, from the times measured inside the tasks, and
    # really two at a time (the cluster has two slots).
    timed = [(t.start, t.end) for t in result.trials if t.start is not None]
    assert len(timed) == 8
    assert _max_overlap(timed) == 2

    failed = trials[0]
    assert failed.status == "failed" and "deliberate failure" in failed.error
    for x in (40, 100):
        assert trials[x].status == "pruned", trials[x]
        assert trials[x].steps < 5
    assert {trials[x].status for x in (1, 3, 5, 2, 4)} == {"completed"}

    client = MlflowClient(tracking_uri=tmp_path.as_uri())
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["dist_dl.best_run_id"] == result.best_run_id
    for t in result.trials:
        run = client.get_run(t.run_id)
        assert run.data.tags["mlflow.parentRunId"] == result.parent_run_id
        assert run.info.status == {"completed": "FINISHED", "pruned": "KILLED",
                                   "failed": "FAILED"}[t.status]
    # Intermediate reports were logged as the trial's metric history.
    history = client.get_metric_history(trials[3].run_id, "objective")
    assert [m.step for m in history if m.step > 0][:5] == [1, 2, 3, 4, 5]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_adaptive_search_finds_the_optimum_region(spark, tmp_path):
    def train(params, reporter):
        return (params["lr"] - 0.01) ** 2 * 1e4 + (params["layers"] - 3) ** 2

    result = search(train, {"lr": LogUniform(1e-4, 1.0), "layers": IntRange(1, 6)},
                    max_trials=16, max_concurrent=2, algorithm="tpe", early_stopping=None,
                    seed=1, spark=spark, tracking_uri=tmp_path.as_uri())
    assert len(result.trials) == 16
    assert all(t.status == "completed" for t in result.trials)
    # Random search's expected best of 16 here is far worse than 1; TPE
    # concentrates around lr=0.01, layers=3.
    assert result.best_value < 1.0, result.best_params


def test_arguments_are_checked_before_any_trial(spark):
    def train(params, reporter):
        return 0.0

    with pytest.raises(ValueError, match="algorithm='bayes'"):
        search(train, {"x": [1, 2]}, max_trials=2, max_concurrent=1, algorithm="bayes",
               spark=spark)
    with pytest.raises(ValueError, match="grid search needs Choice or IntRange"):
        search(train, {"x": Uniform(0, 1)}, max_trials=2, max_concurrent=1, algorithm="grid",
               spark=spark)
    with pytest.raises(ValueError, match="max_concurrent=0"):
        search(train, {"x": Choice((1,))}, max_trials=2, max_concurrent=0, spark=spark)


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
