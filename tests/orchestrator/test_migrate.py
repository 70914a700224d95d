"""`scalelab migrate`: a sweep recorded under identity rule 1 (the demo, as the code before
rule 2 wrote it: MLflow runs, trial folders) is re-keyed to today's ids, idempotently."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow.entities import Param
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract import workdir
from scalelab.contract.runs import Role, Status, Tag
from scalelab.jobs.config import JobConfig
from scalelab.jobs.tracking.provenance import mlflow_params
from scalelab.orchestrator import migrate
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.migrate import MigrationRefused, migrate_sweep, needs_migration
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((Path(__file__).parent / "data" / "demo_v0_jobs.json").read_text())
pytestmark = pytest.mark.slow  # about 5 s a test: MLflow runs and folders of 4 trials
PICK = {("dense", 32768), ("hadamard", 32768), ("budget", 32768), ("tsa", 32768)}


def _demo(name: str):
    text = (ROOT / "sweeps" / "demo.yaml").read_text().replace("name: demo", f"name: {name}")
    return parse_spec(text)


def _variant(job: dict) -> str:
    return JobConfig.model_validate(job).model.variant


def _record(ledger: Ledger, old_id: str, job: dict, status: str = Status.FINISHED) -> str:
    """One trial as the ledger and the job wrote it before rule 2: no identity tag or param."""
    variant, size = _variant(job), job["model"]["size"]
    run = ledger.client.create_run(
        ledger.experiment_id(),
        tags={
            Tag.PARENT_RUN_ID: ledger.parent_id,
            Tag.ROLE: Role.TRIAL,
            Tag.SWEEP: ledger.sweep,
            Tag.TRIAL_ID: old_id,
            Tag.VARIANT: variant,
            Tag.SIZE: size,
            Tag.BACKEND: "local",
            Tag.CODE_VERSION: "semantics3+95f0e28",
        },
    )
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in mlflow_params(JobConfig.model_validate(job)).items()]
    for i in range(0, len(params), 100):
        ledger.client.log_batch(run_id, params=params[i : i + 100])
    ledger.client.set_terminated(run_id, status=status)
    trial = workdir.trial_dir(old_id)
    trial.mkdir(parents=True)
    (trial / workdir.JOB_FILE).write_text(json.dumps(job))
    (trial / workdir.CURVES_FILE).write_text('{"step": 1, "metric": "val/loss", "value": 5.0}\n')
    result = {"trial_id": old_id, "status": status, "run_id": run_id, "final_val_loss": 5.0}
    (trial / workdir.RESULT_FILE).write_text(json.dumps(result))
    return run_id


@pytest.fixture
def home(work_home, tmp_path, monkeypatch) -> Path:
    """The session's MLflow store, trial folders of this test's own (ids repeat across tests)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", workdir.tracking_uri())
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def recorded_demo(home, sweep_name):
    """A demo-like sweep with 4 FINISHED trials recorded under rule 1; the expected new ids."""
    spec, source = _demo(sweep_name)
    ledger = Ledger(spec.name)
    ledger.ensure_parent(spec)
    chosen = {
        old: job
        for old, job in RECORDED.items()
        if job["model"]["size"] == "nano" and (_variant(job), job["train"]["tokens"]) in PICK
    }
    for old, job in chosen.items():
        _record(ledger, old, job)
    today = {
        t.trial_id for t in expand(spec, source) if (t.variant, t.job.train.tokens) in PICK
        and t.size == "nano"
    }  # fmt: skip
    return ledger, chosen, today


def test_the_demos_results_survive_migration(recorded_demo):
    ledger, chosen, today = recorded_demo
    assert needs_migration(ledger) == 4 and not set(chosen) & today
    report = migrate_sweep(Ledger(ledger.sweep))
    assert set(report.rekeyed) == set(chosen) and set(report.rekeyed.values()) == today
    records = Ledger(ledger.sweep).records()
    assert set(records) == today and {r.status for r in records.values()} == {Status.FINISHED}
    for old, new in report.rekeyed.items():
        assert records[new].tags[Tag.TRIAL_ID_PREV] == old
        assert not workdir.trial_dir(old).exists()
        folder = workdir.trial_dir(new)
        assert json.loads((folder / workdir.RESULT_FILE).read_text())["trial_id"] == new
        tree = json.loads((folder / workdir.IDENTITY_FILE).read_text())
        assert JobConfig.model_validate(chosen[old]).identity_tree() == tree
    assert needs_migration(Ledger(ledger.sweep)) == 0
    log = workdir.results_dir() / ledger.sweep / workdir.MIGRATIONS_FILE
    assert len(log.read_text().splitlines()) == 4


def test_migrate_twice_changes_nothing(recorded_demo):
    ledger, _, today = recorded_demo
    migrate_sweep(Ledger(ledger.sweep))
    again = migrate_sweep(Ledger(ledger.sweep))
    assert not again.changed and set(again.current) == today


def test_an_interrupted_migration_completes(recorded_demo):
    ledger, chosen, today = recorded_demo
    plan = migrate_sweep(Ledger(ledger.sweep), dry_run=True)
    assert needs_migration(ledger) == 4  # a dry run changes nothing
    half = sorted(plan.rekeyed)[:2]
    for old in half:  # stopped after renaming these folders and logging them, before any tag
        os.rename(workdir.trial_dir(old), workdir.trial_dir(plan.rekeyed[old]))
        migrate._log(ledger.sweep, old, plan.rekeyed[old])
    report = migrate_sweep(Ledger(ledger.sweep))
    assert report.rekeyed == plan.rekeyed
    log = workdir.results_dir() / ledger.sweep / workdir.MIGRATIONS_FILE
    pairs = [(e["old"], e["new"]) for e in map(json.loads, log.read_text().splitlines())]
    assert sorted(pairs) == sorted(plan.rekeyed.items())  # each once (issue 33, item 10)
    assert set(Ledger(ledger.sweep).records()) == today
    for new in today:
        result = json.loads((workdir.trial_dir(new) / workdir.RESULT_FILE).read_text())
        assert result["trial_id"] == new


def test_migrate_refuses_with_a_live_driver_or_a_running_trial(recorded_demo):
    ledger, chosen, _ = recorded_demo
    other = Ledger(ledger.sweep)
    other.find_parent()
    other.heartbeat()  # a driver in this (live) process
    with pytest.raises(MigrationRefused, match="live driver"):
        migrate_sweep(Ledger(ledger.sweep))
    ledger.client.delete_tag(ledger.parent_id, next(iter(_driver_tags(ledger))))
    run_id = next(iter(ledger.records().values())).run_id
    ledger.client.update_run(run_id, status=Status.RUNNING)
    with pytest.raises(MigrationRefused, match="RUNNING"):
        migrate_sweep(Ledger(ledger.sweep))
    assert needs_migration(ledger) == 4


def _driver_tags(ledger: Ledger) -> list[str]:
    return [k for k in ledger.parent_tags() if k.startswith(Tag.DRIVER_PREFIX)]


def test_colliding_trials_keep_the_finished_one(home, sweep_name):
    """Two trials that differed only in log_interval had two ids; now they are one."""
    spec, _ = _demo(sweep_name)
    ledger = Ledger(spec.name)
    ledger.ensure_parent(spec)
    old_id, job = next(iter(RECORDED.items()))
    noisy = {**job, "train": {**job["train"], "log_interval": 1}}
    noisy_id = _legacy_id(noisy)
    assert noisy_id != old_id
    failed_run = _record(ledger, noisy_id, noisy, status=Status.FAILED)
    _record(ledger, old_id, job)
    report = migrate_sweep(Ledger(ledger.sweep))
    new = JobConfig.model_validate(job).trial_id
    assert report.rekeyed == {old_id: new} and report.superseded == {noisy_id: new}
    assert ledger.client.get_run(failed_run).data.tags[Tag.ROLE] == Role.SUPERSEDED
    records = Ledger(ledger.sweep).records()
    assert list(records) == [new] and records[new].status == Status.FINISHED


def _legacy_id(job: dict) -> str:
    from scalelab.jobs.identity import legacy_trial_id

    return legacy_trial_id(JobConfig.model_validate(job))


def test_submit_and_its_dry_run_refuse_an_unmigrated_sweep(recorded_demo, tmp_path):
    ledger, _, _ = recorded_demo
    sweep = tmp_path / "demo.yaml"
    text = (ROOT / "sweeps" / "demo.yaml").read_text()
    sweep.write_text(text.replace("name: demo", f"name: {ledger.sweep}"))
    for dry_run in (["--dry-run"], ["--dry-run", "--json"], []):  # the same checks
        result = CliRunner().invoke(app, ["submit", str(sweep), "--no-summary", *dry_run])
        assert result.exit_code == 2, result.output
        assert f"run `scalelab migrate {ledger.sweep}` first" in result.output
    assert needs_migration(ledger) == 4
    assert CliRunner().invoke(app, ["migrate", ledger.sweep]).exit_code == 0
    assert needs_migration(ledger) == 0
