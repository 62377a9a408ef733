"""Driver side of parallel hyperparameter trials.

``max_concurrent`` driver threads each run a loop: ask the sampler for a
configuration, run it as a Spark job of one task (its own job group), record
the outcome. So at most ``max_concurrent`` trials run at once, and an adaptive
sampler sees every finished trial before it proposes the next. From a
classic session, while a trial runs, its reports reach a small TCP server on
the driver, which applies the stopping rule and logs them to the trial's
MLflow child run. Sampling and stopping are Optuna's; only MLflow and Spark
are driven from here.

From a Spark Connect session the trials are one-task jobs of the DataFrame
API (`dist_dl.core.sessionkind.call_in_task`), each tagged, and a Connect
client may be out of the executors' reach (Databricks Connect runs it on a
laptop): no server on the driver. With a stopping rule the trials log their
reports to their MLflow child runs themselves, a thread here reads the
running trials' metric histories (each every `_POLL_SECONDS`, and at most
`_READS_PER_SECOND` reads a second in all) and applies the rule,
and a trial to stop gets the ``dist_dl.prune`` tag, which its next report
reads (so the tracking store must be one both reach). Without one, each
trial's reports come back with its outcome and are logged then. Either way
the reports that come back with the outcome reach the Optuna study, each
step once.
"""
from __future__ import annotations

import json
import logging
import secrets
import socketserver
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from dist_dl.core.imports import spark_ml_imported
from dist_dl.core.integrity import signature_matches as _signature_matches
from dist_dl.core.optional import require
from dist_dl.core.redact import redact_secrets, without_credentials
from dist_dl.core.settings import checked, setting
from dist_dl.core.sessionkind import (call_in_task, configured_slots, is_connect, session_jobs,
                                      session_master)
from dist_dl.core.sparkconf import conf_value
from dist_dl.core.storage import check_shared
from dist_dl.search import space as _space
from dist_dl.search import task as _task
from dist_dl.tracking.target import absolute_tracking_uri, store_folder
from dist_dl.tracking.target import experiment_id as _experiment_id

__all__ = ["search", "SearchResult", "TrialRecord", "SearchError", "ALGORITHMS",
           "EARLY_STOPPING"]

ALGORITHMS = ("random", "grid", "tpe")
EARLY_STOPPING = ("median", "hyperband", None)
_MAX_TAG = 5000  # MLflow tag values are limited; keep errors well inside it.
_POLL_SECONDS = 0.5  # Connect with a stopping rule: how often a trial's reports are read
# ... but never more reads than this a second, however many trials run: a
# workspace's MLflow API takes about 127 requests a second in all for this
# group of requests (Databricks' MLflow API rate limits), shared with every
# report its trials log, so with many trials each is read less often.
_READS_PER_SECOND = 4
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialRecord:
    """One trial's outcome.

    ``status`` is ``completed``, ``pruned`` (stopped early) or ``failed``;
    ``start`` and ``end`` are wall-clock seconds measured inside the task.
    """

    number: int
    params: dict
    status: str
    value: float | None
    steps: int
    start: float | None
    end: float | None
    run_id: str
    error: str | None = None


@dataclass(frozen=True)
class SearchResult:
    """The best completed trial, the parent MLflow run, and every trial."""

    best_params: dict
    best_value: float
    best_run_id: str
    parent_run_id: str
    trials: tuple = field(repr=False)


class SearchError(RuntimeError):
    """No trial completed; ``trials`` holds what happened to each."""

    def __init__(self, message: str, trials):
        super().__init__(message)
        self.trials = trials


@dataclass(frozen=True)
@checked()
class _Spec:
    """The validated arguments of one ``search`` call."""

    max_trials: int = setting(low=1)
    max_concurrent: int = setting(low=1)
    algorithm: str = setting(choices=ALGORITHMS)
    mode: str = setting(choices=("min", "max"))
    early_stopping: str | None = setting(choices=EARLY_STOPPING)
    early_stopping_startup_trials: int = setting(low=0)
    early_stopping_warmup_steps: int = setting(low=0)


def _read_gap(trials: int) -> float:
    """Seconds between two reads of the running trials' reports when
    ``trials`` run: each trial read every `_POLL_SECONDS`, and no more than
    `_READS_PER_SECOND` reads a second in all."""
    return max(_POLL_SECONDS / max(trials, 1), 1 / _READS_PER_SECOND)


def _sampler(algorithm: str, seed: int | None):
    import optuna

    if algorithm == "tpe":
        # Independent TPE: each trial asks with the full space, and the
        # constant-liar option keeps concurrent asks from proposing the same
        # point while earlier trials are still running.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    # Grid points are enqueued in order; random sampling fills nothing then.
    return optuna.samplers.RandomSampler(seed=seed)


def _pruner(spec: _Spec):
    import optuna

    if spec.early_stopping == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.early_stopping_startup_trials,
                                           n_warmup_steps=spec.early_stopping_warmup_steps)
    if spec.early_stopping == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


class _ReportServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Refused(Exception):
    """A report that is not from this search's trials (logged, answered)."""


def _make_handler(on_report: Callable[[dict], bool], token: str):
    seen: set[str] = set()  # nonces of accepted reports: a replay is refused
    lock = threading.Lock()

    def check(message) -> dict:
        if not isinstance(message, dict) or "mac" not in message:
            raise _Refused("no signature (mac): not a report of this search's trials")
        fields = {k: message.get(k) for k in _task.REPORT_FIELDS}
        if not _signature_matches(token.encode(), fields, message["mac"]):
            raise _Refused("wrong signature: not signed with this search's token")
        with lock:
            if fields["nonce"] in seen:
                raise _Refused("a replayed report (its nonce was used before)")
            seen.add(fields["nonce"])
        return fields

    class Handler(socketserver.StreamRequestHandler):
        timeout = 30

        def handle(self):
            peer = "%s:%s" % self.client_address[:2]
            try:
                line = self.rfile.readline(64 * 1024)
                try:
                    message = json.loads(line)
                except ValueError:
                    raise _Refused(f"not a JSON line ({len(line)} bytes)") from None
                fields = check(message)
                prune = bool(on_report(fields))
                reply = {"prune": prune, "mac": _task.sign_report(
                    token, {"nonce": fields["nonce"], "prune": prune})}
            except _Refused as exc:
                # Logged on the driver, so that a probe or a misconfigured
                # client shows up; the reply says no more than the log.
                _log.warning("search report server: refused a message from %s: %s", peer, exc)
                reply = {"error": f"refused: {exc}"}
            except Exception as exc:  # noqa: BLE001 - reply instead of dropping the task
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                self.wfile.write(json.dumps(reply).encode() + b"\n")
            except OSError:  # the client went away
                pass

    return Handler


def search(train_fn: Callable[[dict, Any], float], space: Mapping[str, Any], *, max_trials: int,
           max_concurrent: int, algorithm: str = "random", mode: str = "min",
           early_stopping: str | None = "median", early_stopping_startup_trials: int = 3,
           early_stopping_warmup_steps: int = 0, seed: int | None = 0, spark=None,
           tracking_uri: str | None = None, experiment_name: str | None = None,
           run_name: str = "search", metric_name: str = "objective") -> SearchResult:
    """Run up to ``max_trials`` trials of ``train_fn``, ``max_concurrent`` at a time.

    Args:
        train_fn: ``train_fn(params, reporter) -> float``, run in a Spark task
            per trial. Returns the final value of the metric; may call
            ``reporter.report(value)`` each epoch so that hopeless trials stop
            early (``report`` then raises ``TrialPruned``). Must be picklable.
        space: Name -> ``Uniform``, ``LogUniform``, ``IntRange``, ``Choice`` or
            a list of options.
        max_trials: Trials to run (grid search runs at most the grid's size).
        max_concurrent: Trials running at once (cloud services call it
            ``max_concurrent_runs``); each takes one Spark task slot.
        algorithm: ``"random"``, ``"grid"`` (every combination, in order), or
            ``"tpe"`` (Optuna's adaptive Tree-structured Parzen Estimator).
        mode: ``"min"`` or ``"max"`` the metric.
        early_stopping: ``"median"`` (stop a trial whose report is worse than
            the median of finished trials at that step), ``"hyperband"``
            (Optuna's bandit rule), or None. On a Spark Connect session the
            trials log their reports to the tracking store, where the driver
            reads them (each trial every 0.5 s, at most 4 reads a second)
            and from where a stopped trial learns it at its next report: the
            store must be one the client and the executors both reach.
        early_stopping_startup_trials: Finished trials before the median rule acts.
        early_stopping_warmup_steps: Steps of each trial before it may be stopped.
        seed: Seed of the sampler.
        spark: SparkSession; default ``dist_dl.core.session.get_spark()``.
        tracking_uri: MLflow tracking URI; default the current one.
        experiment_name: MLflow experiment; default "Default".
        run_name: Name of the parent MLflow run.
        metric_name: Name of the metric in MLflow.

    Returns:
        ``SearchResult`` with the best completed trial and every trial.

    Raises:
        ValueError: bad arguments (before any trial starts), among them, with
            ``early_stopping`` on a Spark Connect session, a tracking store
            the executors do not share (`dist_dl.core.storage.NotShared`
            for a folder store, a loopback tracking server on a cluster).
        SearchError: no trial completed.
    """
    import mlflow

    optuna = require("optuna", "dist_dl.search")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient
    from pyspark import InheritableThread

    from dist_dl.core.session import get_spark, task_slots

    if not callable(train_fn):
        raise ValueError("train_fn must be a function train_fn(params, reporter) -> float")
    spec = _Spec(max_trials=max_trials, max_concurrent=max_concurrent, algorithm=algorithm,
                 mode=mode, early_stopping=early_stopping,
                 early_stopping_startup_trials=early_stopping_startup_trials,
                 early_stopping_warmup_steps=early_stopping_warmup_steps)
    space = _space.normalize_space(space)
    distributions = _space.to_optuna(space)
    grid = _space.grid_points(space) if algorithm == "grid" else None
    if grid is not None and len(grid) < max_trials:
        warnings.warn(f"grid search: the grid has {len(grid)} points, so {len(grid)} trials run "
                      f"instead of max_trials={max_trials}", stacklevel=2)
        max_trials = len(grid)

    spark = spark or get_spark()
    # A relative store would be another one in the tasks' working directories.
    uri = absolute_tracking_uri(tracking_uri or mlflow.get_tracking_uri())
    connect = is_connect(spark)
    # A stopping rule acts on reports while trials run. A Connect client may be
    # out of the executors' reach (Databricks Connect runs it on a laptop): the
    # reports go through the tracking store, which both must reach.
    polled = connect and spec.early_stopping is not None
    if polled:
        purpose = (f"search(early_stopping={spec.early_stopping!r}) on a Spark Connect "
                   "session (its trials log their reports to the MLflow tracking store)")
        problem = _loopback_store(uri, session_master(spark))
        if problem:
            raise ValueError(f"{purpose}: {problem}")
        check_shared(spark, {"MLflow tracking store": store_folder(uri)}, purpose=purpose)
    # A Connect client cannot ask the scheduler: what the configuration states, if anything.
    slots = configured_slots(spark) if connect else task_slots(spark)
    if slots is not None and max_concurrent > slots:
        warnings.warn(f"max_concurrent={max_concurrent} but the cluster has {slots} task slots "
                      "now; the extra trials wait for a slot", stacklevel=2)

    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize",
                                sampler=_sampler(algorithm, seed), pruner=_pruner(spec))
    for point in grid or ():
        study.enqueue_trial(point)

    spark_ml_imported()  # before any parameter is logged (core.imports)
    client = MlflowClient(tracking_uri=uri)
    experiment_id = _experiment_id(experiment_name, client)
    parent = client.create_run(experiment_id, run_name=run_name)
    parent_id = parent.info.run_id
    client.log_batch(parent_id, params=[
        Param("algorithm", algorithm), Param("max_trials", str(max_trials)),
        Param("max_concurrent", str(max_concurrent)), Param("mode", mode),
        Param("early_stopping", str(early_stopping)), Param("seed", str(seed))])

    lock = threading.Lock()
    running: dict[int, tuple] = {}  # trial number -> (optuna trial, MLflow run id)
    told: dict[int, set] = {}  # trial number -> the steps its Optuna trial was told
    stopping: set[int] = set()  # running trials whose prune tag is set (polled)
    records: list[TrialRecord] = []
    launched = [0]
    token = secrets.token_hex(16)
    search_id = uuid.uuid4().hex[:8]

    def on_report(message: dict) -> bool:  # classic sessions: while the trial runs
        number, step, value = int(message["trial"]), int(message["step"]), float(message["value"])
        with lock:
            if number not in running:
                raise ValueError(f"trial {number} is not running")
            otrial, run_id = running[number]
            otrial.report(value, step)
            prune = otrial.should_prune()
        client.log_metric(run_id, metric_name, value, step=step)
        return prune

    def tell(number: int, reports) -> int:
        """Report the steps not reported yet to the trial's Optuna trial
        (under ``lock``); how many were new."""
        otrial, seen = running[number][0], told[number]
        new = 0
        for step, value in reports:
            if step not in seen:
                seen.add(step)
                otrial.report(value, step)
                new += 1
        return new

    def poll(stop: threading.Event) -> None:  # Connect with a rule: while trials run
        failing = None
        while True:
            with lock:
                watched = [(n, r) for n, (_, r) in running.items() if n not in stopping]
            if not watched and stop.wait(_POLL_SECONDS):
                return
            gap = _read_gap(len(watched))
            for number, run_id in watched:
                if stop.wait(gap):
                    return
                try:
                    history = sorted(client.get_metric_history(run_id, metric_name),
                                     key=lambda m: m.step)  # stable: a step's first value
                    with lock:
                        prune = (number in running
                                 and tell(number, [(m.step, m.value) for m in history]) > 0
                                 and running[number][0].should_prune())
                        if prune:
                            stopping.add(number)
                    if prune:
                        client.set_tag(run_id, _task.PRUNE_TAG, "true")
                except Exception as exc:  # noqa: BLE001 - the next poll tries again
                    if repr(exc) != failing:
                        _log.warning("search: reading trial %s's reports from %s failed "
                                     "(tried again at the next read): %s", number, uri, exc)
                    failing = repr(exc)
                    with lock:
                        stopping.discard(number)

    server = address = None
    if not connect:
        host = conf_value(spark.sparkContext, "spark.driver.host") or "127.0.0.1"
        # Bound to the driver's own address (loopback locally): executors reach
        # it, nothing else needs to, and every message must be signed with the
        # token (which itself never goes over this connection; see task.py).
        server = _ReportServer((host, 0), _make_handler(on_report, token))
        address = server.server_address[:2]
        threading.Thread(target=server.serve_forever, name="dist_dl-search-reports",
                         daemon=True).start()

    def one_trial() -> bool:
        with lock:
            if launched[0] >= max_trials:
                return False
            launched[0] += 1
            otrial = study.ask(distributions)
            params = dict(otrial.params)
            run = client.create_run(experiment_id, run_name=f"trial-{otrial.number}", tags={
                "mlflow.parentRunId": parent_id, "dist_dl.trial": str(otrial.number)})
            running[otrial.number] = (otrial, run.info.run_id)
            told[otrial.number] = set()
        run_id = run.info.run_id
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
        group = f"dist_dl-search-{search_id}-trial-{otrial.number}"
        fn = _bind(train_fn, params, otrial.number, address, token,
                   (uri, run_id, metric_name) if polled else None)
        try:
            with session_jobs(spark, group, f"dist_dl search trial {otrial.number}"):
                record = json.loads(call_in_task(spark, _trial_line, fn))
        except Exception as exc:  # noqa: BLE001 - the task itself died (e.g. out of memory)
            record = {"status": "failed", "value": None, "steps": 0, "start": None,
                      "end": None, "error": f"the Spark task failed: {exc}"[:_MAX_TAG]}
        # What a trial says about its failure goes to MLflow (a tag, error.txt)
        # and the results: redacted with the driver's secrets (the task
        # already did with the executor's), as parameters are.
        for key in ("error", "traceback"):
            if record.get(key):
                record[key] = redact_secrets(record[key])
        # Reports that came back with the outcome (a Connect session's trials):
        # those the poller has not read yet reach the study now.
        reports = record.get("reports") or []
        with lock:
            tell(otrial.number, reports)
            del running[otrial.number]
            del told[otrial.number]
            stopping.discard(otrial.number)
            state = {"completed": optuna.trial.TrialState.COMPLETE,
                     "pruned": optuna.trial.TrialState.PRUNED,
                     "failed": optuna.trial.TrialState.FAIL}[record["status"]]
            study.tell(otrial, record["value"] if state == optuna.trial.TrialState.COMPLETE
                       else None, state=state)
            records.append(TrialRecord(number=otrial.number, params=params,
                                       status=record["status"], value=record["value"],
                                       steps=record.get("steps", 0), start=record["start"],
                                       end=record["end"], run_id=run_id,
                                       error=record.get("error")))
        tags = [RunTag("dist_dl.trial_status", record["status"])]
        # Logged by the trial itself where the driver polls them.
        metrics = [Metric(metric_name, value, int(time.time() * 1000), step)
                   for step, value in ([] if polled else reports)]
        if record["start"] is not None:
            tags += [RunTag("dist_dl.task_start", repr(record["start"])),
                     RunTag("dist_dl.task_end", repr(record["end"]))]
            metrics.append(Metric("trial_seconds", record["end"] - record["start"],
                                  int(time.time() * 1000), 0))
        if record["status"] == "completed":
            metrics.append(Metric(metric_name, record["value"], int(time.time() * 1000),
                                  record.get("steps", 0)))
        if record.get("error"):
            tags.append(RunTag("dist_dl.error", record["error"][:_MAX_TAG]))
        client.log_batch(run_id, metrics=metrics, tags=tags)
        if record.get("traceback"):
            client.log_text(run_id, record["traceback"], "error.txt")
        client.set_terminated(run_id, {"completed": "FINISHED", "pruned": "KILLED",
                                       "failed": "FAILED"}[record["status"]])
        return True

    errors: list[BaseException] = []
    stop_polling = threading.Event()
    if polled:
        threading.Thread(target=poll, args=(stop_polling,), name="dist_dl-search-poll",
                         daemon=True).start()

    def worker():
        try:
            while one_trial():
                pass
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(exc)

    try:
        # InheritableThread: PySpark's pinned-thread mode gives each Python
        # thread its own JVM thread, so job groups do not leak between trials;
        # on Connect it hands the thread the session's tags (it needs the session).
        on_session = {"session": spark} if connect else {}
        threads = [InheritableThread(target=worker, name=f"dist_dl-search-{i}", **on_session)
                   for i in range(max_concurrent)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop_polling.set()
        if server is not None:
            server.shutdown()
            server.server_close()
    if errors:
        client.set_terminated(parent_id, "FAILED")
        raise errors[0]

    records.sort(key=lambda r: r.number)
    done = [r for r in records if r.status == "completed"]
    counts = {s: sum(r.status == s for r in records) for s in ("completed", "pruned", "failed")}
    if not done:
        client.set_terminated(parent_id, "FAILED")
        first = next((r.error for r in records if r.error), "none reported")
        raise SearchError(f"none of {len(records)} trials completed ({counts}); first error: "
                          f"{first}", tuple(records))
    best = (min if mode == "min" else max)(done, key=lambda r: r.value)
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[
        Metric(f"best_{metric_name}", best.value, now, 0),
        *[Metric(f"trials_{s}", float(n), now, 0) for s, n in counts.items()]],
        params=[Param(f"best_{k}", str(v)) for k, v in best.params.items()],
        tags=[RunTag("dist_dl.best_run_id", best.run_id)])
    client.set_terminated(parent_id, "FINISHED")
    return SearchResult(best_params=dict(best.params), best_value=best.value,
                        best_run_id=best.run_id, parent_run_id=parent_id, trials=tuple(records))


def _trial_line(fn) -> str:
    """In the trial's task: its one JSON line (``fn`` is `_bind()`'s)."""
    return next(iter(fn(iter(()))))


def _bind(train_fn, params, number, address, token, tracking):
    import functools

    return functools.partial(_task.run_trial, train_fn=train_fn, params=params, trial=number,
                             address=address, token=token, tracking=tracking)


def _loopback_store(uri: str, master: str) -> str | None:
    """Why the executors cannot reach a tracking server ``uri`` (from a
    Connect session of ``master``): one on the client's loopback address,
    while the executors run on other hosts (a master not ``local...``); or
    None."""
    import ipaddress
    from urllib.parse import urlsplit

    from dist_dl.launch.core.network import is_loopback, resolve

    if not uri.startswith(("http:", "https:")) or master.startswith("local"):
        return None
    host = urlsplit(uri).hostname or ""
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:  # a name: what it resolves to here
        address = resolve(host)
    if address and is_loopback(address):
        return (f"the tracking server {urlsplit(without_credentials(uri)).netloc} is on this "
                f"machine's loopback address, which the executors (master {master or 'unknown'}) "
                "do not reach: use a tracking server both reach (on Databricks the "
                "workspace's, tracking_uri='databricks'), or early_stopping=None")
    return None
