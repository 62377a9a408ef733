"""A cluster of separate hosts on one machine, for tests: Linux network
namespaces, one per host, each with its own address on a bridge (its
interface named ``eth0``, as on cluster nodes), its own hostname and
``/etc/hosts`` (a UTS and a mount namespace), and a private ``/tmp`` (a tmpfs
in that mount namespace). The hosts share only one folder, which stands for
DBFS or a Unity Catalog volume, and the read-only software (this Python
environment, Java): as cluster nodes share a runtime image.

On it run a Spark standalone master and workers, started with PySpark's own
``spark-class``, and driver programs started by the tests.

Needs root (``ip netns``, ``unshare``, ``nsenter``, ``mount``). The root
network namespace gets no address on the bridge: the test process reaches
the hosts only by running commands inside them.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import re
from dataclasses import dataclass, field
from pathlib import Path

import jvm

SUBNET = "10.213.0"       # /24 on a bridge of the test's own; nothing else is routed there
SPARK_PORT = 7077
BASE_PARENT = "/var/tmp"


def unavailable_reason() -> str | None:
    """Why this machine cannot make the cluster, or None if it can."""
    if os.geteuid() != 0:
        return "the cluster of separate hosts needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"the cluster of separate hosts needs {tool!r} (iproute2 / util-linux)"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60)


@dataclass
class Host:
    """One host: a network namespace and a process that holds its mount and
    UTS namespaces; commands enter all three."""

    name: str
    netns: str
    address: str
    holder: subprocess.Popen | None = None
    procs: list = field(default_factory=list)

    def _enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-m", "-u", "--"]

    def _command(self, argv: list[str], cwd: str) -> list[str]:
        """``argv`` run on this host in ``cwd`` (created if missing)."""
        return [*self._enter(), "sh", "-c", 'mkdir -p "$0" && cd "$0" && exec "$@"', cwd, *argv]

    def popen(self, argv: list[str], env: dict, log: Path | None = None,
              cwd: str = "/tmp") -> subprocess.Popen:
        """Start ``argv`` on this host (in its own process group)."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(self._command(argv, cwd), env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if log is not None:
            out.close()
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], env: dict, timeout: float, cwd: str = "/tmp",
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host to its end; output captured. On timeout
        its whole process group is killed."""
        proc = subprocess.Popen(self._command(argv, cwd), env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise TimeoutError(f"{argv[:3]} on {self.name} did not end within {timeout:g} s\n"
                               f"stdout:\n{out[-4000:]}\nstderr:\n{err[-16000:]}")
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def read(self, path: str) -> str:
        """A file of this host's private file system (its /tmp), or ''."""
        result = subprocess.run([*self._enter(), "cat", path], capture_output=True, text=True,
                                timeout=30)
        return result.stdout


_READY = """
def ready(spark, slots=2, seconds=120):
    import time
    from dist_dl.core.session import task_slots
    deadline = time.time() + seconds
    while task_slots(spark) < slots:
        assert time.time() < deadline, "the executors did not register"
        time.sleep(0.5)
    return spark
"""


def _software_under_tmp() -> list[str]:
    """The folders under /tmp that the hosts' processes need: this checkout,
    the virtual environment, its base Python, PYTHONPATH entries (outermost
    only)."""
    roots = {str(Path(__file__).resolve().parents[2]), sys.prefix, sys.base_prefix,
             str(Path(sys.executable).resolve().parent)}
    roots |= {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    under = sorted({os.path.realpath(r) for r in roots if os.path.realpath(r).startswith("/tmp/")})
    return [r for r in under if not any(r.startswith(o + "/") for o in under if o != r)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Remove the namespaces and bridges of clusters whose test process is
    gone (killed by a timeout before its tear-down ran); their names."""
    removed = []
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(r"ddl(\d+)-\w+", name)
        if m and not _alive(int(m.group(1))):
            for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    for m in re.finditer(r"^\d+: (ddlb(\d+))[:@]", _sh("ip", "-o", "link", check=False).stdout,
                         re.M):
        if not _alive(int(m.group(2))):
            _sh("ip", "link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    for folder in Path(BASE_PARENT).glob("dist_dl-hosts-*"):
        owner = folder.name.rsplit("-", 1)[-1]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def base_folder() -> Path:
    """This process's cluster folder: outside /tmp (each host has its own)."""
    return Path(BASE_PARENT) / f"dist_dl-hosts-{os.getpid()}"


def kept_logs_folder(test: str) -> Path:
    """Where a failed test keeps the hosts' logs: under ``runs/tests/host-logs``
    of the checkout (untracked), or ``DIST_DL_TEST_LOGS``; one folder per test
    and moment."""
    root = Path(os.environ.get("DIST_DL_TEST_LOGS")
                or Path(__file__).resolve().parents[2] / "runs" / "tests" / "host-logs")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test.split("::")[-1])[:120]
    return root / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{name}"


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class HostCluster:
    """A Spark standalone cluster on separate hosts: ``master``, ``worker1``,
    ``worker2`` (one core each) and ``driver``.

    Args:
        base: A folder outside ``/tmp`` (every host has its own ``/tmp``);
            ``base/shared`` is the shared folder, ``base/logs`` the daemons' logs.
        worker_cores: Cores each Spark worker offers.
        worker_memory: Memory each Spark worker offers to executors.
    """

    HOSTS = ("master", "worker1", "worker2", "driver")

    def __init__(self, base: Path, worker_cores: int = 1, worker_memory: str = "3g",
                 own_hostnames: bool = True):
        self.base = Path(base)
        self.shared = self.base / "shared"
        self.logs = self.base / "logs"
        # Names carry this process's id, so a later run can sweep what a run
        # that was killed (a test timeout ends pytest at once) left behind.
        pid = os.getpid()
        self.bridge = f"ddlb{pid}"
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.own_hostnames = own_hostnames
        self.hosts = {name: Host(name, f"ddl{pid}-{name}", f"{SUBNET}.{i + 2}")
                      for i, name in enumerate(self.HOSTS)}
        self._veth = {name: f"v{pid}{i}" for i, name in enumerate(self.HOSTS)}
        self.master_url = f"spark://{self.hosts['master'].address}:{SPARK_PORT}"
        self._spark_procs: list[tuple[Host, subprocess.Popen]] = []
        self._driver_runs = 0

    # ------------------------------------------------------------- set-up

    def start(self) -> "HostCluster":
        sweep()
        self.shared.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        hosts_file = self.base / "etc-hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
            f"{h.address} {h.name}\n" for h in self.hosts.values()))
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "up")
        for host in self.hosts.values():
            self._make_host(host, hosts_file)
        self._start_spark()
        return self

    def _make_host(self, host: Host, hosts_file: Path) -> None:
        outside, inside = f"{self._veth[host.name]}h", f"{self._veth[host.name]}c"
        _sh("ip", "netns", "add", host.netns)
        _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _sh("ip", "link", "set", outside, "master", self.bridge, "up")
        _sh("ip", "link", "set", inside, "netns", host.netns)
        _sh("ip", "-n", host.netns, "link", "set", inside, "name", "eth0")
        _sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
        _sh("ip", "-n", host.netns, "link", "set", "lo", "up")
        # The holder keeps the host's mount and UTS namespaces alive: its own
        # hostname and /etc/hosts, and a /tmp no other host sees.
        naming = (f"hostname {host.name} && mount --bind {hosts_file} /etc/hosts && "
                  if self.own_hostnames else "")
        # The software (this checkout, its virtual environment, the Python it
        # was made from) is on every host, as a runtime image is on cluster
        # nodes: where it lives under /tmp (a clone in /tmp), it is bound
        # back into the host's empty /tmp from a view of the real one.
        orig = self.base / f"orig-tmp-{host.name}"
        orig.mkdir(parents=True, exist_ok=True)
        keep = "".join(f"mkdir -p {p} && mount --bind {orig}{p[len('/tmp'):]} {p} && "
                       for p in _software_under_tmp())
        setup = (f"{naming}mount --bind /tmp {orig} && "
                 f"mount -t tmpfs -o size=8g,mode=1777 tmpfs /tmp && {keep}"
                 f"umount {orig} && echo ready && exec sleep infinity")
        host.holder = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts",
             "--propagation", "private", "--", "sh", "-c", setup],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = host.holder.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"host {host.name} did not start: {host.holder.stderr.read()}")

    def env(self, host: str, **extra: str) -> dict:
        """The environment of a process on ``host``: this machine's, less
        what points at the test process's own places, plus the host's
        address for Spark."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_", "SPARK_", "TMP", "HOROVOD_"))
               # the test run's MLflow store is in this machine's /tmp (conftest)
               and k != "MLFLOW_TRACKING_URI"}
        import pyspark

        env.update(HOME="/tmp/home", SPARK_HOME=str(Path(pyspark.__file__).parent),
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP=self.hosts[host].address,
                   SPARK_LOCAL_HOSTNAME=self.hosts[host].address,
                   TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **jvm.driver_env())
        env.update(extra)
        return env

    def _start_spark(self) -> None:
        import pyspark

        spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        master = self.hosts["master"]
        proc = master.popen([spark_class, "org.apache.spark.deploy.master.Master",
                             "--host", master.address, "--port", str(SPARK_PORT),
                             "--webui-port", "8080"],
                            env=self.env("master", **jvm.daemon_env()),
                            log=self.logs / "master.log")
        self._spark_procs.append((master, proc))
        self.wait_for_port(master, SPARK_PORT, 90)
        for name in ("worker1", "worker2"):
            host = self.hosts[name]
            proc = host.popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                               self.master_url, "--host", host.address,
                               "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                               "--webui-port", "8081", "--work-dir", "/tmp/spark-work"],
                              env=self.env(name, SPARK_WORKER_DIR="/tmp/spark-work",
                                           **jvm.daemon_env()),
                              log=self.logs / f"{name}.log")
            self._spark_procs.append((host, proc))
        deadline = time.time() + 90
        while time.time() < deadline:
            text = (self.logs / "master.log").read_text(errors="replace")
            if text.count("Registering worker") >= 2:
                return
            if any(p.poll() is not None for _, p in self._spark_procs):
                break
            time.sleep(0.5)
        raise RuntimeError("the Spark workers did not register with the master:\n"
                           + self.daemon_logs())

    def wait_for_port(self, host: Host, port: int, seconds: float) -> None:
        probe = ("import socket,sys,time\n"
                 "d=time.time()+float(sys.argv[3])\n"
                 "while time.time()<d:\n"
                 "    s=socket.socket()\n"
                 "    if s.connect_ex((sys.argv[1],int(sys.argv[2])))==0: sys.exit(0)\n"
                 "    s.close(); time.sleep(0.2)\n"
                 "sys.exit(1)\n")
        result = host.run([sys.executable, "-c", probe, host.address, str(port), str(seconds)],
                          env=self.env(host.name), timeout=seconds + 10)
        if result.returncode != 0:
            raise RuntimeError(f"nothing listens on {host.address}:{port} on {host.name}:\n"
                               + self.daemon_logs())

    # -------------------------------------------------------------- use

    def driver_script(self, code: str, timeout: float) -> str:
        """``code`` with the globals of a driver program (``run_driver``)."""
        # A program still running 15 s before its timeout prints every
        # thread's stack to stderr, which the timeout error quotes: a hang
        # seen once in CI (train_distributed after its last epoch) left
        # nothing to go on.
        prelude = (f"MASTER = {self.master_url!r}\nSHARED = {str(self.shared)!r}\n"
                   f"import faulthandler as _fh, sys as _sys\n"
                   f"_fh.dump_traceback_later({max(timeout - 15, 1)!r}, file=_sys.stderr)\n"
                   + _READY)
        return prelude + textwrap.dedent(code)

    def run_driver(self, code: str, timeout: float = 600, env: dict | None = None) -> dict:
        """Run a Python driver program on the ``driver`` host (its working
        directory in the driver's private /tmp) and return the JSON object it
        prints on its last line of stdout.

        The program gets ``MASTER`` (the Spark master URL), ``SHARED`` (the
        shared folder) and ``ready(spark)`` (waits for both executors) as
        globals.
        """
        self._driver_runs += 1
        log = self.logs / f"driver-program-{self._driver_runs:02d}.log"
        try:
            result = self.hosts["driver"].run(
                [sys.executable, "-c", self.driver_script(code, timeout)],
                env=self.env("driver", **(env or {})), timeout=timeout, cwd="/tmp/driver")
        except TimeoutError as exc:
            log.write_text(f"{code}\n--- timed out:\n{exc}")
            raise
        log.write_text(f"{code}\n--- exit {result.returncode}\n--- stdout:\n{result.stdout}"
                       f"\n--- stderr:\n{result.stderr}")
        if result.returncode != 0:
            raise AssertionError(f"the driver program failed (exit {result.returncode}):\n"
                                 f"stdout:\n{result.stdout[-6000:]}\n"
                                 f"stderr:\n{result.stderr[-12000:]}\n"
                                 f"executors:\n{self.executor_logs()}")
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise AssertionError(f"the driver program printed no JSON result:\n{result.stdout}")
        out = json.loads(lines[-1])
        out["_stdout"], out["_stderr"] = result.stdout, result.stderr
        return out

    @contextlib.contextmanager
    def loopback_hostnames(self, names=("worker1", "worker2")):
        """On each host in ``names``, its own name resolves to 127.0.1.1 (as
        Debian's installer writes /etc/hosts) for the duration of the block."""
        mounted = []
        try:
            for name in names:
                host = self.hosts[name]
                text = "127.0.0.1 localhost\n" + f"127.0.1.1 {name}\n" + "".join(
                    f"{h.address} {h.name}\n" for h in self.hosts.values() if h.name != name)
                path = self.base / f"etc-hosts-{name}-loopback"
                path.write_text(text)
                _sh("nsenter", "-t", str(host.holder.pid), "-m", "--", "mount", "--bind",
                    str(path), "/etc/hosts")
                mounted.append(host)
            yield
        finally:
            for host in mounted:
                _sh("nsenter", "-t", str(host.holder.pid), "-m", "--", "umount", "/etc/hosts",
                    check=False)

    def daemon_logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.logs.glob("*.log")))

    def executor_logs(self, tail: int = 3000) -> str:
        """The newest executors' stderr on each worker host (private /tmp)."""
        out = []
        for name in ("worker1", "worker2"):
            host = self.hosts[name]
            listing = host.run(["sh", "-c", "ls -1dt /tmp/spark-work/*/* 2>/dev/null | head -3"],
                               env=self.env(name), timeout=30).stdout.split()
            for folder in listing:
                out.append(f"--- {name}:{folder}/stderr\n{host.read(folder + '/stderr')[-tail:]}")
        return "\n".join(out)

    def keep_logs(self, folder: Path) -> Path:
        """Copy every host's logs into ``folder`` (outside the cluster's own
        folder, which goes at tear-down): the daemons' logs and the driver
        programs' whole output (``base/logs``), and from each host's private
        /tmp its Spark executors' stdout and stderr and any ``*.log``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.logs.is_dir():
            shutil.copytree(self.logs, folder / "shared-logs", dirs_exist_ok=True)
        find = ("cd /tmp && find . -xdev -type f \\( -name stdout -o -name stderr -o -name '*.log' "
                "-o -name '*.out' \\) -size -64M -print0 | tar --null -T - -cf - 2>/dev/null")
        for host in self.hosts.values():
            if host.holder is None or host.holder.poll() is not None:
                continue
            done = subprocess.run([*host._enter(), "sh", "-c", find], capture_output=True,
                                  timeout=120)
            if done.stdout:
                target = folder / host.name
                target.mkdir(exist_ok=True)
                subprocess.run(["tar", "-xf", "-", "-C", str(target)], input=done.stdout,
                               check=False, timeout=120)
        return folder

    def processes(self, host: str) -> list[int]:
        """Pids of the processes in ``host``'s network namespace, less its holder."""
        h = self.hosts[host]
        pids = _sh("ip", "netns", "pids", h.netns, check=False).stdout.split()
        return [int(p) for p in pids if int(p) != h.holder.pid]

    # ------------------------------------------------------------ tear-down

    def stop(self) -> None:
        """Stop every process on every host, remove the namespaces, the
        bridge and the folders. Safe to call on a half-started cluster."""
        for host in self.hosts.values():
            for proc in host.procs:
                _kill_group(proc.pid, signal.SIGTERM)
        deadline = time.time() + 10
        for host in self.hosts.values():
            for proc in host.procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    pass
        for host in self.hosts.values():
            # Whatever is left in the namespace (executors, Python workers,
            # Horovod workers of a driver program): killed outright.
            if host.holder is not None:
                for pid in self.processes(host.name):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _kill_group(host.holder.pid, signal.SIGKILL)
                host.holder.wait(timeout=10)
            _sh("ip", "netns", "del", host.netns, check=False)
        _sh("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.base, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Namespaces or links of this cluster still present (none after stop)."""
        names = _sh("ip", "netns", "list", check=False).stdout
        links = _sh("ip", "-o", "link", check=False).stdout
        return [n for n in (h.netns for h in self.hosts.values()) if n in names] + \
            ([self.bridge] if self.bridge in links else [])
