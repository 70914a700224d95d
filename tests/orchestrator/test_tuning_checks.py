"""The checks a tuned sweep prints on its search (orchestrator/plan/tuning.py), from the
search's losses alone: an optimum at the grid's edge, an optimum that moves with width
beyond its interval or the grid's step, a variant compared off its own optimum."""

from __future__ import annotations

import math

from scalelab.orchestrator.plan.spec import parse_spec
from scalelab.orchestrator.plan.tuning import PENDING, TUNE, expand_sweep, tuning_text

SWEEP = """
name: checks
base:
  model: {size: nano, vocab_size: 256, block_size: 64}
  data: {source: "builtin:pydoc", tokenizer: byte, seq_len: 64}
  train: {tokens: 4096, global_batch_tokens: 512}
variants: [dense, hadamard]
grid:
  model.size: [nano, tiny]
tune:
  lr: [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
  at: {model.size: [nano, tiny]}
"""


def bowl(optimum: dict[tuple[str, str], float]):
    """A search loss per trial: a bowl in log-rate around its (variant, size)'s optimum."""

    def loss(trials):
        by_id = {t.trial_id: t for t in trials}
        return lambda tid: (
            3
            + 0.05
            * math.log(by_id[tid].job.train.lr / optimum[by_id[tid].variant, by_id[tid].size]) ** 2
            * (1 + 1e-3 * (int(tid[:4], 16) % 7))
        )

    return loss


def checks(optimum: dict[tuple[str, str], float]) -> list[str]:
    spec, source = parse_spec(SWEEP)
    planned = expand_sweep(spec, source, loss=lambda tid: None)
    assert {t.stage for t in planned} == {TUNE, PENDING}
    loss = bowl(optimum)(planned)
    trials = expand_sweep(spec, source, loss=loss)
    text = tuning_text(spec, trials, loss)
    assert text is not None
    return [line for line in text.splitlines() if line.startswith("check:")]


def test_an_optimum_beyond_the_grid_asks_to_widen_it():
    lines = checks({("dense", "nano"): 2e-3, ("dense", "tiny"): 2e-3,
                    ("hadamard", "nano"): 3e-2, ("hadamard", "tiny"): 3e-2})  # fmt: skip
    assert any("hadamard's best rate at nano is the grid's largest" in line for line in lines)
    assert not any("dense's best rate" in line for line in lines)


def test_an_optimum_that_moves_with_width_does_not_transfer():
    lines = checks({("dense", "nano"): 4e-3, ("dense", "tiny"): 7e-4,
                    ("hadamard", "nano"): 2e-3, ("hadamard", "tiny"): 2e-3})  # fmt: skip
    (moved,) = [line for line in lines if "moves with width" in line]
    assert moved.startswith("check: dense's optimum") and "does not transfer" in moved


def test_a_fair_search_prints_no_check():
    assert checks({(v, s): 2e-3 for v in ("dense", "hadamard") for s in ("nano", "tiny")}) == []


def test_an_optimum_that_moved_out_of_the_halvings_window_is_named_as_such():
    """A halving search (orchestrator/plan/halving.py) whose optimum drifts with the budget:
    8e-3 for the short rungs, 5e-4 for the last, which then holds only 2e-3 to 8e-3."""
    from scalelab.orchestrator.plan.halving import rate_groups

    text = SWEEP.replace(
        "at: {model.size: [nano, tiny]}", "at: {model.size: [nano]}\n  method: halving"
    )
    spec, source = parse_spec(text)
    trials = {t.trial_id: t for g in rate_groups(spec, source) for rung in g.rungs for t in rung}
    longest = max(t.tokens for t in trials.values())

    def loss(tid: str) -> float:
        t = trials[tid]
        optimum = 5e-4 if t.tokens == longest else 8e-3
        return 3 + 0.05 * math.log(t.job.train.lr / optimum) ** 2

    ran = expand_sweep(spec, source, loss=loss)
    last = sorted(t.job.train.lr for t in ran if t.tokens == longest and t.variant == "dense"
                  and t.stage != "ladder")  # fmt: skip
    assert last == [2e-3, 4e-3, 8e-3]
    text = tuning_text(spec, ran, loss)
    assert text is not None
    (dense,) = [line for line in text.splitlines() if line.startswith("check: dense's best")]
    assert "the smallest that the halving kept (2.0e-03), not the grid's" in dense
    assert "widen tune.lr" not in text
