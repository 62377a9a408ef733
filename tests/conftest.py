"""Shared fixtures: a hermetic local Spark, a real standalone cluster on loopback."""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Keep TensorFlow quiet and off the network in every process the tests start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# What CI also runs on the dbr-15.4-ml profile, as marker `profile_subset`
# (`-m profile_subset`; the README says why these): of the modules where the
# code meets TensorFlow, Keras, Horovod, Petastorm, pyarrow, pandas, MLflow and
# databricks-sdk, whose versions the profile changes (the launcher, the
# drop-in, data, training, ensembles, scoring, the notebooks, jobs), every test
# not marked slow, and of the slow ones those below: the Databricks examples
# run unchanged, Horovod's Keras callbacks on tf-keras, train_distributed on
# Spark workers with its MLflow model, resume, Keras ensemble members and two
# notebooks. CI runs the profile's whole suite where its machine is fast enough
# for both profiles in 75 minutes, and this subset where it is not (.ci/run).
PROFILE_SUBSET = frozenset({
    "test_launcher", "test_dropin", "test_lazy", "test_read", "test_train", "test_schedule",
    "test_checkpoint", "test_tracking", "test_ensemble", "test_scoring", "test_notebooks",
    "test_jobs",
})
PROFILE_SUBSET_SLOW = frozenset({
    "tests/test_checkpoint.py::test_resume_equivalence_with_horovod",
    "tests/test_dropin.py::test_databricks_mnist_example_trains_with_horovod_callbacks",
    "tests/test_dropin.py::test_databricks_petastorm_converter_example_on_spark_tasks",
    "tests/test_dropin.py::test_tensorflow_lazy_modules_pickle_by_name",
    "tests/test_dropin.py::test_workers_get_keras_2_where_keras_3_is_the_default",
    "tests/test_ensemble.py::test_keras_members_averaged[tf.keras]",
    "tests/test_ensemble.py::test_keras_members_averaged[keras]",
    "tests/test_launcher.py::test_allreduce_local_spark[horovod]",
    "tests/test_notebooks.py::test_notebook_runs_locally[03_horovod_runner]",
    "tests/test_notebooks.py::test_notebook_runs_locally[04_train_distributed_dataframe]",
    "tests/test_tracking.py::test_logged_model_loads_where_dist_dl_is_not_installed",
    "tests/test_train.py::test_digits_learn_on_two_spark_workers_and_transform_matches_the_mlflow_model[horovod]",
})


# What CI runs on the dbr-16.4-ml profile (Databricks Runtime 16.4 LTS ML: no
# Horovod, no Petastorm), as marker `profile_subset_164`: of the modules where
# the code meets the versions that profile changes (TensorFlow 2.17, Keras 3
# beside tf-keras, pyarrow 15, pandas 1.5, MLflow 2.21, databricks-sdk 0.30) and
# can run without Horovod (the launcher's and train_distributed's tf.distribute
# engine, the arrow reader, prepare, tracking, scoring, ensembles, search,
# checkpoints, the drop-in's Keras switches, jobs, configuration, optional
# imports), every test not marked slow, and the slow ones below (among them
# train_distributed on two Spark tasks with its MLflow model, and resume, on
# tf.distribute). Tests of these modules that need Horovod or Petastorm are
# selected too and skip there, saying why (`needs`). The dbr-17.3-ml profile
# (Runtime 17.3 LTS ML: no Horovod, no Petastorm either; TensorFlow 2.19,
# Spark 4.0, pyarrow 19, pandas 2.2, numpy 2.1, MLflow 3.0, databricks-sdk 0.49)
# runs the same subset: the same modules meet the versions it changes.
PROFILE_SUBSET_164 = frozenset({
    "test_launcher", "test_train", "test_read", "test_prepare", "test_tracking", "test_scoring",
    "test_ensemble", "test_search", "test_optional", "test_config", "test_settings", "test_lazy",
    "test_schedule", "test_checkpoint", "test_dropin", "test_jobs", "test_integrity",
    "test_registry_lookup", "test_model_parallel", "test_locations", "test_markers",
})
PROFILE_SUBSET_164_SLOW = frozenset({
    "tests/test_dropin.py::test_tensorflow_lazy_modules_pickle_by_name",
    "tests/test_ensemble.py::test_keras_members_averaged[tf.keras]",
    "tests/test_ensemble.py::test_keras_members_averaged[keras]",
    "tests/test_ensemble.py::test_forest_ensemble_beats_its_members_and_matches_mlflow_model",
    "tests/test_launcher.py::test_more_processes_than_slots_fails_fast[tensorflow]",
    "tests/test_launcher.py::test_timeout_spark[tensorflow]",
    "tests/test_search.py::test_grid_search_limits_concurrency_fails_and_stops_trials",
    "tests/test_tracking.py::test_logged_model_loads_where_dist_dl_is_not_installed",
    "tests/test_train.py::test_a_run_stopped_after_epoch_1_and_resumed_ends_like_an_uninterrupted_one[tensorflow]",
    "tests/test_train.py::test_digits_learn_on_two_spark_workers_and_transform_matches_the_mlflow_model[tensorflow]",
    # Keras 3 on tf.distribute (keras=3): the profiles where it runs.
    "tests/test_train.py::test_two_workers_at_half_batch_take_the_same_steps_as_one_worker[keras3]",
    "tests/test_train.py::test_digits_learn_on_two_spark_workers_and_transform_matches_the_mlflow_model[keras3]",
    "tests/test_train.py::test_a_run_stopped_after_epoch_1_and_resumed_ends_like_an_uninterrupted_one[keras3]",
    "tests/test_train.py::test_a_worker_killed_mid_epoch_is_retried_and_only_that_epoch_runs_again[keras3]",
    "tests/test_train.py::test_mixed_precision_and_fp16_gradients_run_on_cpu_and_log_a_float32_model[keras3]",
})


# Tests over 10 s in the full run of 23 Nov 2026 (`--durations=0`, part of it
# at load 7) that carry no @pytest.mark.slow of their own: also `slow`, so that
# `make test-fast` stays a few minutes. The separate-hosts tests are slow too.
SLOW_BY_DURATION = frozenset({
    "tests/test_dropin.py::test_busy_slots_are_waited_for_with_progress",
    "tests/test_dropin.py::test_databricks_mnist_example_trains_with_horovod_callbacks",
    "tests/test_dropin.py::test_databricks_petastorm_converter_example_on_spark_tasks",
    "tests/test_dropin.py::test_tensorflow_lazy_modules_pickle_by_name",
    "tests/test_dropin.py::test_workers_get_keras_2_where_keras_3_is_the_default",
    "tests/test_ensemble.py::test_forest_ensemble_beats_its_members_and_matches_mlflow_model",
    "tests/test_ensemble.py::test_input_is_evaluated_once_and_every_row_is_accounted_for",
    "tests/test_ensemble.py::test_keras_members_averaged[tf.keras]",
    "tests/test_ensemble.py::test_keras_members_averaged[keras]",
    "tests/test_integrity.py::test_a_member_swapped_in_the_logged_model_is_refused",
    "tests/test_integrity.py::test_a_swapped_member_is_refused_on_the_executors",
    "tests/test_launcher.py::test_allreduce_local_spark[horovod]",
    "tests/test_launcher.py::test_allreduce_standalone_cluster",
    "tests/test_launcher.py::test_idle_worker_does_not_spin",
    "tests/test_launcher.py::test_more_processes_than_slots_fails_fast[horovod]",
    "tests/test_launcher.py::test_more_processes_than_slots_fails_fast[tensorflow]",
    "tests/test_launcher.py::test_timeout_spark[horovod]",
    "tests/test_launcher.py::test_timeout_spark[tensorflow]",
    "tests/test_launcher.py::test_weights_identical_on_all_ranks_after_training",
    "tests/test_launcher.py::test_worker_exception_on_spark[horovod]",
    "tests/test_notebooks.py::test_notebook_runs_locally[02_single_node_baseline]",
    "tests/test_notebooks.py::test_notebook_runs_locally[03_horovod_runner]",
    "tests/test_output.py::test_the_embedded_session_starts_quietly_and_keeps_warnings",
    "tests/test_secrets.py::test_a_secret_in_a_failing_trial_reaches_no_tag_or_artifact",
    "tests/test_tracking.py::test_logged_model_loads_where_dist_dl_is_not_installed",
    "tests/test_train.py::test_an_error_of_the_code_is_not_retried_and_names_the_checkpoint[horovod]",
    "tests/test_train.py::test_an_error_of_the_code_is_not_retried_and_names_the_checkpoint[tensorflow]",
})


# Tests that need a module the library treats as optional (Horovod, Petastorm)
# carry `@pytest.mark.needs("horovod.tensorflow")` or `needs("petastorm")`, and
# are skipped, saying why, where that module does not import: Databricks
# Runtime 16.0 ML and later ship neither (profile dbr-16.4-ml), and the library
# then trains with tf.distribute and reads with pyarrow. The cases of tests
# parametrized by `engine` or `reader` get the marker from their parameter.
NEEDS_BY_PARAM = {("engine", "horovod"): "horovod.tensorflow",
                  ("reader", "petastorm"): "petastorm"}


@functools.lru_cache(maxsize=None)
def _import_failure(module: str) -> str | None:
    """Why ``module`` does not import in this environment's Python, or None.
    Tried in a child process, so that the test process imports nothing it
    would not have (Horovod's import loads TensorFlow and its own library)."""
    try:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                              text=True, timeout=120,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    except subprocess.TimeoutExpired:
        return None  # slow (a loaded machine), not missing: the test runs and says more
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs"):
        module = marker.args[0]
        failure = _import_failure(module)
        if failure is not None:
            pytest.skip(f"needs {module}, which does not import here ({failure}); Databricks "
                        "Runtime 16.0 ML and later ship no Horovod and no Petastorm")
    # The Keras 3 case of an engine-parametrized test (keras=3): where it can train.
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("engine") == "keras3":
        from dist_dl.core import compat

        problem = compat.keras3_training_problem()
        if problem is not None:
            pytest.skip(problem)


def _needs(item) -> list[str]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return [module for (name, value), module in NEEDS_BY_PARAM.items()
            if params.get(name) == value]


# tryfirst: the marker must be on the items before `-m` selects them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for module in _needs(item):
            item.add_marker(pytest.mark.needs(module))
        if item.nodeid in SLOW_BY_DURATION or item.get_closest_marker("hosts") is not None:
            item.add_marker(pytest.mark.slow)
        if item.path.stem in PROFILE_SUBSET and (
                item.get_closest_marker("slow") is None or item.nodeid in PROFILE_SUBSET_SLOW):
            item.add_marker(pytest.mark.profile_subset)
        if item.path.stem in PROFILE_SUBSET_164 and (
                item.get_closest_marker("slow") is None or item.nodeid in PROFILE_SUBSET_164_SLOW):
            item.add_marker(pytest.mark.profile_subset_164)
    # One SparkContext per process: tests on the standalone cluster replace the
    # local session, so they run last and the local ones share one session.
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on its item, for fixtures that record outcomes."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture
def scenario(request):
    """Records reliability scenarios for docs/RELIABILITY.md (tests/reliability.py):
    ``s = scenario("F3 hosts", title, done, passes)``, then ``s.figure(...)``
    for what was measured; the row's result is the test's outcome."""
    import reliability

    made = []

    def make(key: str, title: str, done: str, passes: str) -> "reliability.Scenario":
        s = reliability.Scenario(key, title, done, passes, test=request.node.nodeid)
        made.append(s)
        return s

    yield make
    report = getattr(request.node, "report_call", None)
    for s in made:
        if report is None or report.skipped:
            continue
        lines = report.longreprtext.strip().splitlines() if report.failed else []
        reliability.record(s, report.passed, lines[-1] if lines else "")


def pytest_sessionfinish(session, exitstatus):
    import reliability

    reliability.write()


@pytest.fixture(scope="session")
def hosts():
    """The cluster of separate hosts (tests/hosts.py), one for the session:
    the separate-hosts tests and the reliability suite share it. Under
    CI=true a missing capability fails the tests instead of skipping them."""
    from hosts import HostCluster, base_folder, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must run the separate-hosts tests")
        pytest.skip(reason)
    cluster = HostCluster(base_folder())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        assert cluster.leftovers() == [], f"left behind: {cluster.leftovers()}"


@pytest.fixture
def spark():
    """A `local[2]` SparkSession, started once and shared (restarted if a
    cluster test replaced it)."""
    from dist_dl.core.session import get_spark

    return get_spark("local[2]", replace=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, deadline: float) -> None:
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A real Spark standalone cluster: one master and two one-core workers on
    127.0.0.1, started with PySpark's own `spark-class` launcher. Yields the
    master URL."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = spark_home / "bin" / "spark-class"
    base = tmp_path_factory.mktemp("standalone")
    env = dict(os.environ, SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=str(base / "logs"),
               SPARK_WORKER_DIR=str(base / "work"))
    port, ui = _free_port(), _free_port()
    procs, logs = [], []

    def start(name, *args):
        log = open(base / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([str(spark_class), *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))

    start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
          "--port", str(port), "--webui-port", str(ui))
    _wait_for_port(port, time.time() + 60)
    url = f"spark://127.0.0.1:{port}"
    for i in range(2):
        start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
              "--cores", "1", "--memory", "2g", "--webui-port", str(_free_port()),
              "--work-dir", str(base / f"work{i}"))
    try:
        yield url
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        for log in logs:
            log.close()


@pytest.fixture
def cluster_spark(standalone_cluster):
    """A SparkSession on the standalone cluster, with both workers registered."""
    from dist_dl.core.session import get_spark, task_slots

    spark = get_spark(standalone_cluster, replace=True,
                      conf={"spark.executor.memory": "1g", "spark.cores.max": "2"})
    deadline = time.time() + 90
    while task_slots(spark) < 2:
        if time.time() > deadline:
            raise TimeoutError("the standalone cluster's two executors did not register")
        time.sleep(0.5)
    return spark


@pytest.fixture(autouse=True)
def _mlflow_state_restored():
    """Each test starts and ends with MLflow's process-wide state as it was:
    tracking URI, no registry URI of its own, no active run, no active experiment (a leaked experiment id
    points into another test's store)."""
    import mlflow
    import mlflow.tracking.fluent as fluent

    uri = mlflow.get_tracking_uri()
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(None)  # no test sets one for the next
    os.environ.pop("MLFLOW_REGISTRY_URI", None)  # set_registry_uri exports it
    fluent._active_experiment_id = None
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
