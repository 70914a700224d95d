"""`scalelab ui` on a port another process holds: one line naming the port, exit code 2,
and nothing started (mlflow itself only logs the clash and exits 0). On a free port the UI
comes up."""

from __future__ import annotations

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
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the MLflow UI did not answer"
                time.sleep(0.5)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
