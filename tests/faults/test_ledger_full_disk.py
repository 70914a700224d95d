"""A full disk under the work directory (a small tmpfs as SCALELAB_HOME): the driver stops
with one line instead of a traceback, and once there is room again the same submit runs
the sweep from where it stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from faults.mlflow_kit import scalelab, sweep_yaml

from scalelab.orchestrator.ledger import Ledger


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(disk)], check=False)  # still busy: detach


def _fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to make room)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 10):  # then the last few kilobytes
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


def _one_clean_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and any(n in errors[0] for n in needles), proc.stderr[-3000:]


@pytest.mark.slow
def test_a_full_disk_stops_the_driver_with_one_line_and_a_resubmit_finishes(
    small_disk, empty_store
):
    home = small_disk / "home"
    sweep = small_disk.parent / "sweep.yaml"
    sweep.write_text(sweep_yaml("fulldisk", seeds=1))
    full = ("database or disk is full", "No space left on device")

    # 1. No room for the MLflow database of a fresh work directory.
    home.mkdir()
    filler = _fill(small_disk)
    refused = scalelab("submit", str(sweep), "--no-summary", home=home)
    _one_clean_line(refused, *full)
    assert not list(home.glob("*mlflow.db*tmp"))
    filler.unlink()

    # 2. The disk fills up after the database exists: opening it or writing the sweep's
    # runs fails, at once (MLflow would retry a store it cannot open for ~100 s)
    empty_store(home / "mlflow.db")  # the store exists, whole
    filler = _fill(small_disk)
    stopped = scalelab("submit", str(sweep), "--no-summary", home=home, timeout=60)
    _one_clean_line(stopped, *full)
    filler.unlink()

    # 3. Room again: the same submit runs the trial once, in the sweep's own experiment.
    done = scalelab("submit", str(sweep), "--no-summary", home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = Ledger("fulldisk", tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    records = ledger.records()
    assert len(records) == 1 and {r.status for r in records.values()} == {"FINISHED"}
    from scalelab.contract.runs import TRIAL_CLAIMS_EXPERIMENT

    experiments = ledger.client.search_experiments()
    everywhere = ledger.client.search_runs(
        [e.experiment_id for e in experiments if e.name != TRIAL_CLAIMS_EXPERIMENT], ""
    )
    assert len(everywhere) == 2  # the parent and the trial's run: nothing half-made elsewhere
