"""The fork server (dist_dl.launch.fork.client): a forked worker is the
process a new interpreter would be, the server is reused and replaced by
its import key, nothing outlives the process that launched it, and an
executor's one server serves its Python workers (its own user's only) and
ends with the executor."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from dist_dl.launch.fork import client as forkserver
from dist_dl.launch.core.worker import launcher_path_env
from waits import left_after

pytestmark = pytest.mark.profile_subset_164


@pytest.fixture(autouse=True)
def own_server():
    """Each test starts with no server in this process and leaves none."""
    forkserver.shutdown()
    yield
    forkserver.shutdown()


SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")


def _env(**extra) -> dict:
    # PYTHONPATH: a new interpreter finds the probe module as the forked one does.
    return {**os.environ, **launcher_path_env(), "PYTHONUNBUFFERED": "1", "PYTHONPATH": SUPPORT,
            **extra}


def _read(proc) -> tuple[str, str]:
    return proc.stdout.read().decode(), proc.stderr.read().decode()


def _state(path) -> dict:
    with open(path) as f:
        return json.load(f)


@pytest.mark.timeout(120)
def test_a_forked_worker_is_the_process_a_new_interpreter_would_be(tmp_path):
    env = _env(PROBE_SETTING="forked")
    forked = forkserver.start("forked_probe", [str(tmp_path / "forked.json"), "3"], env, "horovod")
    assert isinstance(forked, forkserver.ForkedProcess)
    assert forked.wait(60) == 3
    out, err = _read(forked)
    assert out == f"out {forked.pid}\n" and err == f"err {forked.pid}\n"
    new = subprocess.Popen([sys.executable, "-m", "forked_probe", str(tmp_path / "new.json"), "3"],
                           env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, start_new_session=True)
    assert new.wait(60) == 3
    _read(new)
    a, b = _state(tmp_path / "forked.json"), _state(tmp_path / "new.json")
    # Its own session and process group, like start_new_session=True.
    assert a["sid"] == a["pgid"] == a["pid"]
    for field in ("cwd", "main", "stdin"):
        assert a[field] == b[field], field
    assert a["argv"] == [str(tmp_path / "forked.json"), "3"]
    assert a["env"] == b["env"]
    # ps names the worker's command, not the server's.
    assert a["cmdline"] == b["cmdline"].replace("new.json", "forked.json")
    assert "-m forked_probe" in a["cmdline"] and "_fork_server" not in a["cmdline"]


@pytest.mark.timeout(120)
def test_forked_siblings_draw_different_random_numbers_and_a_signal_is_the_exit_code(tmp_path):
    procs = [forkserver.start("forked_probe", [str(tmp_path / f"{i}.json"), "sleep"], _env(),
                              "horovod") for i in range(2)]
    assert all(isinstance(p, forkserver.ForkedProcess) for p in procs)
    for proc in procs:
        assert proc.stdout.readline().decode().startswith("out ")
    assert _state(tmp_path / "0.json")["numpy"] != _state(tmp_path / "1.json")["numpy"]
    assert procs[0].poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        procs[0].wait(0.2)
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL


def _servers() -> list:
    return list(forkserver._servers.values())


@pytest.mark.timeout(180)
def test_one_server_per_import_key_kept_side_by_side_and_none_ended_under_running_workers(
        tmp_path, monkeypatch):
    monkeypatch.setattr(forkserver, "MAX_SERVERS", 2)
    first = forkserver.start("forked_probe", [str(tmp_path / "a.json"), "sleep"], _env(), "horovod")
    [server] = _servers()
    # Per-job and per-rank variables are not part of the key: the same server.
    second = forkserver.start("forked_probe", [str(tmp_path / "b.json"), "0"],
                              _env(HOROVOD_RANK="1", TF_CONFIG="{}", _HOROVOD_SECRET_KEY="k",
                                   NCCL_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES=""),
                              "horovod")
    assert _servers() == [server] and second.wait(60) == 0
    # Another key: a server of its own beside the first, whose worker runs on.
    other = forkserver.start("forked_probe", [str(tmp_path / "c.json"), "0"],
                             _env(PROBE_SETTING="other"), "horovod")
    assert other.wait(60) == 0 and first.poll() is None
    server, other_server = _servers()
    assert _state(tmp_path / "c.json")["env"]["PROBE_SETTING"] == "other"
    # Back to the first key: its server again, nothing imported anew.
    again = forkserver.start("forked_probe", [str(tmp_path / "d.json"), "0"], _env(), "horovod")
    assert again.wait(60) == 0 and _servers() == [other_server, server]
    # A third key beyond MAX_SERVERS ends the least recently used idle server.
    third = forkserver.start("forked_probe", [str(tmp_path / "e.json"), "0"],
                             _env(PROBE_SETTING="third"), "horovod")
    assert third.wait(60) == 0 and _servers()[0] is server and len(_servers()) == 2
    assert not psutil.pid_exists(other_server._proc.pid)
    # A fourth while every kept server's workers run: a new interpreter, none ended.
    third_server = _servers()[1]
    busy = forkserver.start("forked_probe", [str(tmp_path / "f.json"), "sleep"],
                            _env(PROBE_SETTING="third"), "horovod")
    assert forkserver.start("forked_probe", [str(tmp_path / "g.json"), "0"],
                            _env(PROBE_SETTING="fourth"), "horovod") is None
    assert _servers() == [server, third_server]
    for worker in (first, busy):
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)


@pytest.mark.timeout(120)
def test_a_launch_before_and_one_after_the_launcher_imports_tensorflow_share_a_server(tmp_path):
    pytest.importorskip("tensorflow")
    # What TensorFlow's import writes into os.environ (TF2_BEHAVIOR,
    # TPU_ML_PLATFORM) is what the server's own import writes: no part of the key.
    written = ("TF2_BEHAVIOR", "TPU_ML_PLATFORM")
    before = {k: v for k, v in _env().items() if k not in written}
    first = forkserver.start("forked_probe", [str(tmp_path / "a.json"), "0"], before, "tensorflow")
    assert first.wait(60) == 0
    [server] = _servers()
    after = {**before, "TF2_BEHAVIOR": "1", "TPU_ML_PLATFORM": "Tensorflow"}
    second = forkserver.start("forked_probe", [str(tmp_path / "b.json"), "0"], after, "tensorflow")
    assert second.wait(60) == 0 and _servers() == [server]
    # What an import reads still makes a key of its own.
    other = forkserver.start("forked_probe", [str(tmp_path / "c.json"), "0"],
                             {**after, "PROBE_SETTING": "other"}, "tensorflow")
    assert other.wait(60) == 0 and len(_servers()) == 2


@pytest.mark.timeout(60)
def test_workers_that_use_a_gpu_or_are_told_not_to_start_as_new_interpreters(tmp_path, monkeypatch):
    args = [str(tmp_path / "p.json"), "0"]
    assert forkserver.start("forked_probe", args, _env(CUDA_VISIBLE_DEVICES="0"), "horovod") is None
    assert forkserver.start("forked_probe", args, _env(DIST_DL_WORKER_GPUS="1"), "horovod") is None
    assert forkserver.start("forked_probe", args, _env(DIST_DL_FORK_WORKERS="0"), "horovod") is None
    assert _servers() == []


@pytest.mark.timeout(120)
def test_an_idle_server_exits_and_the_next_launch_starts_another(tmp_path, monkeypatch):
    monkeypatch.setattr(forkserver, "IDLE_SECONDS", 1.0)
    assert forkserver.start("forked_probe", [str(tmp_path / "a.json"), "0"], _env(),
                            "horovod").wait(60) == 0
    [server] = _servers()
    assert left_after(lambda: [server._proc.pid] if server._proc.poll() is None else [], 30) == []
    assert forkserver.start("forked_probe", [str(tmp_path / "b.json"), "0"], _env(),
                            "horovod").wait(60) == 0
    assert _servers() and server not in _servers()


@pytest.mark.timeout(120)
def test_a_killed_launcher_takes_its_server_and_workers_with_it(tmp_path):
    # Its job's folder (a mkdtemp of the local backend) too: nobody else
    # would remove it.
    job = tmp_path / "dist_dl-job"
    job.mkdir()
    program = textwrap.dedent(f"""
        import os, sys, time
        from dist_dl.launch.fork import client as forkserver
        from dist_dl.launch.core.worker import launcher_path_env
        env = {{**os.environ, **launcher_path_env()}}
        worker = forkserver.start("forked_probe", [{str(job / 'w.json')!r}, "sleep"], env,
                                  "horovod")
        worker.stdout.readline()
        [server] = forkserver._servers.values()
        print(worker.pid, server._proc.pid, flush=True)
        time.sleep(600)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        worker, server = map(int, launcher.stdout.readline().split())
        assert psutil.pid_exists(worker) and psutil.pid_exists(server)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
        alive = lambda: [p for p in (worker, server)  # noqa: E731
                         if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert left_after(alive, 20) == []
        assert not job.exists(), "the killed launcher's job folder was left"
    finally:
        launcher.kill()


# A Python worker of an executor (``_executor_daemon`` stood in by OWNER):
# connects to the executor's server for its key, forks a sleeping worker,
# prints the worker's and the server's pids, and waits to be killed.
_CLIENT = """
import os, sys, time
from dist_dl.launch.fork import client as forkserver
from dist_dl.launch.core.worker import launcher_path_env
env = {**os.environ, **launcher_path_env()}
owner, out = int(sys.argv[1]), sys.argv[2]
address = forkserver._address(owner, forkserver._key(env, []))
if len(sys.argv) > 3:  # another user, at this user's server's address
    os.setuid(int(sys.argv[3]))
try:
    server = forkserver._Server(forkserver._import_env(env), [], owner, address)
except OSError as exc:
    print("refused", exc, flush=True)
    sys.exit(0)
worker = server.fork("forked_probe", [out, "sleep"], env)
worker.stdout.readline()
print(worker.pid, server.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(180)
def test_an_executors_server_serves_its_python_workers_and_ends_with_the_executor(tmp_path):
    owner = subprocess.Popen(["sleep", "600"])  # the executor's PySpark daemon
    clients = []

    def client(name, *user):
        proc = subprocess.Popen([sys.executable, "-c", _CLIENT, str(owner.pid),
                                 str(tmp_path / name), *user], stdout=subprocess.PIPE,
                                text=True, env=_env())
        clients.append(proc)
        return proc

    def running(pids):
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]

    try:
        first, second = client("a.json"), client("b.json")
        first_worker, server = map(int, first.stdout.readline().split())
        second_worker, second_server = map(int, second.stdout.readline().split())
        # One server for both, in a session of its own, ending with OWNER.
        assert second_server == server
        command = psutil.Process(server).cmdline()
        assert command[2] == "dist_dl.launch.fork._server" and command[-1] == str(owner.pid)
        # A process of another user is not served.
        stranger = client("c.json", "65534")
        assert stranger.stdout.readline().startswith("refused"), "another user was served"
        # A Python worker that dies takes its own worker with it, not the
        # server or the other Python worker's.
        first.kill()
        first.wait(30)
        assert left_after(lambda: running([first_worker]), 20) == []
        assert running([server, second_worker]) == [server, second_worker]
        # The executor's end ends the server and what it still runs.
        owner.kill()
        owner.wait(30)
        assert left_after(lambda: running([server, second_worker]), 20) == []
    finally:
        for proc in [*clients, owner]:
            proc.kill()
            proc.wait(30)


# A Python worker whose jobs' folders (ROOT/dist_dl-*, a barrier task's
# mkdtemp) outlive it: one job's worker has ended, the other's still runs.
_LEAVING_CLIENT = """
import os, sys, time
from dist_dl.launch.fork import client as forkserver
from dist_dl.launch.core.worker import launcher_path_env
env = {**os.environ, **launcher_path_env()}
owner, root, jobs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
server = forkserver._Server(forkserver._import_env(env), [], owner,
                            forkserver._address(owner, forkserver._key(env, [])))
pids = []
for job in jobs:
    worker = server.fork("forked_probe", [os.path.join(root, job, "w.json"),
                                          "sleep" if "running" in job else "0"], env)
    worker.stdout.readline()
    if "running" not in job:
        assert worker.wait(60) == 0
    pids.append(worker.pid)
print(*pids, flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_gone_python_workers_job_folders_go_whether_its_workers_ran_or_had_ended(tmp_path):
    # A cancelled Spark task's Python worker is SIGKILLed by its executor:
    # while its workers still run, or after they ended and before it removed
    # its job's folder itself. Either way nobody else would remove it.
    owner = subprocess.Popen(["sleep", "600"])
    jobs = ["dist_dl-torch-ended", "dist_dl-torch-running", "dist_dl-torch-other"]
    for job in jobs:
        (tmp_path / job).mkdir()
    leaving = subprocess.Popen([sys.executable, "-c", _LEAVING_CLIENT, str(owner.pid),
                                str(tmp_path), *jobs[:2]], stdout=subprocess.PIPE, text=True,
                               env=_env())
    staying = subprocess.Popen([sys.executable, "-c", _LEAVING_CLIENT, str(owner.pid),
                                str(tmp_path), jobs[2]], stdout=subprocess.PIPE, text=True,
                               env=_env())
    try:
        leaving.stdout.readline()
        staying.stdout.readline()
        assert sorted(os.listdir(tmp_path)) == sorted(jobs)
        leaving.kill()
        leaving.wait(30)
        left = left_after(lambda: [j for j in jobs[:2] if (tmp_path / j).exists()], 20)
        assert left == [], f"a gone client's job folders were left: {left}"
        # Another Python worker's job, still running, keeps its folder.
        assert (tmp_path / jobs[2] / "w.json").exists()
    finally:
        for proc in (leaving, staying, owner):
            proc.kill()
            proc.wait(30)


@pytest.mark.timeout(180)
@pytest.mark.needs("tensorflow")
def test_the_server_imports_the_engines_framework_and_what_the_launcher_imported():
    program = ("import json, importlib.util, sys\n"
               "from dist_dl.launch.fork.client import preload_for\n"
               "before = {e: preload_for(e) for e in ('horovod', 'tensorflow')}\n"
               "told = preload_for('horovod', imported=['tensorflow'])\n"
               "import numpy, tensorflow\n"
               "after = preload_for('horovod')\n"
               "print(json.dumps([before, told, after,\n"
               "                  importlib.util.find_spec('horovod') is not None]))")
    # A hang's bound, not a pace: on two cores at load average 10 and more an
    # import of TensorFlow takes tens of seconds.
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=150, check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    before, told, after, horovod = json.loads(out.stdout.strip().splitlines()[-1])
    # Nothing imported yet: a Horovod job's server imports nothing heavy;
    # tf.distribute's always imports TensorFlow.
    assert before == {"horovod": [], "tensorflow": ["tensorflow"]}
    # What the job's driver imported, where the launcher is a Spark task.
    expected = ["tensorflow", "horovod.tensorflow"] if horovod else ["tensorflow"]
    assert told == expected and after == expected
    # torch before TensorFlow (the order of the imports matters: client._FRAMEWORKS).
    assert forkserver.preload_for("torch", imported=["tensorflow"]) == \
        [name for name in ("torch", "tensorflow") if importlib.util.find_spec(name)]


@pytest.mark.timeout(120)
def test_without_setproctitle_workers_start_as_new_interpreters(tmp_path):
    # A server whose workers could not take their own command line is not used.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "setproctitle.py").write_text("raise ImportError('not installed here')\n")
    # First on the path the server takes from its launcher.
    env = _env(DIST_DL_SYS_PATH=json.dumps([str(blocker)] + [p for p in sys.path if p]))
    assert forkserver.start("forked_probe", [str(tmp_path / "p.json"), "0"], env,
                            "horovod") is None
    assert _servers() == []


@pytest.mark.needs("horovod.tensorflow")
@pytest.mark.timeout(300)
def test_horovod_workers_on_spark_fork_from_their_executors_one_server(spark, capsys):
    import cloudpickle
    import tensorflow  # noqa: F401  (the driver's frameworks are what the servers import)

    import workers
    from dist_dl import HorovodRunner

    cloudpickle.register_pickle_by_value(workers)
    jobs = [HorovodRunner(np=2, spark=spark, driver_log_verbosity="all").run(
        workers.process_tree) for _ in range(2)]
    for job in jobs:
        assert sorted(w["rank"] for w in job) == [0, 1]
        for worker in job:
            # Forked by a server that imported the driver's framework and
            # Horovod's binding of it, started by a task's Python worker (this
            # job's or an earlier one's, PySpark may have ended it since) and
            # ending with the executor's PySpark daemon (its last argument).
            assert worker["server_cmdline"][1:3] == ["-m", "dist_dl.launch.fork._server"], worker
            assert worker["server_cmdline"][4] == "tensorflow,horovod.tensorflow", worker
            daemon = psutil.Process(int(worker["server_cmdline"][-1]))
            assert "pyspark.daemon" in " ".join(daemon.cmdline()), worker
    # The job's two tasks (two Python workers of local[2]'s one executor)
    # forked from one server, the executor's; the second job from it again.
    assert len({w["server"] for w in jobs[0] + jobs[1]}) == 1, jobs
    assert not {w["pid"] for w in jobs[0]} & {w["pid"] for w in jobs[1]}
    out = capsys.readouterr().out
    # Their output, prefixed as Horovod prefixes it.
    assert "[0]<stdout>:forked rank 0" in out and "[1]<stdout>:forked rank 1" in out


@pytest.mark.parametrize("engine", ["horovod", "tensorflow"])
@pytest.mark.timeout(300)
def test_the_drivers_switch_reaches_the_workers_on_spark_tasks(spark, monkeypatch, engine):
    import cloudpickle

    import workers
    from dist_dl import HorovodRunner, TFDistributeRunner

    cloudpickle.register_pickle_by_value(workers)
    runner = {"horovod": HorovodRunner, "tensorflow": TFDistributeRunner}[engine]
    forked = runner(np=2, spark=spark).run(workers.parent_command)
    assert forked[1:3] == ["-m", "dist_dl.launch.fork._server"], forked
    # DIST_DL_FORK_WORKERS=0 on the driver: its Spark tasks start new interpreters.
    monkeypatch.setenv("DIST_DL_FORK_WORKERS", "0")
    started = runner(np=2, spark=spark).run(workers.parent_command)
    assert "dist_dl.launch.fork._server" not in started, started
