"""The tuning stage on real training with a real mechanism whose optimum is not dense's: the
Hadamard output projection, which trains best at a higher rate (plausibly because its
learned diagonal moves the attention output per step less than a dense W_O, whose d x d
entries all move at once); compared at dense's rate it is under-trained and its gap to
dense reads too small.

Measured on this exact sweep (nano, 100 steps of 1,024 byte tokens, five rates a factor 2
apart; docs/benchmarks.md, "A real mechanism off dense's optimum"), seeds 0, 1 and 2:
Hadamard's optimum is 1.45x, 1.19x and 1.84x dense's, the check fires every time, and the
gap at Hadamard's own rate is lower than at dense's by 0.026, 0.024 and 0.030 nats (while
the gap itself, -0.035 / +0.036 / -0.056, changes sign with the seed). The assertions
take half of the smallest of these."""

from __future__ import annotations

import re

import pytest

from scalelab.analysis.report import summarise_sweep
from scalelab.orchestrator import door
from scalelab.orchestrator.plan.tuning import BOTH, LADDER

SWEEP = """
name: {name}
base:
  model: {{size: nano, vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64, val_tokens: 8192}}
  train: {{tokens: 102400, global_batch_tokens: 1024, eval_interval: 50, log_interval: 10,
           checkpoint_interval: 1000}}
  seed: 0
variants: [dense, hadamard]
tune:
  lr: [1.0e-3, 2.0e-3, 4.0e-3, 8.0e-3, 1.6e-2]
backend: {{kind: local, concurrency: 2, cpus_per_trial: 1, max_retries: 0}}
"""


@pytest.mark.slow
def test_hadamard_trains_best_above_dense_rate_and_tuning_changes_its_gap(
    tmp_path, work_home, ray_session, sweep_name
):
    path = tmp_path / "hadamard_tuned.yaml"
    path.write_text(SWEEP.format(name=sweep_name))
    ran = door.run(door.load(path))  # jobs.training.train on Ray workers
    assert ran.ok, ran.outcome
    ladder = [t for t in ran.sweep.trials if t.stage in (LADDER, BOTH)]
    rates = {t.variant: set() for t in ladder}
    for t in ladder:
        rates[t.variant].add(t.job.train.lr)
    (dense_rate,) = rates["dense"]
    (own_rate,) = rates["hadamard"] - {dense_rate}
    assert own_rate > 1.1 * dense_rate  # measured 1.19x-1.84x

    assert ran.tuning is not None
    assert "check: hadamard at dense's rate" in ran.tuning, ran.tuning

    summary = summarise_sweep(sweep_name)  # one size: the gaps cell by cell
    (tuned,) = [line for line in summary.splitlines() if line.startswith("tuned: hadamard")]
    own = re.search(r"at its own rate \([\d.]+\): ([+-][\d.]+) nats", tuned)
    shared = re.search(r"at dense's rate \([\d.]+\): ([+-][\d.]+) nats", tuned)
    assert own and shared, tuned
    assert float(own[1]) < float(shared[1]) - 0.012, tuned  # measured 0.024-0.030 lower
