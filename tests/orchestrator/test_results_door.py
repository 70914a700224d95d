"""The results door (analysis/door.py; docs/results.md): the CLI, the notebook API and the
summary bring a sweep's tables up to date by one rule before they answer, so they answer
from the same table; a store that cannot be read is answered from the tables as last
synced, said so, and a sweep never synced needs its store. Real MLflow runs (a synthetic
sweep written as a real one is), the real CLI."""

from __future__ import annotations

import json
import uuid

import pytest
from synthetic_sweep import write_sweep
from typer.testing import CliRunner

import scalelab
from scalelab.analysis import door
from scalelab.cli.main import app

runner = CliRunner()
GONE = "sqlite:////nonexistent-folder/mlflow.db"  # a store moved away: nothing to read


@pytest.fixture
def broken(tmp_path) -> str:
    """A tracking store that is there and cannot be read: its file is not a database."""
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"not a database: the disk that held it failed " * 100)
    return f"sqlite:///{db}"


def _fit_json(*args: str) -> tuple[dict, str]:
    done = runner.invoke(app, ["results", "fit", *args, "--json", "--resamples", "20"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout), done.stderr


def test_the_cli_and_the_notebook_fit_the_same_current_table(work_home):
    name = f"door-{uuid.uuid4().hex[:6]}"
    write_sweep(name, sizes=("nano", "micro"), tokens_per_param=(10, 20, 40))
    first, said = _fit_json(name)
    assert first["n_trials"] == 12 and "synced sweep" in said
    write_sweep(name, sizes=("mini",), tokens_per_param=(10, 20, 40))  # six more finish
    cli, said = _fit_json(name)
    notebook = scalelab.fit(name, n_resamples=20)
    assert cli["n_trials"] == notebook.n_trials == 18
    assert "6 read, 12 unchanged" in said  # the sync said what it read
    _, said = _fit_json(name)
    assert "synced" not in said  # nothing new: nothing to say


def test_a_store_that_cannot_be_read_answers_from_the_last_sync_and_says_so(work_home, broken):
    name = f"stale-{uuid.uuid4().hex[:6]}"
    write_sweep(name, sizes=("nano", "micro"), tokens_per_param=(10, 20, 40))
    synced, _ = _fit_json(name)
    stale, said = _fit_json(name, "--tracking-uri", broken)
    assert stale["n_trials"] == synced["n_trials"] == 12
    assert "tables as last synced" in said and "not a database" in said
    with pytest.warns(door.StaleResults, match="tables as last synced"):
        assert scalelab.fit(name, n_resamples=20, tracking_uri=broken).n_trials == 12
    alone, said = _fit_json(name, "--tracking-uri", GONE)  # no store: the tables are all
    assert alone["n_trials"] == 12 and said == ""


def test_a_sweep_never_synced_needs_its_store(work_home):
    name = f"unsynced-{uuid.uuid4().hex[:6]}"
    write_sweep(name, sizes=("nano", "micro"), tokens_per_param=(10, 20, 40))
    done = runner.invoke(app, ["results", "fit", name, "--tracking-uri", GONE])
    assert done.exit_code == 2
    assert "no MLflow database" in done.stderr
    freshness = door.up_to_date(name)  # the work directory's store: synced now
    assert freshness.synced is not None and freshness.synced.n_trials == 12
    assert door.up_to_date(name, sync=False).synced is None
