"""`scalelab ui` as another local user meets it: a real `scalelab ui` on 127.0.0.1 and a real
second user (`nobody`, through `setpriv`) who tries to change a FINISHED run through the UI's
REST API, as was done before the UI had a login (a tag set, a fake `val/loss` logged, the
run turned FAILED). Every write is refused and the run is unchanged, while the owner, with the
password `scalelab ui` keeps in the work directory, reads the pages and the runs
(docs/monitoring.md, docs/reliability.md: Security)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What nobody runs: one request, its HTTP status printed (no scalelab, no site-packages).
_REQUEST = """
import json, sys, urllib.error, urllib.request
url, body = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, data=body.encode(), method="POST",
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    who = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
    return subprocess.run([*who, *cmd], capture_output=True, text=True, timeout=60, cwd="/")


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "SCALELAB_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _finished_run(home: Path) -> str:
    """A FINISHED run with one `val/loss`, written as scalelab writes: to the sqlite store."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = client.create_experiment("ladder")
    run = client.create_run(exp, run_name="dense-nano")
    client.log_metric(run.info.run_id, "val/loss", 3.0, step=1)
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _wait_for(uri: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5):
                return
        except OSError:
            assert time.monotonic() < deadline, "the MLflow UI did not answer"
            time.sleep(0.5)


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30):
            return 200
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow  # mlflow's server takes 5-60 s to come up on 2 busy cores
def test_another_user_cannot_write_through_the_ui_and_its_owner_reads(tmp_path: Path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this check runs as root, with setpriv (util-linux), to act as nobody")
    home = tmp_path / "runs"
    home.mkdir()
    run_id = _finished_run(home)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab.cli.main", "ui", "--port", str(port)],
        env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(uri, proc)
        at_step_2 = {"step": 2, "timestamp": int(time.time() * 1000)}
        writes = {
            "runs/set-tag": {"run_id": run_id, "key": "owned", "value": "by nobody"},
            "runs/log-metric": {"run_id": run_id, "key": "val/loss", "value": 0.0, **at_step_2},
            "runs/update": {"run_id": run_id, "status": "FAILED"},
        }
        for api in ("api", "ajax-api"):  # the REST API, and the one the UI's pages call
            for route, body in writes.items():
                url = f"{uri}/{api}/2.0/mlflow/{route}"
                res = _as_nobody(sys.executable, "-I", "-c", _REQUEST, url, json.dumps(body))
                assert res.returncode == 0, res.stderr  # nobody reached the server
                assert res.stdout.strip() in {"401", "403"}, (url, res.stdout, res.stderr)

        from mlflow import MlflowClient

        run = MlflowClient(f"sqlite:///{home / 'mlflow.db'}").get_run(run_id)
        assert run.info.status == "FINISHED"
        assert "owned" not in run.data.tags
        history = MlflowClient(f"sqlite:///{home / 'mlflow.db'}").get_metric_history(
            run_id, "val/loss"
        )
        assert [(m.step, m.value) for m in history] == [(1, 3.0)]

        # the owner: the password `scalelab ui` printed, kept 0600 in a 0700 folder
        folder = home / "ui"
        password = (folder / "password").read_text().strip()
        printed = proc.stdout.readline().decode() + proc.stdout.readline().decode()
        assert password in printed, printed  # shown on the first start
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for path in folder.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert _as_nobody("cat", str(folder / "password")).returncode != 0
        login = base64.b64encode(f"admin:{password}".encode()).decode()
        owner = {"Authorization": f"Basic {login}"}
        assert _status(f"{uri}/") == 401  # a browser asks for the login
        with urllib.request.urlopen(urllib.request.Request(f"{uri}/", headers=owner)) as page:
            assert b'"mlflow.workflowType_v1"' in page.read()  # scalelab's page
        got = f"{uri}/api/2.0/mlflow/runs/get?run_id={run_id}"
        with urllib.request.urlopen(urllib.request.Request(got, headers=owner)) as r:
            assert json.loads(r.read())["run"]["info"]["status"] == "FINISHED"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_the_login_is_kept_private_and_a_deleted_password_file_makes_a_new_one(tmp_path: Path):
    from scalelab.cli.ui_server import login

    first = login(tmp_path)
    assert first.new and first.user == "admin" and len(first.password) >= 20
    (tmp_path / "ui" / "auth.db").write_bytes(b"")  # as the server would have filled it
    first.password_file.chmod(0o644)  # loosened by hand, or a copy
    again = login(tmp_path)
    assert not again.new and again.password == first.password
    assert stat.S_IMODE(first.password_file.stat().st_mode) == 0o600
    first.password_file.unlink()
    fresh = login(tmp_path)
    assert fresh.new and fresh.password != first.password
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "ui").iterdir()}
    assert modes == {"password": 0o600, "auth.ini": 0o600, "auth.db": 0o600}, modes
    assert "password" not in fresh.config.read_text()  # the password goes in the environment
