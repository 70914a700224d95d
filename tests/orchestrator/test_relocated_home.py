"""A runs folder that travels: a home copied elsewhere (a cluster's folder brought to a
laptop) writes its artifacts, reports and summaries into itself, never into the original
(real MLflow sqlite store, a synthetic sweep written as a real one is)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_sweep import write_sweep
from typer.testing import CliRunner

from scalelab.cli.main import app


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_copied_home_writes_into_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from mlflow import MlflowClient

    from scalelab.contract import workdir

    original, copy = tmp_path / "cluster" / "runs", tmp_path / "laptop" / "runs"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("SCALELAB_HOME", str(original))
    write_sweep("moved", sizes=("nano", "micro"), tokens_per_param=(10, 20), steps=4)
    made = CliRunner().invoke(app, ["results", "report", "moved", "--resamples", "20"])
    assert made.exit_code == 0, made.output
    shutil.copytree(original, copy)
    before = _snapshot(original)

    # the laptop's commands, each a process of its own as a user's would be
    env = {**os.environ, "SCALELAB_HOME": str(copy)}
    for args in (["results", "report", "moved", "--resamples", "20"],
                 ["results", "summary", "moved", "--resamples", "20"]):  # fmt: skip
        ran = subprocess.run([sys.executable, "-m", "scalelab.cli.main", *args], env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
    assert str(copy) in ran.stdout and str(original) not in ran.stdout, ran.stdout
    monkeypatch.setenv("SCALELAB_HOME", str(copy))
    client = MlflowClient(workdir.tracking_uri())
    experiment = client.get_experiment_by_name("moved")
    assert experiment.artifact_location.startswith(copy.as_uri())
    runs = client.search_runs([experiment.experiment_id])
    assert runs and all(r.info.artifact_uri.startswith(copy.as_uri()) for r in runs)
    client.log_text(runs[0].info.run_id, "written on the laptop", "note.txt")

    assert _snapshot(original) == before  # nothing written to the original
    notes = list((copy / "artifacts").rglob("note.txt"))
    assert len(notes) == 1 and notes[0].read_text() == "written on the laptop"
    assert (copy / "home.path").read_text().strip() == str(copy)


def test_a_store_older_than_its_marker_is_followed_too(tmp_path: Path, monkeypatch):
    """A home copied before it recorded where it was: its store's experiments say it."""
    from mlflow import MlflowClient

    from scalelab.contract import workdir

    original, copy = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("SCALELAB_HOME", str(original))
    write_sweep("old", sizes=("nano",), tokens_per_param=(10,), steps=2)
    shutil.copytree(original, copy)
    (copy / "home.path").unlink(missing_ok=True)
    monkeypatch.setenv("SCALELAB_HOME", str(copy))
    client = MlflowClient(workdir.tracking_uri())
    assert client.get_experiment_by_name("old").artifact_location.startswith(copy.as_uri())
    assert (copy / "home.path").read_text().strip() == str(copy)


def test_a_dry_run_on_an_empty_folder_writes_nothing(tmp_path: Path, monkeypatch):
    from scalelab.contract import workdir

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path))
    workdir.tracking_uri()
    assert not any(tmp_path.iterdir())
