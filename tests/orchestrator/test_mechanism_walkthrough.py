"""Issue 16's proof: a mechanism defined in one file under tests/ (tests/support/
rezero_mechanism.py, the walkthrough of docs/architecture.md) runs from a sweep through
training on Ray workers, the results tables and a plot, without touching any other file."""

from __future__ import annotations

import pytest
from rezero_mechanism import ReZero  # tests/support: on sys.path and on Ray's PYTHONPATH

from scalelab.analysis.plots import metric_figure
from scalelab.analysis.results import load_trials, sync
from scalelab.models import catalog
from scalelab.models.build import build
from scalelab.models.mechanism import registered
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.scheduler import run_sweep


@pytest.mark.slow
def test_a_mechanism_in_one_file_runs_from_sweep_to_plot(
    ray_session, work_home, sweep_name, tmp_path
):
    with registered(ReZero):  # this process's only registration; Ray's workers read
        spec, source = parse_spec(f"""
name: {sweep_name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64, val_tokens: 1024}}
  train: {{tokens: 4096, global_batch_tokens: 512, lr: 3.0e-3}}
  seed: 31  # its own trials: no other test's sweep trains these ids
variants: [dense, rezero]
backend: {{concurrency: 2, cpus_per_trial: 1, max_retries: 0}}
""")  # SCALELAB_MECHANISMS (tests/orchestrator/conftest.py: ray_session)
        trials = expand(spec, source)
        assert sorted(t.variant for t in trials) == ["dense", "rezero"]
        rezero = next(t for t in trials if t.variant == "rezero")
        assert rezero.n_params == build(rezero.job.model).num_params()  # the declared count
        out = run_sweep(spec, trials, Ledger(spec.name))  # jobs.training.train on Ray workers
        assert sorted(out.finished) == sorted(t.trial_id for t in trials), out
        sync(spec.name)
        rows = {r["variant"]: r for r in load_trials(spec.name).to_pylist()}
        assert rows["rezero"]["rezero_init"] == 0.0 and rows["rezero"]["rezero_gate"] > 0
        assert rows["dense"]["rezero_gate"] is None
        figure = metric_figure(load_trials(spec.name), ReZero.plots[0])
        figure.savefig(tmp_path / "rezero_gate.png")
        assert (tmp_path / "rezero_gate.png").read_bytes()[:4] == b"\x89PNG"
    assert "rezero" not in catalog.variants()  # registration undone
