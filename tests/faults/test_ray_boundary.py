"""The Ray that scalelab starts, as a user runs it: the embedded cluster of a real
`scalelab submit` (a subprocess), and the head of `submit --detach`. Every socket their
processes listen on is a loopback one, a client without the cluster's token is turned away,
and nothing of an embedded cluster outlives a driver killed with SIGKILL.

Only the processes of the cluster each test starts are looked at (the driver's process tree,
recorded while it runs; the head's temp dir): other people's Ray on the machine is none of
its business.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest
from faults.listeners import listeners_of, off_loopback

pytestmark = pytest.mark.slow  # each test starts a Ray: 10-60 s on 2 busy cores

REPO = Path(__file__).resolve().parents[2]
TEST_JOBS = REPO / "tests" / "orchestrator"  # jobs_for_tests.sleepy
TRIALS = 2


class Driver:
    """`scalelab submit` of a sweep whose trials sleep, and the processes it started."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.seen: dict[int, psutil.Process] = {}  # every process of its tree, ever
        self.cmdlines: dict[int, str] = {}  # theirs, read while they ran

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for p in procs:
            if p.pid not in self.seen:
                self.seen[p.pid] = p
                self.cmdlines[p.pid] = _cmdline(p)
        return procs

    def trials_running(self) -> int:
        return sum(_cmdline(p).startswith("ray::scalelab-trial") for p in self.tree())

    def wait_for_trials(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.trials_running() < TRIALS:
            assert self.proc.poll() is None, f"the driver exited: {self.proc.returncode}"
            assert time.monotonic() < deadline, "the trials did not start"
            time.sleep(0.3)

    def alive(self) -> list[psutil.Process]:
        return _running(self.seen.values())


def _remove_ray_dirs(cmdlines: Iterable[str]) -> None:
    """Delete the private Ray temp dirs (their logs) that watchdogs among these were given."""
    for cmdline in cmdlines:
        args = cmdline.split(" ")
        if "scalelab.orchestrator.backends.watchdog" in args and "--dir" in args:
            shutil.rmtree(args[args.index("--dir") + 1], ignore_errors=True)


def _running(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those still running (psutil.Process notices a reused pid), zombies aside."""
    out = []
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(arg.strip() for arg in p.cmdline() if arg.strip())  # Ray pads titles
    except psutil.Error:
        return ""


@contextmanager
def submitted(
    tmp_path: Path,
    empty_store: Callable[[Path], str],
    job: str = "jobs_for_tests:sleepy",
    trials: int = TRIALS,
) -> Iterator[Driver]:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"""
name: ray-boundary
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512}}
grid:
  seed: {list(range(trials))}
backend: {{concurrency: 2, max_retries: 0, cpus_per_trial: 0.5}}
""")
    empty_store(tmp_path / "home" / "mlflow.db")  # its creation is not what is looked at
    env = {
        **os.environ,
        "SCALELAB_HOME": str(tmp_path / "home"),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(TEST_JOBS)]),
        "SCALELAB_TEST_SLEEP": "60",  # the trials outlive the test's look at them
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                "RAY_AUTH_TOKEN_PATH"):  # fmt: skip
        env.pop(var, None)
    cmd = [sys.executable, "-m", "scalelab.cli.main", "submit", str(sweep),
           "--job", job, "--no-summary"]  # fmt: skip
    log = open(tmp_path / "driver.log", "w")  # closed in the finally below
    driver = Driver(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        yield driver
    finally:
        driver.tree()
        if driver.proc.poll() is None:
            driver.proc.send_signal(signal.SIGINT)  # Ctrl-C: Ray shuts its cluster down
            try:
                driver.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                driver.proc.kill()
        deadline = time.monotonic() + 15  # the watchdog ends the rest, then itself
        while driver.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in driver.alive():  # whatever is left: this test's processes only
            p.kill()
        _remove_ray_dirs(driver.cmdlines.values())
        log.close()


def test_every_socket_of_a_real_sweep_listens_on_loopback_only(tmp_path: Path, empty_store):
    """The default job (DeepSpeed training) on the embedded Ray: Ray's servers and the
    trials' own (the process group's store, gloo) are all on loopback, from start to end."""
    listening: dict[tuple[int, str], set[tuple[str, int]]] = {}
    # one trial opens every kind of server a trial has (its process group's store, gloo)
    with submitted(
        tmp_path, empty_store, job="scalelab.jobs.training.train:run", trials=1
    ) as driver:
        deadline = time.monotonic() + 300
        while driver.proc.poll() is None:  # agents, workers and trials come and go
            for key, socks in listeners_of(driver.tree()).items():
                listening.setdefault(key, set()).update(socks)
            assert time.monotonic() < deadline, "the sweep did not finish"
            time.sleep(0.3)
        log = (tmp_path / "driver.log").read_text()
        assert driver.proc.returncode == 0, log[-2000:]
    assert "RAY_AUTH_MODE=disabled to opt out" not in log  # Ray's advice against the token
    trial = "ray::scalelab-trial"  # its task's name: scalelab-trial:<trial id>:<attempt>
    names = {trial if name.startswith(trial) else name for _, name in listening}
    # not vacuous: the GCS, the raylet, the agents and the trials' workers were all seen
    for expected in ("gcs_server", "raylet", "ray::DashboardAgent", "ray::scalelab-trial"):
        assert expected in names, f"no listening {expected} among {sorted(names)}"
    assert not off_loopback(listening), off_loopback(listening)


def _session_dir(driver: Driver) -> Path:
    for p in driver.tree():
        for arg in p.cmdline() if p.name() == "gcs_server" else []:
            if arg.startswith("--session-dir="):
                return Path(arg.split("=", 1)[1])
    raise AssertionError("no gcs_server with --session-dir in the driver's tree")


def _port(session: Path, name: str) -> int:
    (path,) = session.glob(f"{name}_*")  # Ray writes one file per port and node
    return int(path.read_text())


def _http_status(url: str) -> int:
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_cluster_turns_away_a_client_without_its_token_and_dies_with_its_driver(
    tmp_path: Path, empty_store
):
    """One sweep's cluster (started once: 30-60 s on 2 busy cores) for both: a client
    without the cluster's token is refused while the trials run, then the driver is killed
    with SIGKILL and nothing of the cluster outlives it."""
    import grpc

    from scalelab.orchestrator.backends.embedded import SINGLE_NODE, scoped_environ

    with scoped_environ(SINGLE_NODE):  # Ray's first import here fixes its mode for later tests
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    # a bystander carrying another cluster's mark: whoever cleans up must leave it alone
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "SCALELAB_RAY_SESSION": "someone-elses-cluster"},
    )
    try:
        with submitted(tmp_path, empty_store) as driver:
            driver.wait_for_trials()
            session = _session_dir(driver)
            gcs = _port(session, "gcs_server_port")
            with grpc.insecure_channel(f"127.0.0.1:{gcs}") as channel:
                kv = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
                with pytest.raises(grpc.RpcError) as refused:
                    request = gcs_service_pb2.InternalKVKeysRequest(prefix=b"")
                    kv.InternalKVKeys(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
            # the job agent runs any entrypoint it is sent; the runtime-env agent installs
            # packages
            agent = _port(session, "dashboard_agent_listen_port")
            if agent > 0:  # -1: another Ray on the machine holds Ray's fixed 52365: no server
                assert _http_status(f"http://127.0.0.1:{agent}/api/job_agent/jobs/") == 401
            env_agent = _port(session, "runtime_env_agent_port")
            assert _http_status(f"http://127.0.0.1:{env_agent}/get_or_create_runtime_env") == 401
            assert driver.trials_running() == TRIALS  # the cluster itself kept working
            private = session.parent.parent  # <private>/ray/session_*
            _another_user_cannot_enter(private, session)

            # the agents have served the requests above: every server of the cluster is up
            before = {p.pid: _cmdline(p) or p.name() for p in driver.tree()}
            driver.proc.kill()
            driver.proc.wait()
            deadline = time.monotonic() + 10
            while driver.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            left = {p.pid: before.get(p.pid, p.name()) for p in driver.alive()}
            assert len(before) > 5, before  # GCS, raylet, agents, workers: a real cluster
            assert not left, f"{len(left)} of {len(before)} processes alive 10 s later: {left}"
            while private.exists() and time.monotonic() < deadline + 5:
                time.sleep(0.2)
            assert not private.exists(), "the private Ray folder outlived its driver"
        assert bystander.poll() is None, "a process of another cluster was killed"
    finally:
        bystander.kill()
        bystander.wait()


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    who = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
    return subprocess.run([*who, *cmd], capture_output=True, text=True, timeout=30)


def _another_user_cannot_enter(private: Path, session: Path) -> None:
    """As user nobody (issue 33, item 2: Ray makes its temp dir, session, logs and sockets
    0777; nobody listed 40 log files, renamed the token file and moved the raylet socket)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this check runs as root, with setpriv (util-linux), to act as nobody")
    assert _as_nobody("ls", "/").returncode == 0  # nobody can run commands at all
    for folder in (session / "logs", session / "sockets", session, session.parent, private):
        listed = _as_nobody("ls", str(folder))
        assert listed.returncode != 0 and "Permission denied" in listed.stderr, folder
    socket_path = session / "sockets" / "raylet"
    assert socket_path.exists()
    moved = _as_nobody("mv", str(socket_path), f"{socket_path}.moved")
    assert moved.returncode != 0 and socket_path.exists()
    token = private / "auth_token"
    assert _as_nobody("mv", str(token), f"{token}.moved").returncode != 0 and token.exists()
    assert private.stat().st_mode & 0o777 == 0o700 and private.name.startswith("scalelab-ray-")


def test_an_embedded_ray_that_would_listen_off_loopback_is_refused(tmp_path: Path):
    """Ray decides single-node mode when first imported: a process that imported it before
    scalelab could choose gets an error, not a cluster on the network (and none is left)."""
    code = """
import ray  # imported first, in cluster mode
from scalelab.orchestrator.backends.base import BackendError, ray_init
try:
    ray_init("local", embedded=True)
except BackendError as e:
    print("REFUSED:", e)
print("INITIALIZED:", ray.is_initialized())
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCALELAB_HOME": str(tmp_path)}
    for var in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(var, None)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    children: dict[int, psutil.Process] = {}
    cmdlines: dict[int, str] = {}
    while proc.poll() is None:  # what it starts, to check that nothing of it is left
        with suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                children.setdefault(child.pid, child)
                cmdlines.setdefault(child.pid, _cmdline(child))
        time.sleep(0.2)
    out = proc.stdout.read()
    assert "REFUSED: the embedded Ray came up on" in out and "not on 127.0.0.1" in out, out
    assert "INITIALIZED: False" in out, out
    deadline = time.monotonic() + 10  # its watchdog too, once it has found nothing to end
    while (left := _running(children.values())) and time.monotonic() < deadline:
        time.sleep(0.2)
    _remove_ray_dirs(cmdlines.values())
    assert not left, [c.name() for c in left]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_under(temp_dir: str) -> list[psutil.Process]:
    """A detached head's processes: those naming its temp dir, and their descendants."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in proc.info["cmdline"] or []):
            found[proc.pid] = proc
            with suppress(psutil.NoSuchProcess):
                found.update({c.pid: c for c in proc.children(recursive=True)})
    return list(found.values())


def _get_status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_head_of_submit_detach_listens_on_loopback_and_wants_its_token(tmp_path: Path):
    temp_dir = tempfile.mkdtemp(prefix="slr-", dir="/tmp")  # short: Ray's socket paths
    dashboard = f"http://127.0.0.1:{_free_port()}"
    env = {
        **os.environ,
        "SCALELAB_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(REPO),
        "SCALELAB_RAY_DASHBOARD": dashboard,
        "SCALELAB_RAY_PORT": str(_free_port()),
        "SCALELAB_RAY_START_ARGS": f"--temp-dir={temp_dir} --num-cpus=1 "
        f"--dashboard-agent-listen-port={_free_port()}",
    }
    for var in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(var, None)
    code = "from scalelab.orchestrator.detach import ensure_head; print(ensure_head())"
    try:
        started = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
        )
        assert started.returncode == 0, started.stderr[-2000:]
        time.sleep(2)  # the agents open their servers after the job server answers
        listening = listeners_of(_processes_under(temp_dir))
        names = {name for _, name in listening}
        for expected in ("gcs_server", "raylet", "ray::DashboardAgent"):
            assert expected in names, f"no listening {expected} among {sorted(names)}"
        assert not off_loopback(listening), off_loopback(listening)

        token = tmp_path / "home" / "ray" / "auth_token"
        assert token.stat().st_mode & 0o777 == 0o600
        version = f"{dashboard}/api/version"
        assert _get_status(version, {}) == 401  # the Jobs API runs any entrypoint it is sent
        bearer = {"Authorization": f"Bearer {token.read_text().strip()}"}
        assert _get_status(version, bearer) == 200
    finally:
        procs = _processes_under(temp_dir)
        for proc in procs:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow  # one real start of an embedded Ray
def test_an_embedded_ray_whose_node_starts_too_slowly_is_started_again(tmp_path: Path):
    """Ray gives a new node a fixed 30 s to register and then raises a bare Exception (seen
    on a loaded 2-core machine, in a driver's traceback). Waiting out those 30 s for real is
    too slow for the suite, so Ray's own error is raised in place of the first start; the
    second, real start must then come up, with a warning, and a start that keeps failing
    is one BackendError line."""
    code = """
from scalelab.orchestrator.backends import base
from scalelab.orchestrator.backends.embedded import SINGLE_NODE, scoped_environ
with scoped_environ(SINGLE_NODE):  # as ray_init imports it
    import ray._private.worker as worker
real, failures = worker.init, int(__import__("sys").argv[1])
def init(*args, **kwargs):
    global failures
    if failures:
        failures -= 1
        raise Exception("The current node timed out during startup. This could happen ...")
    return real(*args, **kwargs)
import ray
ray.init = init
try:
    print("OWNS:", base.ray_init("local", embedded=True))
    print("RESOURCES:", ray.cluster_resources().get("CPU", 0) > 0)
except base.BackendError as e:
    print("REFUSED:", e)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCALELAB_HOME": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    once, always = (
        subprocess.run([sys.executable, "-c", code, str(n)], env=env, capture_output=True,
                       text=True, timeout=180)
        for n in (1, 3)
    )  # fmt: skip
    assert "OWNS: True" in once.stdout and "RESOURCES: True" in once.stdout, once.stderr[-2000:]
    assert "starting it again (2 of 3)" in once.stderr, once.stderr[-2000:]
    assert "REFUSED: the embedded Ray did not start" in always.stdout, always.stderr[-2000:]
    assert "Traceback" not in always.stderr, always.stderr[-2000:]
