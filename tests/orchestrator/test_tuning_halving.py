"""The tuning stage's cheaper search, `tune.method: halving` (orchestrator/plan/halving.py): the
rungs' rule, the plan (every rung-0 trial seeds its rate's next-rung trial), and a sweep on
the real scheduler, Ray and MLflow, stopped after rung 0 and resubmitted. The trials are
`jobs_for_tests.lr_bowl` (a known bowl in log-rate, optimum 2e-3; hadamard's 4x lower), so
each rung's kept rates and the tuned rates are known in advance. That a seeded longer trial
ends as it would alone is tests/jobs/test_branching.py's."""

from __future__ import annotations

import math
import re

import pytest
from jobs_for_tests import LR_OPTIMUM, LR_SHIFT
from test_tuning_stage import BACKEND, RATES
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.orchestrator import door
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.halving import kept, rung_budgets, window
from scalelab.orchestrator.plan.spec import SpecError, parse_spec
from scalelab.orchestrator.plan.tuning import BOTH, LADDER, PENDING, TUNE
from scalelab.orchestrator.scheduler import run_sweep

runner = CliRunner()
JOB = "jobs_for_tests:lr_bowl"
TOKENS = 8192  # the search's budget: rungs of 2048, 4096, 8192


def halving_yaml(name: str, rates: list[float] = RATES, extra: str = "") -> str:
    return f"""
name: {name}
base:
  model: {{vocab_size: 256, block_size: 64}}
  data: {{source: "builtin:pydoc", tokenizer: byte, seq_len: 64}}
  train: {{tokens: {TOKENS}, global_batch_tokens: 512, schedule: wsd, warmup_steps: 2}}
  seed: 9410  # its own trials: no other test's sweep has these ids
variants: [dense, hadamard]
grid:
  model.size: [nano, tiny]
tune:
  lr: {rates}
  at: {{model.size: [nano]}}
  method: halving
  {extra}
backend: {BACKEND}
"""


def test_each_rung_keeps_the_best_half_around_the_best_rate():
    assert [kept(n) for n in (4, 5, 6, 8, 9)] == [3, 3, 3, 4, 5]
    assert rung_budgets(8192, 512, 3) == [2048, 4096, 8192]
    assert rung_budgets(3000, 512, 2) == [1536, 3072]  # whole batches
    bowl = [5.0, 4.0, 3.2, 3.0, 3.1, 3.9]
    assert window(bowl, 3) == [2, 3, 4]  # the best and its two neighbours
    assert window(bowl, 4) == [2, 3, 4, 5]  # grown towards the lower neighbour (3.9 < 4.0)
    assert window([3.0, 3.5, 4.0, 5.0], 3) == [0, 1, 2]  # at the edge: all on one side
    nan, inf = math.nan, math.inf
    assert window([3.0, 2.9, 3.3, nan, inf], 3) == [0, 1, 2]  # a divergence is the worst
    assert window([nan, nan, nan, nan], 3) == [0, 1, 2]  # all diverged: the smallest rates


def test_a_halving_search_needs_four_rates_and_rungs_need_halving(tmp_path):
    with pytest.raises(SpecError, match="at least 4 rates"):
        parse_spec(halving_yaml("h", rates=[1e-3, 2e-3, 4e-3]))
    with pytest.raises(SpecError, match="tune.rungs is method halving's"):
        parse_spec(halving_yaml("h").replace("method: halving", "method: grid\n  rungs: 2"))


def test_the_plan_lists_rung_0_with_seeds_for_the_next_rung(tmp_path, work_home):
    path = tmp_path / "halving.yaml"
    path.write_text(halving_yaml("plan-only"))
    planned = door.load(path)
    search = [t for t in planned.trials if t.stage == TUNE]
    assert len(search) == 2 * len(RATES) and {t.tokens for t in search} == {2048}
    for t in search:  # 4 steps, cooldown (20%) from step 3: the rung-1 trial resumes there
        (seed,) = t.job.train.branch_seeds
        assert seed.step == 3
        spec, _ = parse_spec(halving_yaml("plan-only"))
        rung1 = {
            (u.variant, u.job.train.lr): u.trial_id
            for u in door.expand(spec.model_copy(update={
                "tune": None, "variants": [t.variant],
                "grid": {"model.size": ["nano"], "train.tokens": [4096],
                         "train.lr": [t.job.train.lr]},
            }))
        }  # fmt: skip
        assert seed.trial_id == rung1[(t.variant, t.job.train.lr)]

    dry = runner.invoke(app, ["submit", str(path), "--dry-run"], env={"COLUMNS": "250"})
    assert dry.exit_code == 0, dry.output
    line = " ".join(dry.stdout.split())
    # a rung's cooldown starts at 3/4 of its steps (4 steps: 1 of cooldown; 8: 2), so
    # 6 x 2048 + 3 x (4096 - 1536 shared) + 3 x (8192 - 3072 shared) tokens: 4.31 of 6 runs
    assert "3 rungs of 2,048 / 4,096 / 8,192 tokens, 6 -> 3 -> 3 rates" in line, line
    assert "each kept rate resumes from its last rung's checkpoint" in line
    assert "for the full grid (28% less)" in line

    cosine = tmp_path / "cosine.yaml"
    cosine.write_text(halving_yaml("plan-cosine").replace("schedule: wsd", "schedule: cosine"))
    dry = runner.invoke(app, ["submit", str(cosine), "--dry-run"], env={"COLUMNS": "250"})
    line = " ".join(dry.stdout.split())
    assert "each rung trains from step 0" in line and "for the full grid (0% less)" in line


def test_a_halving_search_stopped_after_rung_0_resumes_and_tunes_each_variant(
    tmp_path, work_home, ray_session, sweep_name
):
    path = tmp_path / "halving.yaml"
    path.write_text(halving_yaml(sweep_name))
    planned = door.load(path)
    rung0 = [t for t in planned.trials if t.stage == TUNE]
    first = run_sweep(planned.spec, rung0, Ledger(sweep_name), job=JOB)  # a driver that stopped
    assert sorted(first.finished) == sorted(t.trial_id for t in rung0)

    ran = door.run(door.load(path), job=JOB)
    assert ran.ok, ran.outcome
    trials = ran.sweep.trials
    assert PENDING not in {t.stage for t in trials}
    assert sorted(ran.outcome.skipped) == sorted(t.trial_id for t in rung0)  # not retrained
    search = [t for t in trials if t.stage in (TUNE, BOTH)]
    by_rung = {
        (v, tokens): sorted(t.job.train.lr for t in search if t.variant == v and t.tokens == tokens)
        for v in ("dense", "hadamard")
        for tokens in (2048, 4096, 8192)
    }
    assert by_rung[("dense", 2048)] == RATES
    assert by_rung[("dense", 4096)] == by_rung[("dense", 8192)] == [1e-3, 2e-3, 4e-3]
    assert by_rung[("hadamard", 4096)] == by_rung[("hadamard", 8192)] == [2.5e-4, 5e-4, 1e-3]
    ladder = {(t.variant, t.job.train.lr) for t in trials if t.stage in (LADDER, BOTH)}
    own = LR_OPTIMUM / LR_SHIFT["hadamard"]
    assert {v for v, _ in ladder} == {"dense", "hadamard"}
    assert any(v == "dense" and r == pytest.approx(LR_OPTIMUM, rel=0.02) for v, r in ladder)
    assert any(v == "hadamard" and r == pytest.approx(own, rel=0.02) for v, r in ladder)

    assert ran.tuning is not None
    pattern = r"spent ([\d.e+]+) training FLOPs in 24 trials, against ([\d.e+]+)"
    spent = re.search(pattern, ran.tuning)
    assert spent, ran.tuning
    # lr_bowl writes no checkpoint, so no rung resumed from a seed: it spent what it ran,
    # 6 x 1/4 + 3 x 1/2 + 3 x 1 of a full run per variant, the grid's 6 runs
    assert float(spent[1]) == pytest.approx(float(spent[2]), rel=1e-6)
    assert float(spent[1]) == pytest.approx(sum(t.flops for t in search), rel=1e-3)  # 4 digits

    again = door.run(door.load(path), job=JOB)  # resubmitted: every rung and the ladder done
    assert sorted(again.outcome.skipped) == sorted(t.trial_id for t in trials)
