"""`status` of a sweep being submitted, before its first record: it says so (was: "no sweep
named" for the seconds a submit checks, plans and starts Ray). A real submit leaves its
note while it runs and removes it when it ends; a note whose process is gone is not
believed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.orchestrator import door

runner = CliRunner()


def test_status_says_a_sweep_is_being_submitted(work_home: Path, sweep_name: str):
    with door.submitting(sweep_name):
        shown = runner.invoke(app, ["status", sweep_name])
        assert shown.exit_code == 0, shown.output
        assert f"sweep {sweep_name!r} is being submitted (pid {os.getpid()}" in shown.output
        as_json = json.loads(runner.invoke(app, ["status", sweep_name, "--json"]).stdout)
        assert as_json == {"sweep": sweep_name, "submitting": os.getpid(), "trials": []}
    gone = runner.invoke(app, ["status", sweep_name])
    assert gone.exit_code == 2 and "no sweep named" in gone.output
    note = work_home / "submitting" / f"{sweep_name}.json"
    note.parent.mkdir(exist_ok=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    note.write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename,
                                "started": time.time()}))  # fmt: skip
    stale = runner.invoke(app, ["status", sweep_name])
    assert stale.exit_code == 2 and "no sweep named" in stale.output  # its submit is gone


@pytest.mark.slow
def test_a_real_submit_leaves_its_note_while_it_runs(tmp_path: Path, work_home: Path, sweep_name):
    path = tmp_path / "sweep.yaml"
    backend = "{kind: local, concurrency: 1, cpus_per_trial: 1}"
    path.write_text(sweep_yaml(sweep_name, seeds=1, first_seed=8600, backend=backend))
    note = work_home / "submitting" / f"{sweep_name}.json"
    submit = subprocess.Popen(
        [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--no-summary"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen = False
    deadline = time.monotonic() + 240
    while submit.poll() is None and time.monotonic() < deadline:
        if note.exists():
            seen = json.loads(note.read_text())["pid"] == submit.pid
        if seen:
            break
        time.sleep(0.05)
    output, _ = submit.communicate(timeout=300)
    assert submit.returncode == 0, output
    assert seen and not note.exists()
