"""What a trial shows between its launch and its job's start, and how long it ran when it
ran more than once. On real MLflow runs (a sweep's placeholders, `Ledger.sync`), launched
and settled by the scheduler's own steps (`_launch`, `_settle`) through a backend that
starts nothing: no Ray, no training. The job's own part, turning its run RUNNING, is done
as the job does it (`set_status`)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.runs import Tag
from scalelab.orchestrator import scheduler
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

runner = CliRunner()


class NothingStarts:
    """A backend whose launches start no process: each handle is the outcome its attempt
    will settle with (`ray.get` hands it back), set by the test before it settles."""

    def __init__(self) -> None:
        self.outcome: dict[str, Any] = {}

    def job_ref_ahead(self, trial: Any, attempt: int) -> str:
        return f"ray:scalelab-trial:{trial.trial_id}:{attempt}"

    def launch_many(self, items: list) -> list[tuple[Any, str]]:
        return [(self, tags_ref) for _, _, tags_ref in items]


@pytest.fixture
def sweep(work_home, sweep_name, monkeypatch):
    """Two SCHEDULED placeholders, and a way to launch and settle the first trial."""
    from scalelab.orchestrator.backends.embedded import SINGLE_NODE, scoped_environ

    with scoped_environ(SINGLE_NODE):  # as ray_init imports it: Ray reads this once, on its
        import ray  # first import, and an embedded cluster started later in this process needs it

    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=2, first_seed=9200))
    trials = expand(spec, source)
    ledger = Ledger(spec.name)
    ledger.sync(spec, trials)
    backend = NothingStarts()
    monkeypatch.setattr(ray, "get", lambda handle: handle.outcome)

    def launch() -> tuple[scheduler._Live, dict]:
        live = scheduler._Live(trials[0], ledger.records()[trials[0].trial_id])
        inflight: dict = {}
        scheduler._launch(ledger, backend, [live], inflight)
        return live, inflight

    def settle(live: scheduler._Live, inflight: dict, status: str) -> None:
        backend.outcome = {"status": status}
        (handle,) = inflight
        out = scheduler.SweepOutcome()
        scheduler._settle(ledger, live, handle, [], out, 2, 0.1, scheduler.delivery.Deliveries())

    return {"name": spec.name, "ledger": ledger, "trials": trials, "launch": launch,
            "settle": settle}  # fmt: skip


def _status(name: str) -> dict[str, dict]:
    result = runner.invoke(app, ["status", name, "--json"])
    assert result.exit_code == 0, result.output
    return {r["trial_id"]: r for r in json.loads(result.stdout)["trials"]}


def _counts(name: str) -> dict[str, int]:
    result = runner.invoke(app, ["sweeps", "--json"])
    assert result.exit_code == 0, result.output
    return next(s["counts"] for s in json.loads(result.stdout) if s["sweep"] == name)


def test_a_launched_trial_shows_starting_until_its_job_runs(sweep):
    name, ledger, (first, second) = sweep["name"], sweep["ledger"], sweep["trials"]
    live, _ = sweep["launch"]()

    rows = _status(name)
    assert rows[first.trial_id]["status"] == "STARTING"
    assert rows[second.trial_id]["status"] == "SCHEDULED"  # not launched
    assert ledger.record(live.rec.run_id).status == "SCHEDULED"  # MLflow's own status
    assert _counts(name) == {"STARTING": 1, "SCHEDULED": 1}
    table = runner.invoke(app, ["status", name], env={"COLUMNS": "200"})
    assert "STARTING" in table.stdout and "1 starting, 1 scheduled" in table.stdout, table.output
    listed = runner.invoke(app, ["sweeps"], env={"COLUMNS": "200"})
    assert "starting" in listed.stdout, listed.output

    ledger.set_status(live.rec.run_id, "RUNNING")  # the job starts tracking
    assert _status(name)[first.trial_id]["status"] == "RUNNING"
    assert _counts(name) == {"RUNNING": 1, "SCHEDULED": 1}


def test_a_trial_cancelled_and_submitted_again_runs_for_its_attempts_only(sweep):
    name, ledger, first = sweep["name"], sweep["ledger"], sweep["trials"][0]
    live, inflight = sweep["launch"]()
    ledger.set_status(live.rec.run_id, "RUNNING")
    time.sleep(1.0)
    sweep["settle"](live, inflight, "KILLED")  # cancelled
    assert _status(name)[first.trial_id]["status"] == "KILLED"
    once = ledger.record(live.rec.run_id)  # one attempt: its run time is the run's span
    assert float(once.tags["scalelab.run_s"]) == pytest.approx(
        (once.end_time - once.start_time) / 1000, abs=0.05
    )
    time.sleep(2.5)  # idle: no attempt runs

    live, inflight = sweep["launch"]()  # submitted again: the same run
    assert _status(name)[first.trial_id]["status"] == "STARTING"
    ledger.set_status(live.rec.run_id, "RUNNING")
    time.sleep(1.0)
    sweep["settle"](live, inflight, "FINISHED")

    run = ledger.record(live.rec.run_id)
    assert run.status == "FINISHED"
    span = (run.end_time - run.start_time) / 1000  # first launch to end: the gap counted
    row = _status(name)[first.trial_id]
    assert 2.0 <= row["duration_s"] <= span - 2.0, (row["duration_s"], span)
    assert float(run.tags["scalelab.run_s"]) == row["duration_s"]  # what MLflow's table shows

    sync = runner.invoke(app, ["results", "sync", name])
    assert sync.exit_code == 0, sync.output
    query = runner.invoke(app, ["results", "query", name, "--format", "json"])
    assert query.exit_code == 0, query.output
    (result,) = [r for r in json.loads(query.stdout) if r["trial_id"] == first.trial_id]
    assert result["wall_time_s"] == row["duration_s"]


def test_attempts_are_summed_from_their_tags_and_an_old_run_reads_as_before():
    from scalelab.contract.trial_time import (
        next_attempt_tags,
        run_seconds,
        shown_status,
        timestamp_text,
    )

    at = 1_790_000_000_000

    def stamp(offset_s: float) -> str:
        return timestamp_text(at + int(offset_s * 1000))

    # launched at 0, ran 40 s, retried (ended tagged at 40), launched again at 100
    retried = {Tag.STARTED: stamp(0), Tag.LAUNCHED: stamp(0), Tag.ATTEMPT_ENDED: stamp(40)}
    assert run_seconds(retried, "SCHEDULED", None, now_ms=at + 90_000) == 40.0
    assert shown_status("SCHEDULED", retried, None) == "SCHEDULED"  # waits for its retry
    again = retried | next_attempt_tags(retried, None, at + 100_000)
    assert shown_status("SCHEDULED", again, None) == "STARTING"
    assert run_seconds(again, "RUNNING", None, now_ms=at + 110_000) == 50.0
    assert run_seconds(again, "FINISHED", at + 130_000) == 70.0
    # a run from before attempts were tagged: from its launch to its end, never STARTING
    old = {Tag.STARTED: stamp(0)}
    assert run_seconds(old, "FINISHED", at + 130_000) == 130.0
    assert shown_status("SCHEDULED", old, None) == "SCHEDULED"
