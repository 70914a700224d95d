"""The read-only view of a recorded sweep (orchestrator/ledger/view.py): on the sqlite store
it reads what MLflow's client reads, and the commands that only read a sweep (`status`,
`logs`, `sweeps`, `--help`) or plan one (`submit --dry-run`) never start MLflow or torch (issue 27:
each paid ~2 s of CPU for them), nor numpy where they can help it. Structural, not timed: a
busy machine cannot make these fail."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from conftest import sweep_yaml

from scalelab.contract.workdir import tracking_uri
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.ledger.view import KNOWN_SCHEMAS, SweepView, read_sweep, sqlite_runs
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec

DEMO = Path(__file__).resolve().parents[2] / "sweeps" / "demo.yaml"
HEAVY = ("mlflow", "sqlalchemy", "torch", "numpy")
# runs the CLI in one process for each argv in argv[1] (JSON), then prints which of HEAVY
# each command imported first
PROBE = """
import json, sys
from scalelab.cli.main import app
heavy = lambda: {m.split(".")[0] for m in sys.modules} & set(sys.argv[2].split(","))
loaded = {"start": sorted(heavy())}
for args in json.loads(sys.argv[1]):
    before = heavy()
    try:
        app(args, prog_name="scalelab")
    except SystemExit as e:
        assert not e.code, (args, e.code)
    loaded[" ".join(args)] = sorted(heavy() - before)
print(json.dumps(loaded))
"""


def _recorded(name: str) -> tuple[Ledger, str]:
    """A sweep of 2 trials, one of them launched with a metric, and a deleted copy of its
    run (as a driver that lost a race to create it leaves one); the copy's id."""
    spec, source = parse_spec(sweep_yaml(name, seeds=2))
    trials = expand(spec, source)
    ledger = Ledger(spec.name)
    placeholder = ledger.sync(spec, trials)[trials[0].trial_id]
    started = ledger.start_run(placeholder)
    ledger.client.log_metric(started.run_id, "val/loss", 3.25, step=4)
    ledger.client.log_metric(started.run_id, "nan_metric", float("nan"))
    copy = ledger.client.create_run(ledger.experiment_id(), tags=placeholder.tags)
    ledger.client.delete_run(copy.info.run_id)
    return ledger, copy.info.run_id


def test_the_view_reads_what_mlflows_client_reads(work_home, sweep_name):
    assert sqlite_runs(tracking_uri()).schema() in KNOWN_SCHEMAS  # this MLflow's schema
    ledger, deleted = _recorded(sweep_name)
    view = read_sweep(sweep_name)
    assert isinstance(view, SweepView) and view.experiment_id() == ledger.experiment_id()

    def shown(records: dict) -> dict:  # NaN != NaN: compare as text
        return {tid: json.dumps(asdict(r), sort_keys=True) for tid, r in records.items()}

    assert shown(view.records()) == shown(ledger.records()) and len(view.records()) == 2
    assert asdict(view.record(deleted)) == asdict(ledger.record(deleted))  # any lifecycle


def test_reading_or_planning_a_sweep_starts_neither_mlflow_nor_torch(work_home, sweep_name):
    _recorded(sweep_name)
    commands = [["status", sweep_name, "--json"], ["logs", sweep_name], ["--help"], ["sweeps"]]
    dry_run = ["submit", str(DEMO), "--dry-run"]  # validates every built-in variant
    commands.append(dry_run)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands), ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    loaded = json.loads(probe.stdout.splitlines()[-1])
    # not yet: the dry-run's data checks read the tokenizer through jobs.data.trial
    # (jobs/checks.py), and its data plan imports that module too: both load numpy
    not_yet = {" ".join(dry_run): ["numpy"]}
    assert loaded == {"start": []} | {" ".join(c): [] for c in commands} | not_yet
