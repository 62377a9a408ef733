"""What runs inside a Spark task: one trial, and the reporter it talks back with.

A trial calls ``reporter.report(value)`` as it trains. From a classic session
each report goes to the driver over one short TCP connection (JSON, no
pickle) and the driver answers whether to stop. From a Spark Connect session
with a stopping rule (the executors may not reach the client) each report is
a metric of the trial's MLflow run, and the driver, which reads the runs'
metric histories, asks the trial to stop with the run's ``dist_dl.prune``
tag (`PRUNE_TAG`), which ``report`` reads after logging. A stopped trial
raises ``TrialPruned`` out of ``report``; the trial runner records it.

The connection is plain TCP, so the per-search token never goes over it:
each report carries a fresh nonce and an HMAC-SHA256 of its fields keyed
with the token, and the driver's answer an HMAC of the nonce and the answer
(see ``sign_report``). Someone who can watch the network between the
executors and the driver sees the reported values, but cannot send a report
the driver accepts, replay one, or forge an answer. The token itself reaches
the task inside the Spark task (its closure), which Spark encrypts only with
``spark.authenticate`` and ``spark.network.crypto.enabled`` set.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import socket
import time
import traceback
from typing import Callable

from dist_dl.core import compat
from dist_dl.core.integrity import sign, signature_matches
from dist_dl.core.pyworker import prepare_python_worker
from dist_dl.core.redact import redact_secrets, without_credentials

__all__ = ["Reporter", "TrialPruned", "run_trial", "sign_report", "REPORT_FIELDS", "PRUNE_TAG"]

# The fields of a report that its HMAC covers (and the only ones read).
REPORT_FIELDS = ("trial", "step", "value", "nonce")
# The tag of a trial's MLflow run with which the driver stops it (Connect sessions).
PRUNE_TAG = "dist_dl.prune"
# MLflow's HTTP retries for a report, unless MLFLOW_HTTP_REQUEST_* say otherwise:
# a store the executors cannot reach fails the trial within minutes.
_STORE_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def sign_report(token: str, fields: dict) -> str:
    """The HMAC of a report's ``REPORT_FIELDS`` (or of an answer's fields),
    keyed with the search's token."""
    return sign(token.encode(), fields)


class TrialPruned(Exception):
    """Raised by ``Reporter.report`` when the stopping rule ends this trial.

    Let it propagate out of the training function (clean up in ``finally``).
    """


class Reporter:
    """Passed to the training function: ``report(value, step=None)``.

    Attributes:
        trial: This trial's number.
        last_value: The last value reported, or None.
        steps: How many values were reported.
        kept: ``(step, value)`` of each report, where there is no driver to
            send them to while the trial runs (``address`` None: a Spark
            Connect session's trials); they go back with the outcome.
    """

    def __init__(self, address: tuple[str, int] | None, token: str, trial: int,
                 timeout: float = 60.0, tracking: tuple[str, str, str] | None = None):
        self._address = None if address is None else tuple(address)
        # (tracking URI, run id, metric name): reports go to the trial's
        # MLflow run, where the driver reads them (Connect, a stopping rule).
        self._tracking = tracking
        self.kept: list[tuple[int, float]] = []
        self._token = token
        self._timeout = timeout
        self.trial = trial
        self.last_value: float | None = None
        self.steps = 0

    def report(self, value: float, step: int | None = None) -> None:
        """Send an intermediate value (the searched metric) to the driver.

        Args:
            value: The metric so far, in the direction being optimised.
            step: Epoch or step number; default: one more than the last report.

        Raises:
            TrialPruned: the driver's stopping rule ended this trial.
        """
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"reported value {value!r} is not finite")
        step = self.steps if step is None else int(step)
        self.last_value = value
        self.steps += 1
        if self._address is None:
            self.kept.append((step, value))
            if self._tracking is not None and self._logged_and_pruned(step, value):
                raise TrialPruned(f"trial {self.trial} stopped early at step {step} "
                                  f"(value {value})")
            return
        message = {"trial": self.trial, "step": step, "value": value,
                   "nonce": secrets.token_hex(16)}
        message["mac"] = sign_report(self._token, message)
        with socket.create_connection(self._address, timeout=self._timeout) as conn:
            conn.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(conn.makefile("rb").readline() or b"{}")
        if "error" in reply:
            raise RuntimeError(f"the search driver refused a report: {reply['error']}")
        answer = {"nonce": message["nonce"], "prune": reply.get("prune")}
        if not signature_matches(self._token.encode(), answer, reply.get("mac")):
            raise RuntimeError(f"the answer to trial {self.trial}'s report from "
                               f"{self._address[0]}:{self._address[1]} is not signed with the "
                               "search's token: something other than the search driver answered")
        if reply.get("prune"):
            raise TrialPruned(f"trial {self.trial} stopped early at step {step} (value {value})")

    def _logged_and_pruned(self, step: int, value: float) -> bool:
        """Log the report to the trial's MLflow run; whether its prune tag is set.

        The driver sets the tag once it has read a report the stopping rule
        rejects, so a trial stops at a report after that one.
        """
        from mlflow.tracking import MlflowClient

        uri, run_id, metric = self._tracking
        try:
            with _bounded_http():
                client = MlflowClient(tracking_uri=uri)
                client.log_metric(run_id, metric, value, step=step)
                return client.get_run(run_id).data.tags.get(PRUNE_TAG) is not None
        except Exception as exc:  # noqa: BLE001 - said with what to do, the trial fails
            raise RuntimeError(
                f"the executors cannot reach the tracking store {without_credentials(uri)} (trial "
                f"{self.trial}'s report at step {step}: {type(exc).__name__}: {exc}). With early stopping on a Spark Connect session the trials log their "
                "reports there while they run: use a tracking store both the client and the "
                "executors reach (a tracking server, or on Databricks the workspace's), or "
                "early_stopping=None") from exc


@contextlib.contextmanager
def _bounded_http():
    """`_STORE_HTTP` in the environment for the block, where it is unset."""
    added = [k for k in _STORE_HTTP if k not in os.environ]
    os.environ.update({k: _STORE_HTTP[k] for k in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def run_trial(_, *, train_fn: Callable, params: dict, trial: int, address, token: str,
              tracking: tuple[str, str, str] | None = None):
    """The body of a trial's Spark task: one JSON line with what happened.

    Never raises for the trial's own errors, so a failing trial is recorded as
    failed (and Spark does not retry it) while the other trials go on.
    """
    prepare_python_worker()
    reporter = Reporter(address, token, trial, tracking=tracking)
    record = {"trial": trial, "status": "completed", "value": None, "error": None,
              "start": time.time()}
    try:
        compat.use_worker_env()  # before the trial's first tf.keras
        value = train_fn(dict(params), reporter)
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"train_fn returned {value!r}, not a finite number")
        record["value"] = value
    except TrialPruned:
        record.update(status="pruned", value=reporter.last_value)
    except Exception as exc:  # noqa: BLE001 - any failure of user code is the trial's
        # The error goes to MLflow (a tag, error.txt): redacted here with
        # this executor's secrets, and on the driver with its own.
        record.update(status="failed", error=redact_secrets(f"{type(exc).__name__}: {exc}"),
                      traceback=redact_secrets(traceback.format_exc()))
    record["end"] = time.time()
    record["steps"] = reporter.steps
    record["reports"] = reporter.kept
    yield json.dumps(record)
