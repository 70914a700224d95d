"""`scalelab submit --detach`: the driver runs as a Ray job on a head the command starts.

The head gets its own ports and its own temp dir, so the test stops exactly the processes
it started (by that temp dir in their command lines, plus their children) — never
`ray stop`, which kills every Ray process on the machine, other people's included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from conftest import HERE, calls, sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _head_processes(temp_dir: str) -> list[psutil.Process]:
    """The processes of the head started under temp_dir, and all their descendants."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in proc.info["cmdline"] or []):
            found[proc.pid] = proc
            try:
                found.update({c.pid: c for c in proc.children(recursive=True)})
            except psutil.NoSuchProcess:
                pass
    return list(found.values())


def _stop_head(temp_dir: str) -> None:
    procs = _head_processes(temp_dir)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


def _status(sweep: str) -> dict | None:
    """`scalelab status SWEEP --json` (in this process: a fresh CLI costs seconds)."""
    res = CliRunner().invoke(app, ["status", sweep, "--json"])
    return json.loads(res.stdout) if res.exit_code == 0 else None


def test_detached_submit_returns_then_the_ray_job_runs_the_sweep(
    tmp_path: Path, work_home: Path, sweep_name: str
):
    temp_dir = tempfile.mkdtemp(prefix="slr-", dir="/tmp")  # short: Ray's socket paths
    dashboard, gcs, agent = _free_port(), _free_port(), _free_port()
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml(sweep_name, seeds=2))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "SCALELAB_RAY_DASHBOARD": f"http://127.0.0.1:{dashboard}",
        "SCALELAB_RAY_PORT": str(gcs),
        "SCALELAB_RAY_START_ARGS": (
            f"--temp-dir={temp_dir} --num-cpus=2 --dashboard-agent-listen-port={agent}"
        ),
        "SCALELAB_TEST_SLEEP": "1",
        "OMP_NUM_THREADS": "1",
    }
    try:
        t0 = time.monotonic()
        submitted = subprocess.run(
            [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--detach",
             "--job", "jobs_for_tests:sleepy"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        returned_s = time.monotonic() - t0
        assert submitted.returncode == 0, submitted.stderr + submitted.stdout
        assert "as Ray job scalelab-sweep-" in submitted.stdout
        assert f"127.0.0.1:{dashboard}" in submitted.stdout
        # it handed the sweep over instead of running it: nothing had finished yet
        status = _status(sweep_name)
        assert status is None or not all(t["status"] == "FINISHED" for t in status["trials"])
        assert returned_s < 45, f"submit --detach took {returned_s:.1f} s"

        deadline = time.monotonic() + 60
        while True:
            status = _status(sweep_name)
            if status and len(status["trials"]) == 2:
                if all(t["status"] == "FINISHED" for t in status["trials"]):
                    break
            assert time.monotonic() < deadline, f"the detached sweep did not finish: {status}"
            time.sleep(0.5)
        for trial in status["trials"]:
            assert trial["attempts"] == 1 and calls(work_home, trial["run_id"]) == 1
        assert _head_processes(temp_dir), "no head processes found under its temp dir"
    finally:
        _stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not _head_processes(temp_dir)
    with socket.socket() as s:  # nothing listens on the head's GCS port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its TIME_WAITs don't count
        s.bind(("127.0.0.1", gcs))
