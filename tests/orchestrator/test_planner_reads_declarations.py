"""The planner reads what each mechanism declares (models/mechanism.py), never its name:
parameter tensors and activations (orchestrator/plan/memory.py) and whether it reads the
training progress (orchestrator/plan/branching.py). The walkthrough's ReZero
(tests/support/rezero_mechanism.py) is planned as exactly as the built-in mechanisms."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from made_mechanisms import mechanism
from rezero_mechanism import ReZero
from saved_tensors import saved_bytes

from scalelab.models.build import build
from scalelab.models.config import ModelConfig
from scalelab.models.dense import AllBlocks, AllHeads
from scalelab.models.flops import count_params
from scalelab.models.mechanism import Activations, registered
from scalelab.orchestrator.plan.branching import branches
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.memory import activation_model, parameter_sizes
from scalelab.orchestrator.plan.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]


def test_the_walkthrough_mechanisms_parameter_tensors_are_the_built_modules():
    with registered(ReZero):
        cfg = ModelConfig(size="nano", rezero={})
        model = build(cfg, device="meta")
        built = [p.numel() for p in model.parameters()]
        planned = parameter_sizes(cfg)
        assert len(built) == 30  # the dense model's 28 and the two gate vectors
        assert sorted(planned) == sorted(built)
        assert sum(planned) - (model.wte.num_embeddings - cfg.vocab_size) * cfg.d_model == (
            model.num_params()
        )  # the planner's tensors hold the padded vocabulary's rows
        assert count_params(cfg) == model.num_params()


B, T = 2, 32


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_walkthrough_mechanisms_activations_are_what_autograd_keeps(checkpointing):
    """Its gates keep the updates they scale, outside the blocks' checkpoints."""
    with registered(ReZero):
        for n_layer in (2, 4):
            cfg = ModelConfig(
                size="micro", n_layer=n_layer, vocab_size=256, block_size=T, rezero={}
            )
            planned = activation_model(cfg, T, 4, checkpointing, "flash", "cpu")
            assert planned.routed == n_layer and planned.gated == 2 * cfg.d_model * 4
            measured = saved_bytes(cfg, B, checkpointing) / (B * T)
            assert measured == pytest.approx(planned.saved_per_token(), rel=0.01)


_Wide = mechanism(  # keeps 7 elements per token in every block
    "wide_test", AllHeads, 901, activations=lambda self, model, seq_len: Activations(block=7)
)


def test_a_declared_block_term_is_kept_or_recomputed_with_the_block():
    with registered(_Wide):
        dense = ModelConfig(size="micro", n_layer=3)
        wide = ModelConfig(size="micro", n_layer=3, wide_test={})
        for checkpointing in (False, True):
            a, b = (activation_model(c, 64, 2, checkpointing) for c in (dense, wide))
            if checkpointing:  # kept: each block's input; recomputed: one block's all
                assert (b.layer, b.recompute - a.recompute) == (a.layer, 7 * 2)
            else:
                assert b.layer - a.layer == 7 * 2 and b.recompute == a.recompute == 0


_Progressive = mechanism("progress_test", AllBlocks, 902, reads_training_progress=True)
_Steady = mechanism("steady_test", AllBlocks, 903)  # the same, reading no progress


def test_a_mechanism_that_reads_training_progress_shares_no_wsd_trunk():
    """Budgets 1, 2 and 4x of one wsd trial per variant: the trials of a variant whose
    mechanism reads no progress branch off their longest; the others train alone."""
    with registered(_Progressive, _Steady):
        spec, source = parse_spec("""
name: progress-branches
base:
  model: {size: nano, vocab_size: 256, block_size: 64}
  data: {source: "builtin:pydoc", tokenizer: byte, seq_len: 64}
  train: {global_batch_tokens: 512, schedule: wsd, warmup_steps: 1}
variants: [dense, budget, progress_test, steady_test]
grid:
  train.tokens: [2048, 4096, 8192]
""")
        trials = expand(spec, source)
        found = branches(trials)
        variant = {t.trial_id: t.variant for t in trials}
        branched = sorted(variant[b.trial_id] for b in found.values())
        assert branched == ["dense", "dense", "steady_test", "steady_test"]
        assert {variant[b.trunk_id] for b in found.values()} == {"dense", "steady_test"}


def test_a_mechanism_declares_its_tensors_not_their_sum():
    _Sum = mechanism("sum_test", AllBlocks, 904, params=lambda self, model: 2 * model.n_layer)

    with pytest.raises(ValueError, match="declare parameter_sizes"):
        with registered(_Sum):
            pass


MECHANISM_NAMES = re.compile(
    r"\b(cfg|model|job\.model)\.(budget|tsa|hadamard)\b"  # a mechanism's config by name
    r"|[\"'](budget|tsa|hadamard)[\"']"  # a name as a string
    r"|attn_out|tsa_counts|budget_flops|budget_hidden|router_hidden"
)


@pytest.mark.parametrize(
    "path", ["orchestrator/plan/memory.py", "orchestrator/plan/branching.py", "models/decode.py"]
)
def test_the_planner_and_the_cache_name_no_mechanism(path):
    found = [
        f"{path}:{n}: {line.strip()}"
        for n, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if MECHANISM_NAMES.search(line)
    ]
    assert not found, "\n".join(found)
