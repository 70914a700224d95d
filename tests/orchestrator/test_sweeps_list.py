"""`scalelab sweeps` lists the recorded sweeps with their trials by status, and a misspelt
sweep name or variant gets the closest one ("did you mean")."""

from __future__ import annotations

import json

from conftest import sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.runs import Status
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

runner = CliRunner()


def _recorded(name: str) -> None:
    """A sweep of 3 trials: one finished, one failed, one scheduled."""
    spec, source = parse_spec(sweep_yaml(name, seeds=3))
    trials = expand(spec, source)
    ledger = Ledger(spec.name)
    records = ledger.sync(spec, trials)
    for trial, status in zip(trials[:2], (Status.FINISHED, Status.FAILED), strict=True):
        ledger.client.set_terminated(records[trial.trial_id].run_id, status)


def test_sweeps_lists_a_recorded_sweep_with_its_trials_by_status(work_home, sweep_name):
    _recorded(sweep_name)
    result = runner.invoke(app, ["sweeps", "--json"])
    assert result.exit_code == 0, result.output
    listed = {row["sweep"]: row for row in json.loads(result.output)}
    assert listed[sweep_name]["trials"] == 3
    assert listed[sweep_name]["counts"] == {
        Status.FINISHED: 1,
        Status.FAILED: 1,
        Status.SCHEDULED: 1,
    }

    table = runner.invoke(app, ["sweeps"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    row = next(line for line in table.output.splitlines() if sweep_name in line)
    assert "2/3 done" in row


def test_a_misspelt_sweep_name_gets_the_closest_recorded_one(work_home, sweep_name):
    _recorded(sweep_name)
    for command in (["status", sweep_name + "x"], ["logs", sweep_name[:-1]], ["migrate", "zz"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        if command[0] != "migrate":
            assert f"did you mean {sweep_name!r}?" in result.stderr, result.stderr
        else:  # nothing close: where the names are listed
            assert "`scalelab sweeps` lists the recorded ones" in result.stderr, result.stderr


def test_a_misspelt_variant_gets_the_closest_one(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml("typo") + "variants: [dense, hadamrd]\n")
    result = runner.invoke(app, ["submit", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert "unknown variant 'hadamrd', did you mean 'hadamard'?" in result.stderr, result.stderr
