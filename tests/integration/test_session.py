"""The Spark session helpers: job groups (cancel on failure, cleared after)."""
from __future__ import annotations

import os
import time

import pytest
from pyspark import InheritableThread

from dist_dl.core.session import job_group


def _slow_factory():
    # Made inside a function so that Spark's cloudpickle ships it by value:
    # the tests folder is not importable in the Python workers.
    def slow(_):
        import time as _time

        _time.sleep(60)
        return [1]

    return slow


_slow = _slow_factory()


@pytest.mark.timeout(120)
def test_job_group_cancels_its_running_jobs_when_the_block_fails(spark):
    sc = spark.sparkContext
    outcome = {}

    def run_slow_job():
        # Started inside the block, an InheritableThread's jobs are in its
        # group (a plain Python thread's JVM side would not inherit it).
        try:
            sc.parallelize([0], 1).mapPartitions(_slow).collect()
            outcome["error"] = None
        except Exception as exc:  # noqa: BLE001 - what the cancelled job raised
            outcome["error"] = str(exc)

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the caller's step failed"):
        with job_group(sc, "dist_dl-test-group", "a test job") as group:
            assert group == "dist_dl-test-group"
            worker = InheritableThread(target=run_slow_job)
            worker.start()
            # Raise only once the job is running (not before it is submitted,
            # nor after it has failed on its own).
            while not set(sc.statusTracker().getJobIdsForGroup(group)) & set(
                    sc.statusTracker().getActiveJobsIds()):
                time.sleep(0.1)
            raise RuntimeError("the caller's step failed")
    worker.join(timeout=60)
    assert not worker.is_alive()
    # Cancelled, not run to its end (the task sleeps for a minute).
    assert time.monotonic() - started < 45
    assert outcome["error"] and "cancel" in outcome["error"].lower()
    # The thread's group and description are cleared for the caller's next jobs.
    assert sc.getLocalProperty("spark.jobGroup.id") is None
    assert sc.getLocalProperty("spark.job.description") is None


@pytest.mark.timeout(120)
def test_job_group_files_the_blocks_jobs_and_leaves_nothing_behind(spark):
    sc = spark.sparkContext
    with job_group(sc, "dist_dl-test-ok", "a quick job"):
        assert sc.parallelize(range(4), 2).sum() == 6
    assert sc.statusTracker().getJobIdsForGroup("dist_dl-test-ok")
    assert sc.getLocalProperty("spark.jobGroup.id") is None


def test_a_session_on_another_master_is_not_stopped_behind_the_callers_back(spark):
    from dist_dl.core.session import get_spark

    with pytest.raises(ValueError, match=r"local\[2\].*is active.*spark.stop\(\)"):
        get_spark("spark://127.0.0.1:1")
    # The caller's session still works.
    assert spark.sparkContext.parallelize([1, 2], 2).sum() == 3
    assert get_spark() is spark


def test_the_driver_address_follows_the_master():
    from dist_dl.core.session import driver_address

    assert driver_address("local[2]") == "127.0.0.1"
    assert driver_address("spark://127.0.0.1:7077") == "127.0.0.1"
    assert driver_address("spark://localhost:7077,localhost:7078") == "127.0.0.1"
    assert driver_address("yarn") is None  # Spark's own default there
    with pytest.raises(ValueError, match="does not resolve"):
        driver_address("spark://no-such-host.invalid:7077")
    # A master on another host: tests/test_separate_hosts.py checks the
    # address on real hosts (the driver's eth0, never loopback).


@pytest.mark.timeout(120)
def test_stall_timeout_setting_is_checked(spark):
    from dist_dl.core.stall import stall_timeout

    assert stall_timeout(spark.sparkContext) == 180.0
    spark.sparkContext._conf.set("spark.dist_dl.stallTimeout", "soon")
    try:
        with pytest.raises(ValueError, match="spark.dist_dl.stallTimeout must be a number"):
            stall_timeout(spark.sparkContext)
    finally:
        spark.sparkContext._conf.set("spark.dist_dl.stallTimeout", "180")


@pytest.mark.timeout(120)
def test_an_embedded_session_leaves_no_scratch_folder_behind(tmp_path):
    """get_spark makes a scratch folder for Spark's local dirs, warehouse and
    logging set-up; it goes when the process ends (each session left one in
    /tmp before)."""
    import os
    import subprocess
    import sys

    code = ("from dist_dl.core.session import get_spark\n"
            "spark = get_spark('local[1]')\n"
            "assert spark.range(3).count() == 3\n"
            "print(spark.sparkContext.getConf().get('spark.local.dir'))\n")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=100, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    local_dir = result.stdout.strip().splitlines()[-1]
    assert local_dir.startswith(str(tmp_path)), local_dir
    assert not os.path.exists(os.path.dirname(local_dir)), os.listdir(tmp_path)


def _zip_with(path, source: str) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("zipped_for_test/__init__.py", "")
        archive.writestr("zipped_for_test/value.py", source)


@pytest.mark.timeout(60)
def test_a_python_worker_rereads_a_zip_on_sys_path_only_when_it_changed(tmp_path, monkeypatch):
    """PySpark's worker invalidates import caches before every task, which
    re-reads every zip importer's archive on Python 3.10-3.11 (pyspark.zip's
    ~800 entries, once per package imported from it); after
    prepare_python_worker only a changed archive is re-read, and a module
    added to it is still found."""
    import importlib
    import sys
    import zipimport

    from dist_dl.core.pyworker import _reread_changed_archives_only

    if not hasattr(zipimport.zipimporter, "invalidate_caches") or sys.version_info >= (3, 12):
        pytest.skip("zip importers re-read lazily from Python 3.12 (cpython gh-103200)")
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches",
                        zipimport.zipimporter.invalidate_caches)
    archive = tmp_path / "bundle.zip"
    _zip_with(archive, "VALUE = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    for name in ("zipped_for_test", "zipped_for_test.value", "zipped_for_test.extra"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import zipped_for_test.value as value

    assert value.VALUE == 1
    reads = []
    original_read = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory",
                        lambda path: reads.append(path) or original_read(path))
    importlib.invalidate_caches()
    before = len(reads)
    assert before >= 2, "without the change every zip importer of the archive re-reads it"

    _reread_changed_archives_only()
    _reread_changed_archives_only()  # idempotent
    importlib.invalidate_caches()  # each importer's first call still reads
    reads.clear()
    for _ in range(3):
        importlib.invalidate_caches()
    assert reads == [], reads

    # The archive rewritten with one more module (another size and time): read again.
    import zipfile

    time.sleep(0.01)
    with zipfile.ZipFile(archive, "a") as bundle:
        bundle.writestr("zipped_for_test/extra.py", "EXTRA = 2\n")
    importlib.invalidate_caches()
    assert reads and all(r == str(archive) for r in reads), reads
    from zipped_for_test import extra

    assert extra.EXTRA == 2


@pytest.mark.timeout(120)
def test_a_task_function_prepares_its_python_worker_and_the_driver_is_left_alone(spark):
    """In a Spark task, prepare_python_worker freezes the objects alive (so
    PySpark's collection after the task skips them) and, before Python 3.12,
    changes how zip importers re-read; called outside a task it changes
    nothing."""
    import gc
    import sys
    import zipimport

    from dist_dl.core.pyworker import prepare_python_worker

    def worker_state(batches):  # nested: Spark ships it by value
        import gc
        import zipimport

        import pandas as pd

        from dist_dl.core.pyworker import prepare_python_worker

        for _ in batches:
            pass
        # A reused worker whose objects were frozen a minute ago or more gets
        # its periodic full collection from this call (everything unfrozen);
        # the call of the worker's next task freezes again.
        prepare_python_worker()
        prepare_python_worker()
        yield pd.DataFrame([{"frozen": gc.get_freeze_count(),
                             "zip": bool(getattr(zipimport.zipimporter.invalidate_caches,
                                                 "_dist_dl_rereads_changed_archives_only",
                                                 False))}])

    frozen_before = gc.get_freeze_count()
    prepare_python_worker()
    assert gc.get_freeze_count() == frozen_before
    rows = spark.range(2).repartition(2).mapInPandas(worker_state,
                                                     "frozen long, zip boolean").collect()
    assert len(rows) == 2 and all(r.frozen > 1000 for r in rows), rows
    assert all(r.zip for r in rows) == (sys.version_info < (3, 12)), rows
    assert not getattr(zipimport.zipimporter.invalidate_caches,
                       "_dist_dl_rereads_changed_archives_only", False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ["dist_dl.ensemble.task", "dist_dl.search.task",
                                    "dist_dl.prepare.images", "dist_dl.core.pyworker"])
def test_what_a_new_python_worker_imports_for_a_task_leaves_mlflow_out(module):
    """A task module is imported by every new Python worker (Spark starts
    them for a job and stops them after a minute idle). MLflow, with the
    databricks-sdk it imports, took 2.1 of the 2.6 s that importing the
    ensemble's task module took in one."""
    import subprocess
    import sys

    heavy = ("mlflow", "databricks.sdk", "tensorflow", "optuna")
    code = (f"import sys, {module}\n"
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"importing {module} imports {out.stdout.strip()}"


_PREPARE_IN_A_TASK = '''
import gc, json
from pyspark import TaskContext
from dist_dl.core.pyworker import prepare_python_worker

TaskContext._getOrCreate()   # what PySpark's worker does before a task's function
prepare_python_worker()
print(json.dumps({"frozen": gc.get_freeze_count()}))
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("switch", [None, "0"])
def test_the_python_worker_preparation_can_be_turned_off_by_its_environment_variable(switch):
    """In a task, prepare_python_worker freezes the worker's objects unless
    DIST_DL_PREPARE_PYTHON_WORKER=0 (spark.executorEnv on a cluster)."""
    import json
    import subprocess
    import sys

    from dist_dl.core.pyworker import SWITCH

    env = {k: v for k, v in os.environ.items() if k != SWITCH}
    if switch is not None:
        env[SWITCH] = switch
    done = subprocess.run([sys.executable, "-c", _PREPARE_IN_A_TASK], env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    frozen = json.loads(done.stdout.strip().splitlines()[-1])["frozen"]
    assert (frozen > 1000) == (switch is None), frozen


@pytest.mark.timeout(180)
def test_a_session_whose_py4j_call_was_interrupted_is_replaced(spark):
    """What the `spark` fixture does after a test ran past its timeout
    (tests/support/spark_reset.py): pytest-timeout's signal interrupts a py4j
    call half-way, and the next test gets a new session, with a JVM and
    connections of its own."""
    import signal

    import spark_reset

    from dist_dl.core.session import get_spark

    jvm = spark.sparkContext._jvm

    def interrupt(*_):
        raise TimeoutError("as pytest-timeout's signal would")

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Exception):  # py4j wraps what the handler raised
            jvm.java.lang.Thread.sleep(3000)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    old_jvm = spark.sparkContext._gateway.proc
    assert spark_reset.discard_session()
    assert old_jvm.poll() is not None
    fresh = get_spark("local[2]")
    assert fresh is not spark
    assert fresh.sparkContext._jvm.java.lang.Math.addExact(40, 2) == 42
    assert fresh.range(3).count() == 3
