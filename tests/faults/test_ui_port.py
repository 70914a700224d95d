"""`scalelab ui` on a port another process holds: one line naming the port, exit code 2,
and nothing started (mlflow itself only logs the clash and exits 0). On a free port the UI
comes up, in one process: no second start of MLflow (docs/monitoring.md)."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "SCALELAB_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _ui(port: int) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli.main", "ui", "--port", str(port)]


def test_ui_on_a_busy_port_says_so_and_exits_2(tmp_path: Path):
    with socket.socket() as holder:  # a real listener on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        res = subprocess.run(
            _ui(port), env=_env(tmp_path), capture_output=True, text=True, timeout=120
        )
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not (tmp_path / "mlflow.db").exists()  # mlflow was never started


@pytest.mark.slow  # mlflow's server takes 5-60 s to come up on 2 busy cores
def test_ui_on_a_free_port_serves(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        _ui(port), env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the server's workers go with it
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the MLflow UI did not answer"
                time.sleep(0.5)
        password = (tmp_path / "ui" / "password").read_text().strip()  # the owner's login
        login = base64.b64encode(f"admin:{password}".encode()).decode()
        page_request = urllib.request.Request(
            f"http://127.0.0.1:{port}/", headers={"Authorization": f"Basic {login}"}
        )
        with urllib.request.urlopen(page_request, timeout=30) as r:
            page = r.read()
        assert b'"mlflow.workflowType_v1"' in page  # scalelab's page: model training first
        # the command became the server: no `mlflow server` parent, no worker below it
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children == [], children
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"uvicorn" in cmdline and b"scalelab.cli.ui_server:app" in cmdline, cmdline
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_the_ui_gives_its_server_the_environment_names_mlflow_server_uses():
    """`scalelab ui` starts MLflow's app itself: the names of what `mlflow server` hands its
    worker are MLflow's private constants, checked here against the installed MLflow."""
    from mlflow import environment_variables as variables
    from mlflow.server import constants

    from scalelab.cli.ui_server import SERVER_ENV_NAMES, server_environment

    assert SERVER_ENV_NAMES == {
        "backend": constants.BACKEND_STORE_URI_ENV_VAR,
        "registry": constants.REGISTRY_STORE_URI_ENV_VAR,
        "artifact_root": constants.ARTIFACT_ROOT_ENV_VAR,
        "serve_artifacts": constants.SERVE_ARTIFACTS_ENV_VAR,
        "artifacts_destination": constants.ARTIFACTS_DESTINATION_ENV_VAR,
        "server": variables._MLFLOW_SGI_NAME.name,
        "boot_id": variables._MLFLOW_SERVER_BOOT_ID.name,
        "in_job_executor": variables._MLFLOW_IN_JOB_EXECUTOR.name,
    }
    env = server_environment("sqlite:////x/mlflow.db", Path("/x/artifacts"))
    assert env[constants.BACKEND_STORE_URI_ENV_VAR] == "sqlite:////x/mlflow.db"
    assert env[constants.ARTIFACTS_DESTINATION_ENV_VAR] == "/x/artifacts"  # not ./mlartifacts
