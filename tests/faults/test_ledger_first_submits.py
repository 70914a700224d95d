"""First use of a fresh work directory by several processes at once: MLflow's sqlite store
is created whole, once, and nobody dies in its migrations."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from faults.mlflow_kit import env, scalelab, sweep_yaml

from scalelab.orchestrator.ledger import Ledger

CREATE_AT = """
import sys, time
from pathlib import Path
from scalelab.orchestrator.ledger import Ledger
gate = Path(sys.argv[2])
(gate / sys.argv[1]).touch()
while len(list(gate.iterdir())) < 2:  # both have imported everything: create at once
    time.sleep(0.001)
Ledger(sys.argv[1]).experiment_id(create=True)
"""


@pytest.mark.slow
def test_two_ledgers_create_a_fresh_store_at_the_same_moment(tmp_path):
    for attempt in range(2):
        home, gate = tmp_path / f"home{attempt}", tmp_path / f"gate{attempt}"
        gate.mkdir()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CREATE_AT, f"sweep{i}", str(gate)],
                env=env(home),
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(2)
        ]
        errors = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errors)
        names = {e.name for e in Ledger("any", tracking_uri=f"sqlite:///{home}/mlflow.db")
                 .client.search_experiments()}  # fmt: skip
        assert {"sweep0", "sweep1"} <= names
        assert not list(home.glob(".mlflow.db.*.tmp"))  # no half-made store left behind


@pytest.mark.slow
def test_two_first_submits_one_second_apart(tmp_path):
    home = tmp_path / "home"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(sweep_yaml("twice", seeds=2))
    args = ("submit", str(sweep), "--job", "faults.mlflow_kit:finished_job", "--no-summary")
    first = subprocess.Popen(
        [sys.executable, "-m", "scalelab.cli.main", *args],
        env=env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.0)
    second = scalelab(*args, home=home)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Traceback" not in err + second.stderr
    ledger = Ledger("twice", tracking_uri=f"sqlite:///{home}/mlflow.db")
    records = ledger.records()
    assert len(records) == 2 and {r.status for r in records.values()} == {"FINISHED"}
    runs = ledger.client.search_runs([ledger.experiment_id()], "")
    assert len(runs) == 3  # one parent, one run per trial: nothing created twice
