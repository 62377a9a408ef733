"""Shared fixtures: a hermetic local Spark, a real standalone cluster on loopback."""
from __future__ import annotations

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


# The tests' own helpers (tests/support/) import by name in every tier, and so
# do the repository's tools (tools/, not in the wheel).
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import import_probe  # noqa: E402  (tests/support/, on the path from the line above)
import jvm  # noqa: E402

# Ends a test that outlives its timeout where pytest-timeout's signal cannot act.
pytest_plugins = ["backstop"]


# The Spark Connect tests' modules (tests/support/connect_server.py). With
# `--connect-only`, pytest runs these alone, of what its arguments name (a
# folder holding one, the module, a test of it): the Makefile's pass of the
# Connect tests with a profile's client overlay on the path (dbr-18-ml), which
# the other modules run without. Nothing else is collected or imported.
CONNECT_MODULES = tuple(Path(__file__).resolve().parent / m for m in
                        ("integration/test_connect.py", "reliability/test_connect_client.py"))


def pytest_addoption(parser):
    parser.addoption("--connect-only", action="store_true",
                     help="run only the Spark Connect tests' modules of the arguments "
                          "(tests/conftest.py: CONNECT_MODULES)")


def _on_the_way_to_connect(path: Path) -> bool:
    """Whether ``path`` is a Connect module or a folder that holds one."""
    path = path.resolve()
    return any(m == path or path in m.parents for m in CONNECT_MODULES)


def _keep_connect_arguments(config) -> None:
    """`--connect-only`: the arguments that name a Connect module, or a folder
    holding one; the others (a module or test of another) are dropped, so
    that they are neither collected nor reported as not found."""
    here = Path(config.invocation_params.dir)
    config.args[:] = [a for a in config.args if _on_the_way_to_connect(here / a.split("::")[0])]


def pytest_ignore_collect(collection_path, config):
    """`--connect-only`: below the arguments, the Connect modules alone."""
    if config.getoption("connect_only") and not _on_the_way_to_connect(collection_path):
        return True
    return None


def pytest_configure(config):
    """Every Spark driver JVM started from here or from a child process
    starts cheap (tests/support/jvm.py). The first process makes the class
    archive (xdist's controller: before its workers start, which inherit
    the environment set here)."""
    if config.getoption("connect_only"):
        _keep_connect_arguments(config)
    if not hasattr(config, "workerinput"):
        jvm.ensure_class_archive()
        _own_mlflow_store(config)
        import_probe.share_across_processes(config)
    for key, value in jvm.driver_env().items():
        os.environ.setdefault(key, value)


def _own_mlflow_store(config) -> None:
    """Tests that name no MLflow store use one of this run's (in the
    environment, so xdist's workers and every process a test starts get it):
    MLflow 3's default, ./mlflow.db in the working directory, would be shared
    by every profile's runs in a checkout, and a later MLflow's migrations
    make it unreadable to an earlier one's."""
    if "MLFLOW_TRACKING_URI" in os.environ:
        return
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="pytest-mlflow-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder}/mlflow.db"
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


# The tiers (pytest.ini's testpaths runs them in this order):
#   unit/         no Spark, no training, no worker process; runs in the light
#                 environment of `make test-unit` (no TensorFlow, no PySpark)
#   integration/  real Spark, real workers, real training on small data
#   reliability/  faults injected into real jobs (records: tests/support/scenarios.py)
#   hosts/        the cluster of separate hosts (tests/support/host_cluster.py)
# Markers, set in the test files: `slow` (over a minute on 2 cores: `make
# test-fast` leaves them out), `profile_subset_164` (what CI also runs on the
# runtime profiles dbr-16.4-ml and dbr-17.3-ml: of the modules where the code
# meets the libraries a profile changes, every test not marked slow, and a few
# slow ones; the unit tier runs whole on every profile; docs/guides/profiles.md),
# `profile_dbr19` (what CI also runs on dbr-19-ml, which has no TensorFlow: the
# torch engine, runner and reader, the checks without TensorFlow, the torch
# demo; and the unit tier). The default profile (dbr-15.4-ml) runs every test.


# Tests that need a module the library treats as optional (Horovod, Petastorm,
# TensorFlow) carry `@pytest.mark.needs("horovod.tensorflow")`, `needs("petastorm")`
# or `needs("tensorflow")`, and are skipped, saying why, where that module does
# not import: Databricks Runtime 16.0 ML and later ship neither Horovod nor
# Petastorm (profile dbr-16.4-ml), and the library then trains with
# tf.distribute and reads with pyarrow; 19 ML ships no TensorFlow (dbr-19-ml). The cases of tests
# parametrized by `engine` or `reader` get the marker from their parameter.
NEEDS_BY_PARAM = {("engine", "horovod"): "horovod.tensorflow",
                  ("engine", "tensorflow"): "tensorflow",
                  ("engine", "keras3"): "tensorflow",
                  ("reader", "petastorm"): "petastorm"}


def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs"):
        module = marker.args[0]
        failure = import_probe.failure(module)
        if failure is not None:
            why = {"torch": " (the `torch` extra: profiles dbr-16.4-ml and dbr-17.3-ml)",
                   "tensorflow": "; Databricks Runtime 19 ML and later ship no TensorFlow"}.get(
                module.split(".")[0],
                "; Databricks Runtime 16.0 ML and later ship no Horovod and no Petastorm")
            pytest.skip(f"needs {module}, which does not import here ({failure}){why}")
    # The Keras 3 case of an engine-parametrized test (keras=3): where it can train.
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("engine") == "keras3":
        from dist_dl.core import compat

        problem = compat.keras3_training_problem()
        if problem is not None:
            pytest.skip(problem)


def _needs(item) -> list[str]:
    if item.path.parent.name == "unit":
        return []  # the unit tier trains nothing: an engine there is a name in a config
    params = getattr(getattr(item, "callspec", None), "params", {})
    return [module for (name, value), module in NEEDS_BY_PARAM.items()
            if params.get(name) == value]


# tryfirst: the marker must be on the items before `-m` selects them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    hosts_tests = 0
    for item in items:
        for module in _needs(item):
            item.add_marker(pytest.mark.needs(module))
        if item.path.parent.name == "unit":
            # The unit tier is quick: every runtime profile runs all of it.
            item.add_marker(pytest.mark.profile_subset_164)
            item.add_marker(pytest.mark.profile_dbr19)
        if item.get_closest_marker("hosts") is not None:
            item.add_marker(pytest.mark.slow)
            # The tests of the cluster of separate hosts in two groups, taken
            # in turn: each group runs in one test process, on a cluster of
            # its own (its session's `hosts`), so that two such tests can run
            # at once (much of their time is spent waiting).
            item.add_marker(pytest.mark.xdist_group(f"hosts-{hosts_tests % 2}"))
            hosts_tests += 1
        elif item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.xdist_group("cluster"))
    # Longest first, so that the run does not end on one long test with the
    # other test processes idle: the separate hosts' tests (a third of the
    # suite's time; their drivers run on the hosts, so they leave the test
    # process's Spark session alone), then the other tests marked slow (the
    # fault scenarios, which restart jobs, before the integration tests),
    # then the rest. Then one SparkContext per process: tests on the
    # standalone cluster replace the local session, so they run last in their
    # tier and the local ones share one.
    tiers = {"unit": 0, "integration": 1, "reliability": 2, "hosts": 3}

    def order(item):
        slow = item.get_closest_marker("slow") is not None
        tier = tiers.get(item.path.parent.name, 1)
        return (item.get_closest_marker("hosts") is None, not slow, -tier if slow else tier,
                item.get_closest_marker("cluster") is not None)

    items.sort(key=order)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on its item, for fixtures that record outcomes; a
    failed test on the cluster of separate hosts keeps every host's logs."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)
    if call.excinfo is not None and call.excinfo.errisinstance(pytest.fail.Exception) \
            and str(call.excinfo.value).startswith("Timeout"):
        # pytest-timeout may have interrupted a py4j call half-way
        # (tests/support/spark_reset.py): the next `spark` starts a new session.
        _TIMED_OUT.append(item.nodeid)
    if report.failed and _CLUSTER and item.get_closest_marker("hosts") is not None:
        import host_cluster

        folder = _CLUSTER[0].keep_logs(host_cluster.kept_logs_folder(item.nodeid))
        report.sections.append(("host logs", f"every host's logs are kept in {folder}"))
        item.user_properties.append(("host_logs", str(folder)))


def pytest_terminal_summary(terminalreporter):
    kept = [(r.nodeid, v) for reports in terminalreporter.stats.values() for r in reports
            if hasattr(r, "user_properties") for k, v in r.user_properties if k == "host_logs"]
    for nodeid, folder in kept:
        terminalreporter.write_line(f"host logs of {nodeid}: {folder}")
    if _RECORDS:
        terminalreporter.write_line(f"reliability records: {_RECORDS[0]} "
                                    "(make reliability-report puts them in docs/)")


@pytest.fixture
def scenario(request):
    """Records reliability scenarios (tests/support/scenarios.py):
    ``s = scenario("F3 hosts", title, done, passes)``, then ``s.figure(...)``
    for what was measured; the row's result is the test's outcome."""
    import scenarios

    made = []

    def make(key: str, title: str, done: str, passes: str) -> "scenarios.Scenario":
        s = scenarios.Scenario(key, title, done, passes, test=request.node.nodeid)
        made.append(s)
        return s

    yield make
    report = getattr(request.node, "report_call", None)
    for s in made:
        if report is None or report.skipped:
            continue
        if s.checked is not None:  # its own pass condition, checked (Scenario.check)
            scenarios.record(s, not s.checked, s.checked)
            continue
        lines = report.longreprtext.strip().splitlines() if report.failed else []
        scenarios.record(s, report.passed, lines[-1] if lines else "")


# This session's records file, once written; the cluster of separate hosts,
# once started; the tests of this process that ran past their timeout since
# the `spark` fixture last looked.
_RECORDS: list = []
_CLUSTER: list = []
_TIMED_OUT: list = []


def pytest_sessionfinish(session, exitstatus):
    import scenarios

    path = scenarios.write()
    if path is not None:
        _RECORDS.append(path)


@pytest.fixture(scope="session")
def hosts():
    """The cluster of separate hosts (tests/support/host_cluster.py), one for
    the session: the separate-hosts tests and the reliability suite share it.
    Under CI=true a missing capability fails the tests instead of skipping them."""
    from host_cluster import HostCluster, base_folder, kept_logs_folder, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI must run the separate-hosts tests")
        pytest.skip(reason)
    cluster = HostCluster(base_folder())
    try:
        try:
            cluster.start()
        except Exception as exc:
            folder = cluster.keep_logs(kept_logs_folder("cluster-start"))
            raise RuntimeError(f"the cluster of separate hosts did not start ({exc}); every "
                               f"host's logs are kept in {folder}") from exc
        _CLUSTER.append(cluster)
        yield cluster
    finally:
        _CLUSTER.clear()
        cluster.stop()
        assert cluster.leftovers() == [], f"left behind: {cluster.leftovers()}"


@pytest.fixture
def spark():
    """A `local[2]` SparkSession, started once and shared (restarted if a
    cluster test replaced it, or a test of this process ran past its timeout)."""
    from dist_dl.core.session import get_spark

    if _TIMED_OUT:
        import spark_reset

        spark_reset.discard_session()
        _TIMED_OUT.clear()
    return get_spark("local[2]", replace=True)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """24 synthetic images (16 x 16, 3 classes) in 6 row groups of 4, once
    per module: one step of batch 8 on one worker reads row groups 2k and
    2k+1; with two workers at batch 4, rank 0 reads 2k and rank 1 reads 2k+1
    (Petastorm gives row group i to rank i % 2)."""
    from dist_dl.prepare.synthetic import make_synthetic_images

    path = str(tmp_path_factory.mktemp("synthetic") / "shards")
    make_synthetic_images(path, rows=24, image_size=16, classes=3, rows_per_row_group=4)
    return path


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
               SPARK_WORKER_DIR=str(base / "work"), **jvm.daemon_env())
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
