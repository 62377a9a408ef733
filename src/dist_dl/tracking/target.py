"""Where a library call logs: a tracking URI and an experiment, for one block.

Driver side. ``mlflow.set_experiment`` changes process-wide state (the active
experiment id, and the ``MLFLOW_EXPERIMENT_ID`` environment variable that
every child process inherits). A library call that used it and then put
only the tracking URI back left the caller pointing at an experiment id of
another store: the next ``mlflow.start_run`` failed with "Could not find
experiment with ID ...". So library code never sets the experiment
globally; it asks `mlflow_target()` for the experiment id and passes it
to ``mlflow.start_run(experiment_id=...)``.
"""
from __future__ import annotations

import contextlib
import os
import threading

from dist_dl.core.imports import spark_ml_imported
from dist_dl.core.locations import file_url, local_path

__all__ = ["mlflow_target", "experiment_id", "absolute_tracking_uri", "store_folder",
           "attached_run", "drop_unwritten_metrics"]


def absolute_tracking_uri(uri: str | None) -> str | None:
    """A local file store as an absolute ``file://`` URI, a relative SQLite
    database as an absolute ``sqlite:////`` one; anything else as given.

    Workers and Spark tasks run in other working directories, so a relative
    store (``runs/mlruns``, ``file:runs/mlruns``, ``sqlite:///mlflow.db``:
    MLflow 3's default from 3.7 on is the last) would be another store for
    each of them, where the driver's run is not found.
    """
    if uri is None or uri.split(":")[0] in ("databricks", "databricks-uc"):
        return uri  # the workspace's tracking server (databricks, databricks://profile)
    if uri.startswith("file:") and not uri.startswith("file:///"):
        return file_url(uri[len("file:"):])
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        # SQLAlchemy's form: sqlite:///relative.db, sqlite:////absolute.db.
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    if ":" not in uri.split("/")[0]:  # a path, not a scheme (databricks, sqlite:, http:...)
        return file_url(uri)
    return uri


def store_folder(uri: str | None) -> str | None:
    """The folder of a file-based MLflow store (a ``file:`` store's root, a
    ``sqlite:///`` database's folder), which every process that logs to it
    must see; None for a tracking server."""
    uri = absolute_tracking_uri(uri)
    if uri is None:
        return None
    if uri.startswith("file:"):
        return uri
    if uri.startswith("sqlite:///"):
        # SQLAlchemy's form: sqlite:///relative.db, sqlite:////absolute.db.
        return os.path.dirname(os.path.abspath(uri[len("sqlite:///"):]))
    return None


def drop_unwritten_metrics(uri: str | None, run_id: str) -> list[str]:
    """Remove the metric files of run ``run_id`` that hold no line, where the
    run is in a ``file:`` store; returns their metric names.

    MLflow's file store creates a metric's file, then appends the line: a
    worker stopped between the two (the launcher stops the other workers of
    a failed attempt) leaves an empty file, and every later read of the run
    (``get_run``, the next attempt's rank 0 attaching to it, the UI) fails
    with "Metric '...' is malformed. No data found" (mlflow/mlflow#3052). An
    empty file holds no value: nothing logged is lost."""
    import glob

    uri = absolute_tracking_uri(uri)
    if not uri or not uri.startswith("file:"):
        return []
    root = local_path(uri)
    dropped = []
    for metrics in glob.glob(os.path.join(glob.escape(root), "*", run_id, "metrics")):
        for folder, _, files in os.walk(metrics):
            for name in files:
                path = os.path.join(folder, name)
                if os.path.getsize(path) == 0:
                    os.remove(path)
                    dropped.append(os.path.relpath(path, metrics))
    return sorted(dropped)


def experiment_id(name: str | None, client=None) -> str:
    """The id of experiment ``name`` (created if missing) in the current store.

    ``None`` means the caller's active experiment if one is set, else
    ``"Default"``. MLflow's file store creates its "Default" experiment only
    when its root folder does not exist yet (``FileStore.__init__``), so an
    existing empty folder, such as a fresh temporary directory, may have none:
    it is created here.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    client = client or MlflowClient()
    if name is None:
        active = mlflow.active_run()
        if active is not None:
            return active.info.experiment_id
        name = "Default"
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


# MLflow's tracking URI is one for the whole process (its fluent API, which
# log_model needs, reads a module global). Library calls made at once from
# several threads (a notebook's thread pool of trainings) share the URI under
# this condition: calls for the same store run together (only one at a time
# where MLflow's active run is per process too, see runs_per_thread); a call
# for another store waits until they are done. A call that set the URI and
# put "its" previous one back on leaving would, by ending first, point the
# others, still running, at the wrong store.
_STORE = threading.Condition()
_HOLDERS: list[tuple[int, str]] = []   # (thread id, URI) of the calls inside
_CALLERS_URI: list[str] = []           # the URI before the first of them


def _active_runs() -> list:
    """This thread's stack of active runs in MLflow's fluent API (one list for
    the process before MLflow 2.21, see `runs_per_thread()`)."""
    import mlflow.tracking.fluent as fluent

    stack = fluent._active_run_stack
    return stack if isinstance(stack, list) else stack.get()


@contextlib.contextmanager
def attached_run(run_id: str):
    """Make ``run_id``, a run another process owns (created it, sets its
    status, ends it), this thread's active run for the block, so that the
    fluent API (``mlflow.log_metrics``, ``log_model``) logs into it; its
    status is never written.

    Training workers log into the run the driver created, without
    ``mlflow.start_run(run_id=...)``, which sets the run RUNNING on entry and
    FINISHED or FAILED on exit. MLflow's file store (2.13 to 3.0) writes
    either by rewriting the run's ``meta.yaml`` in place
    (``FileStore._overwrite_run_info``: ``write_yaml(..., overwrite=True)``;
    an experiment's goes through ``overwrite_yaml``, a rename), and the
    launcher stops the other workers of a failed attempt with SIGTERM: a rank
    0 ending the run FAILED at that moment would leave the file empty, and
    every later call on the run would fail with "'NoneType' object has no
    attribute 'copy'" (the same symptom elsewhere: microsoft/qlib#684). The
    status is the driver's: it knows whether an attempt is retried.
    """
    from mlflow.tracking import MlflowClient, fluent

    run = fluent.ActiveRun(MlflowClient().get_run(run_id))
    stack = _active_runs()
    stack.append(run)
    try:
        yield run
    finally:
        # Popped here, never ended: MLflow's atexit hook ends whatever run
        # is still active when the process exits.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is run:
                del stack[i]
                break


def runs_per_thread() -> bool:
    """Whether MLflow keeps the active run per thread. MLflow 2.21.3 and
    2.22.1 do (``fluent._active_run_stack`` is a ThreadLocalVariable); 2.13.1,
    runtime 15.4's, keeps one list for the process, so a call's ``end_run``
    could end a run another thread started: there library calls that log
    take turns (see `mlflow_target()`)."""
    import mlflow.tracking.fluent as fluent

    return not isinstance(getattr(fluent, "_active_run_stack", None), list)


def _wanted(tracking_uri: str | None, me: int) -> str:
    import mlflow

    if tracking_uri:
        return tracking_uri
    mine = [uri for thread, uri in _HOLDERS if thread == me]
    if mine:
        return mine[-1]          # nested in a call of this thread: its store
    return _CALLERS_URI[0] if _CALLERS_URI else mlflow.get_tracking_uri()


@contextlib.contextmanager
def mlflow_target(tracking_uri: str | None = None, experiment_name: str | None = None):
    """Use ``tracking_uri`` (default: the current one) for the block and yield
    the id of experiment ``experiment_name`` in it (see `experiment_id()`).

    The caller's tracking URI is put back afterwards; the active experiment
    and ``MLFLOW_EXPERIMENT_ID`` are never changed. While a block of another
    thread uses another store, the block waits for it (MLflow's URI is
    process-wide), saying so once; with an MLflow whose active run is one per
    process (`runs_per_thread()`), it waits for any block of another
    thread.
    """
    import mlflow

    spark_ml_imported()  # before any parameter is logged (core.imports)
    me = threading.get_ident()
    per_thread = runs_per_thread()
    with _STORE:
        told = False
        while True:
            want = _wanted(tracking_uri, me)
            others = sorted({uri for thread, uri in _HOLDERS if thread != me})
            if not others or (per_thread and others == [want]):
                break
            if not told:
                why = ("MLflow's tracking URI is one per process" if per_thread else
                       f"MLflow {mlflow.__version__} keeps one active run per process")
                print(f"dist_dl: waiting for other calls of this process that log to "
                      f"{', '.join(others)} ({why}) before logging to {want}", flush=True)
                told = True
            _STORE.wait()   # every call's exit notifies
        if not _HOLDERS:
            _CALLERS_URI[:] = [mlflow.get_tracking_uri()]
        _HOLDERS.append((me, want))
        if mlflow.get_tracking_uri() != want:
            mlflow.set_tracking_uri(want)
    try:
        yield experiment_id(experiment_name)
    finally:
        with _STORE:
            _HOLDERS.remove((me, want))
            back = _HOLDERS[-1][1] if _HOLDERS else _CALLERS_URI.pop()
            if mlflow.get_tracking_uri() != back:
                mlflow.set_tracking_uri(back)
            _STORE.notify_all()
