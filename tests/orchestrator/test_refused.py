"""A trial its node refuses (jobs/training/devices.py) is FAILED at once, not retried like a
transient fault, and runs again at the next submit; a sweep whose trials would write a
file-backed tracking store from other machines is refused at submit, said by --dry-run
(orchestrator/tracking_store.py)."""

from __future__ import annotations

import json

import pytest
from conftest import calls, sweep_yaml
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.contract.runs import Tag
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.scheduler import run_sweep
from scalelab.orchestrator.tracking_store import tracking_refusal

runner = CliRunner()


def test_a_refused_trial_is_not_retried_and_runs_again_at_the_next_submit(
    ray_session, work_home, sweep_name
):
    backend = "{concurrency: 1, max_retries: 2, retry_backoff_s: 0.1, cpus_per_trial: 0.5}"
    spec, source = parse_spec(sweep_yaml(sweep_name, seeds=1, first_seed=7700, backend=backend))
    trials = expand(spec, source)
    ledger = Ledger(spec.name)  # one driver: a second one here would wait out its claims
    out = run_sweep(spec, trials, ledger, job="jobs_for_tests:refuses")
    (tid,) = out.failed
    rec = Ledger(spec.name).records()[tid]
    assert calls(work_home, rec.run_id) == 1  # not retried (max_retries: 2)
    assert rec.tags[Tag.REFUSED] == "1" and rec.attempts == 0  # a refusal is no attempt
    assert rec.tags[Tag.ERROR].startswith("no GPU for seed 7700 (not retried")
    again = run_sweep(spec, trials, ledger, job="jobs_for_tests:count")  # fixed, submitted again
    assert again.finished == [tid], again
    assert calls(work_home, rec.run_id) == 2
    rec = Ledger(spec.name).records()[tid]
    assert Tag.ERROR not in rec.tags and rec.tags[Tag.REFUSED] == "0"


SQLITE = "sqlite:////shared/scalelab-runs/mlflow.db"


@pytest.mark.parametrize(
    ("backend", "uri", "refused"),
    [
        ("{kind: slurm}", SQLITE, True),
        ("{kind: slurm}", "file:///shared/mlruns", True),
        ("{kind: slurm}", "/shared/mlruns", True),
        ("{kind: ray, address: auto}", SQLITE, True),
        ("{kind: ray, address: 'ray://127.0.0.1:10001'}", SQLITE, True),  # a port-forward
        ("{kind: slurm, allow_file_tracking: true}", SQLITE, False),
        ("{kind: slurm}", "https://login1.cluster:8443", False),
        ("{kind: slurm}", "postgresql://mlflow@db/mlflow", False),
        ("{kind: ray, address: local}", SQLITE, False),
        ("{kind: local}", SQLITE, False),
        # a server on the driver's loopback: on a compute node that address is the node
        ("{kind: slurm}", "http://127.0.0.1:5000", True),
        ("{kind: slurm}", "http://127.3.2.1:5000", True),
        ("{kind: slurm}", "http://localhost", True),
        ("{kind: slurm}", "http://[::1]:5000", True),
        ("{kind: slurm}", "postgresql://mlflow@localhost/mlflow", True),
        ("{kind: ray, address: auto}", "http://localhost:5000", True),
        ("{kind: slurm, allow_file_tracking: true}", "http://127.0.0.1:5000", False),
        ("{kind: ray, address: local}", "http://127.0.0.1:5000", False),
        ("{kind: local}", "http://localhost:5000", False),
    ],
)
def test_which_backends_may_write_which_tracking_store(backend, uri, refused):
    spec, _ = parse_spec(sweep_yaml("t", seeds=1, backend=backend))
    assert (tracking_refusal(spec.backend, uri) is not None) == refused


def test_a_slurm_sweep_on_sqlite_is_refused_at_submit_and_dry_run_says_so(
    tmp_path, work_home, sweep_name
):
    """No SLURM daemon needed: the refusal comes before anything is submitted."""
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml(sweep_name, seeds=1, backend="{kind: slurm}"))
    env = {"SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}  # it is never asked
    result = runner.invoke(app, ["submit", str(path)], env=env)
    assert result.exit_code == 2, result.output
    db = work_home / "mlflow.db"
    assert (
        f"error: sweep {sweep_name}: the tracking store sqlite:///{db} is a file" in result.stderr
    )
    assert f"  mlflow server --backend-store-uri sqlite:///{db} --host 127.0.0.1 --port 5000\n" \
        in result.stderr  # fmt: skip
    assert "backend.allow_file_tracking: true (nothing submitted)" in result.stderr
    assert Ledger(sweep_name).experiment_id() is None  # nothing half-submitted
    dry = runner.invoke(app, ["submit", str(path), "--dry-run"], env=env)
    assert (
        dry.exit_code == 0 and "a submit would refuse this sweep: the tracking store" in dry.stderr
    )
    plan = runner.invoke(app, ["submit", str(path), "--dry-run", "--json"], env=env)
    assert "is a file" in json.loads(plan.output)["tracking_refused"]


@pytest.mark.parametrize(
    "backend", ["{kind: slurm}", "{kind: ray, address: 'ray://127.0.0.1:10001'}"]
)
def test_a_cluster_sweep_on_a_loopback_server_is_refused_at_submit(
    tmp_path, work_home, sweep_name, backend
):
    """Refused before the store is opened (nothing listens at the port) or SLURM asked."""
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml(sweep_name, seeds=1, backend=backend))
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "SLURM_CONF": str(tmp_path / "none")}
    result = runner.invoke(app, ["submit", str(path)], env=env)
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: sweep {sweep_name}: the tracking store http://127.0.0.1:9 ")
    assert "where 127.0.0.1 is the node itself, not this machine: export MLFLOW_TRACKING_URI " \
        "with the address the nodes reach the server at" in line  # fmt: skip
    assert line.endswith("(nothing submitted)")


@pytest.mark.parametrize("backend", ["{kind: local}", "{kind: ray, address: local}"])
def test_a_sweep_on_this_machine_may_use_a_loopback_server(
    tmp_path, work_home, sweep_name, backend
):
    """Past the check: the submit goes on to open the store (here nothing listens)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml(sweep_name, seeds=1, backend=backend))
    result = runner.invoke(
        app, ["submit", str(path)], env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    )
    assert result.exit_code == 2, result.output
    assert "MLflow server http://127.0.0.1:9 is not reachable" in result.stderr
    assert "the node itself" not in result.stderr
