"""A sweep with `tune:` (orchestrator/plan/tuning.py) on the real scheduler, Ray and MLflow:
the search runs first, each variant's rate is the vertex of its bowl, and the sweep's own
trials run at each variant's rate, the shifted one also at the baseline's. The trials are
`jobs_for_tests.lr_bowl`: a known loss law times a bowl in log-rate whose optimum is 4x
lower for hadamard (its effective rate is 4x its lr)."""

from __future__ import annotations

import re

import pytest
from jobs_for_tests import LR_OPTIMUM, LR_SHIFT
from typer.testing import CliRunner

import scalelab
from scalelab.analysis.report import summarise_sweep
from scalelab.analysis.results import sweep_dir
from scalelab.cli.main import app
from scalelab.orchestrator import door
from scalelab.orchestrator.plan.tuning import BOTH, LADDER, PENDING, TUNE

RATES = [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
runner = CliRunner()
BACKEND = "{concurrency: 4, cpus_per_trial: 0.25, max_retries: 0}"


def tuned_yaml(name: str) -> str:
    return f"""
name: {name}
base:
  model: {{vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: 4096, global_batch_tokens: 512}}
  seed: 9400  # base's, so the search's trials have it too (they take no grid axis)
variants: [dense, hadamard]
grid:
  model.size: [nano, tiny, micro]
tune:
  lr: {RATES}
  at: {{model.size: [nano]}}
backend: {BACKEND}
"""


def test_each_variant_runs_at_its_own_tuned_rate(tmp_path, work_home, ray_session, sweep_name):
    path = tmp_path / "tuned.yaml"
    path.write_text(tuned_yaml(sweep_name))
    planned = door.load(path)
    stages = {t.stage for t in planned.trials}
    assert stages == {TUNE, PENDING}  # the ladder's rates are not known before the search
    assert sum(t.stage == TUNE for t in planned.trials) == 2 * len(RATES)

    dry = runner.invoke(app, ["submit", str(path), "--dry-run"], env={"COLUMNS": "250"})
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.count("pending (lr tuned first)") == 3 * 2  # three sizes, two variants
    assert "tuning stage: 12 search trials" in dry.stdout
    assert "then 6 trials at each variant's tuned rate and 3 at dense's" in dry.stdout

    ran = door.run(planned, job="jobs_for_tests:lr_bowl")
    assert ran.ok and not ran.outcome.skipped, ran.outcome
    trials = ran.sweep.trials
    assert PENDING not in {t.stage for t in trials}
    ladder = [t for t in trials if t.stage in (LADDER, BOTH)]
    rates = {(t.variant, t.job.train.lr) for t in ladder}
    dense_rate = next(r for v, r in rates if v == "dense")
    own = {v: r for v, r in rates if v == "hadamard" and r != dense_rate}
    assert dense_rate == pytest.approx(LR_OPTIMUM, rel=0.02)  # the bowl's vertex, not a grid point
    assert own["hadamard"] == pytest.approx(LR_OPTIMUM / LR_SHIFT["hadamard"], rel=0.02)
    assert {(v, round(r, 6)) for v, r in rates} == {
        ("dense", round(dense_rate, 6)), ("hadamard", round(dense_rate, 6)),
        ("hadamard", round(own["hadamard"], 6)),
    }  # fmt: skip
    assert len(ladder) == 3 * 3  # three sizes: dense, hadamard at its own and at dense's rate
    assert len(ran.outcome.finished) == len(trials)  # each trial once, the search's first

    assert ran.tuning is not None
    lines = ran.tuning.splitlines()
    assert any(line.startswith("tuning: hadamard: lr 5.0e-04 [") for line in lines), lines
    (check,) = [line for line in lines if line.startswith("check:")]
    assert "hadamard at dense's rate" in check and "off its own optimum" in check

    status = runner.invoke(app, ["status", sweep_name], env={"COLUMNS": "250"})
    both = sum(t.stage == BOTH for t in trials)  # a search point the ladder took, if any
    assert status.stdout.count("lr search") == 2 * len(RATES) - both
    assert "at tuned lr 0.0005" in status.stdout and "at tuned lr 0.002" in status.stdout

    summary = summarise_sweep(sweep_name).splitlines()
    (tuned,) = [line for line in summary if line.startswith("tuned: hadamard")]
    own = re.search(r"at its own rate \(0\.0005\): ([\d.]+)×", tuned)
    shared = re.search(r"at dense's rate \(0\.002\): ([\d.]+)×", tuned)
    assert own and shared, tuned
    # lr_bowl's law is the same in FLOPs for both at their optima: the right gain is 1x
    assert float(own[1]) == pytest.approx(1.0, abs=0.02)
    assert float(shared[1]) > 1.5  # 4x off its optimum: the loss 10% up, costlier
    assert tuned.endswith("tuning changes the answer")
    (row,) = [line for line in summary if line.startswith("│ hadamard")]
    assert "│     3 │" in row  # three pairs: the ladder's cells, not the search's trials
    fitted = scalelab.fit(sweep_name, n_resamples=50)  # the notebook's (and `results fit`'s)
    (paired,) = fitted.paired
    assert paired.n_pairs == 3 and paired.multiplier.estimate == pytest.approx(1.0, abs=0.02)
    assert fitted.where == "each variant at its own tuned rate"
    reported = runner.invoke(app, ["results", "report", sweep_name], env={"COLUMNS": "250"})
    assert reported.exit_code == 0, reported.output
    report = (sweep_dir(sweep_name) / "report.md").read_text()
    assert f"- {tuned.removeprefix('tuned: ')}" in report.splitlines()  # both rates, as printed

    again = door.run(door.load(path), job="jobs_for_tests:lr_bowl")  # resubmitted: all done
    assert sorted(again.outcome.skipped) == sorted(t.trial_id for t in trials)
    assert not again.outcome.finished


def test_a_ladder_whose_cells_the_search_trains_at_base_rate_still_waits_for_it(
    tmp_path, work_home, ray_session, sweep_name
):
    """The search at the ladder's own size and budget with base's rate among its rates: each
    ladder cell at base's rate is a search trial, yet the ladder must wait for the tuned
    rates and then run at them (sweeps/hadamard_cpu.yaml is such a sweep)."""
    text = tuned_yaml(sweep_name).replace("seed: 9400", "seed: 9401")
    text = text.replace("global_batch_tokens: 512}", "global_batch_tokens: 512, lr: 2.0e-3}")
    path = tmp_path / "twins.yaml"
    path.write_text(text.replace("model.size: [nano, tiny, micro]", "model.size: [nano]"))
    planned = door.load(path)
    assert sum(t.stage == PENDING for t in planned.trials) == 2  # listed, not taken for search
    ran = door.run(planned, job="jobs_for_tests:lr_bowl")
    assert ran.ok, ran.outcome
    ladder = {(t.variant, round(t.job.train.lr, 6)) for t in ran.sweep.trials
              if t.stage in (LADDER, BOTH)}  # fmt: skip
    assert ("hadamard", round(LR_OPTIMUM / LR_SHIFT["hadamard"], 6)) in ladder

    # one size: no law to fit, yet the summary still reads the gap at both rates
    summary = summarise_sweep(sweep_name)
    assert summary.startswith("no fit:"), summary
    (tuned,) = [line for line in summary.splitlines() if line.startswith("tuned: hadamard")]
    own = re.search(r"at its own rate \(0\.0005\): ([+-][\d.]+) nats", tuned)
    shared = re.search(r"at dense's rate \(0\.002\): ([+-][\d.]+) nats", tuned)
    assert own and shared, tuned
    # lr_bowl 4x off its optimum: (1 + 0.05 ln(4)^2), 9.6% above its loss there (about 5.6)
    assert abs(float(own[1])) < 0.02 and float(shared[1]) > 0.2
    reported = runner.invoke(app, ["results", "report", sweep_name], env={"COLUMNS": "250"})
    assert reported.exit_code == 2 and "no fit possible" in reported.output  # no law, and
    assert tuned in reported.stdout.splitlines()  # yet the gaps at both rates, as summarised
