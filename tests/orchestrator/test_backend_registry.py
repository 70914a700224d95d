"""A backend defined in one file under tests/ (tests/support/recording_backend.py) is
registered and runs a sweep from its YAML through training, its own option reaching it;
the sweep's `backend:` is checked against the registered kinds."""

from __future__ import annotations

import json

import pytest
from conftest import sweep_yaml
from recording_backend import STARTED, RecordingBackend  # tests/support: on sys.path
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.orchestrator.backends.registry import register, registered, registry
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.spec import SpecError, SweepSpec, parse_spec

runner = CliRunner()
RECORDING = "{kind: recording, label: nightly, concurrency: 2, cpus_per_trial: 0.5, max_retries: 0}"


def problems(backend: str) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(sweep_yaml("s", seeds=1, backend=backend), "x.yaml")
    return e.value.problems


@pytest.mark.slow
def test_a_registered_backend_validates_plans_and_trains_a_sweep(
    ray_session, work_home, sweep_name, tmp_path
):
    path = tmp_path / "sweep.yaml"  # first_seed 9100: trials no other test trains
    path.write_text(sweep_yaml(sweep_name, seeds=2, first_seed=9100, backend=RECORDING))
    STARTED.clear()
    with registered(RecordingBackend):
        spec, _ = parse_spec(path.read_text(), str(path))
        assert type(spec.backend).__name__ == "RecordingOptions"
        assert spec.backend.label == "nightly" and spec.backend.concurrency == 2
        schema = json.dumps(SweepSpec.model_json_schema()["properties"]["backend"])
        assert '"const": "recording"' in schema and '"label"' in schema

        dry = runner.invoke(app, ["submit", str(path), "--dry-run", "--json"])
        assert dry.exit_code == 0, dry.output
        assert len(json.loads(dry.stdout)["trials"]) == 2 and not STARTED  # nothing ran

        result = runner.invoke(app, ["submit", str(path)])
        assert result.exit_code == 0, result.output
    statuses = Ledger(sweep_name).statuses()
    assert sorted(statuses.values()) == ["FINISHED", "FINISHED"], statuses
    assert sorted(STARTED) == sorted(("nightly", trial_id) for trial_id in statuses)
    assert "recording" not in registry()  # the registration ends with its block
    (line,) = problems(RECORDING)
    assert "backend.kind" in line and "'recording'" in line


def test_an_unknown_kind_is_refused_naming_every_registered_kind():
    (line,) = problems("{kind: k8s}")
    assert line.startswith("x.yaml:") and "backend.kind:" in line
    assert "'local', 'ray' or 'slurm', got 'k8s'" in line
    with registered(RecordingBackend):
        (line,) = problems("{kind: k8s}")
        assert "'local', 'ray', 'slurm' or 'recording', got 'k8s'" in line


def test_an_option_of_another_kind_is_refused_at_its_key():
    with registered(RecordingBackend):
        (line,) = problems("{kind: local, label: nightly}")
        assert "backend.label: 'label' needs kind='recording', got kind='local'" in line
        (line,) = problems("{kind: recording, label: x, address: auto}")
        assert "backend.address: 'address' needs kind='ray', got kind='recording'" in line
        (line,) = problems("{kind: recording, label: x, slurm: {nodes: 2}}")
        assert "backend.slurm: 'slurm' needs kind='slurm', got kind='recording'" in line
        (line,) = problems("{kind: recording, label: x, labl: y}")  # its own keys, by name
        assert "backend.labl: unknown key, did you mean 'label'?" in line
        (line,) = problems("{kind: recording}")
        assert "backend.label: Field required" in line
    spec, _ = parse_spec(sweep_yaml("s", seeds=1, backend="{kind: local, address: null}"))
    assert spec.backend.kind == "local"  # another kind's key left unset, as ever
    (line,) = problems("{kind: local, label: nightly}")  # unregistered: nobody's key
    assert "backend.label: unknown key (allowed: " in line


def test_a_backend_must_declare_its_kind_and_options():
    class Unnamed(RecordingBackend):
        kind = "Recording!"

    class Mismatched(RecordingBackend):
        kind = "other"  # its options say 'recording'

    for wrong, why in ((Unnamed, "must match"), (Mismatched, "must declare kind")):
        with pytest.raises(ValueError, match=why):
            register(wrong)
    with registered(RecordingBackend), pytest.raises(ValueError, match="another backend"):
        register(type("Again", (RecordingBackend,), {}))
    assert set(registry()) == {"local", "ray", "slurm"}


def test_the_cli_knows_a_backend_its_environment_names(tmp_path):
    """SCALELAB_BACKENDS names the module (as SCALELAB_MECHANISMS does a mechanism's): the
    command, a process of its own, validates and plans a sweep of that kind; without it,
    the kind is unknown."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    support = Path(__file__).resolve().parent.parent / "support"
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml("env-backend", seeds=1, first_seed=9100, backend=RECORDING))
    env = {**os.environ, "SCALELAB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(support)}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--dry-run"]

    def dry(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "--json"], env={**env, **extra}, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    known = dry(SCALELAB_BACKENDS="recording_backend")
    assert known.returncode == 0, known.stderr
    assert len(json.loads(known.stdout)["trials"]) == 1
    unknown = dry()
    assert unknown.returncode == 2 and "got 'recording'" in unknown.stderr
