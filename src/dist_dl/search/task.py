"""What runs inside a Spark task: one trial, and the reporter it talks back with.

A trial calls ``reporter.report(value)`` as it trains; each report goes to the
driver over one short TCP connection (JSON, no pickle) and the driver answers
whether to stop. A stopped trial raises ``TrialPruned`` out of ``report``; the
trial runner records it.

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

import json
import math
import secrets
import socket
import time
import traceback
from typing import Callable

from dist_dl.core import compat
from dist_dl.core.integrity import sign, signature_matches
from dist_dl.core.pyworker import prepare_python_worker
from dist_dl.core.redact import redact_secrets

__all__ = ["Reporter", "TrialPruned", "run_trial", "sign_report", "REPORT_FIELDS"]

# The fields of a report that its HMAC covers (and the only ones read).
REPORT_FIELDS = ("trial", "step", "value", "nonce")


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
                 timeout: float = 60.0):
        self._address = None if address is None else tuple(address)
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


def run_trial(_, *, train_fn: Callable, params: dict, trial: int, address, token: str):
    """The body of a trial's Spark task: one JSON line with what happened.

    Never raises for the trial's own errors, so a failing trial is recorded as
    failed (and Spark does not retry it) while the other trials go on.
    """
    prepare_python_worker()
    reporter = Reporter(address, token, trial)
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
