"""`submit --dry-run` plans a sweep whose data is not here (issue 27, item 7): missing
files and hub datasets are rows marked "missing" and blockers after the table, found
offline without the hub client's retry back-off; a CPU sweep's wall time comes from a
measured CPU rate, in CPU-hours."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from typer.testing import CliRunner

from scalelab.cli.main import app

# A classification sweep on CPU reading a hub dataset (not in the cache) and a local file
# that does not exist: two blockers, one per place in the file.
SWEEP = """name: faraway
base:
  model: {size: nano, task: classify, n_classes: 4, vocab_size: 256, block_size: 64}
  data: {tokenizer: byte, seq_len: 64, val_tokens: 512}
  train: {tokens: 8192, global_batch_tokens: 512}
grid:
  data.source: ["hf:fancyzhx/ag_news", "/no/such/folder/train.jsonl"]
backend: {kind: local, gpus_per_trial: 0}
"""
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _sweep(tmp_path):
    path = tmp_path / "faraway.yaml"
    path.write_text(SWEEP)
    return path


def test_dry_run_offline_prints_the_plan_and_the_blockers_at_once(tmp_path):
    path = _sweep(tmp_path)
    env = {**os.environ, **OFFLINE, "SCALELAB_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "scalelab.cli.main", "submit", str(path), "--dry-run"]
    # the bound is generous for a loaded machine; offline it takes a few seconds, where the
    # hub client's back-off took ~50 s per dataset
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    out = done.stdout
    assert "sweep faraway: 2 trials on local" in out  # the table
    assert out.count("│ missing") == 2, out
    assert "blockers (2)" in out
    assert f"{path}:7: grid.data.source[0]: data.source 'hf:fancyzhx/ag_news'" in out
    assert "HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set and it is not in the local cache" in out
    assert (
        f"{path}:7: grid.data.source[1]: data.source '/no/such/folder/train.jsonl': no such" in out
    )
    assert "2 blocker(s)" in done.stderr and "Traceback" not in done.stderr
    # on CPU: CPU-hours, and a wall time from the measured rate of a CPU rank
    assert "CPU-h" in out and "CPU-hours" in out and "GPU-h" not in out
    words = " ".join(out.split())  # the placement line wraps at 250 columns
    assert "wall time (training only: starting a trial takes seconds more)" in words
    assert "per CPU rank (measured on the machine you submit from" in words


def test_dry_run_json_has_the_plan_and_the_blockers(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["submit", str(_sweep(tmp_path)), "--dry-run", "--json"])
    assert result.exit_code == 2, result.output
    plan = json.loads(result.stdout)
    assert [t["data"] for t in plan["trials"]] == ["missing", "missing"]
    assert len(plan["blockers"]) == 2 and all(
        ":7: grid.data.source[" in b for b in plan["blockers"]
    )
    for trial in plan["trials"]:
        assert trial["cpu_hours"] > 0 and "gpu_hours" not in trial
        assert trial["plan"]["wall_s"] > 0


def test_a_hub_that_does_not_answer_is_a_blocker_within_the_time_out(monkeypatch):
    """Not offline: one request per dataset with a short time-out, never the hub client's
    retry back-off. The 'hub' is a local socket that accepts and never answers."""
    import datasets.config
    import huggingface_hub.constants as hub

    from scalelab.jobs.config import DataConfig
    from scalelab.orchestrator.plan.data_availability import hub_problems

    for key in OFFLINE:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        configs = [DataConfig(source=f"hf:owner/set{i}") for i in range(3)]
        start = time.monotonic()
        problems = hub_problems(configs, timeout_s=1.0)
        took = time.monotonic() - start
    assert sorted(problems) == [c.source for c in configs]
    why = ("the Hugging Face hub did not answer in time", "the Hugging Face hub is unreachable")
    assert all(any(w in str(e) for w in why) for e in problems.values()), problems
    assert took < 30  # three datasets at once, each bounded: ~1 s, not minutes
